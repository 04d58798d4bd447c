"""What the three OpenAI APIs share in their answers: the usage object (`take_usage`), the reasoning count
settled at the end (`settle_reasoning`), and the error shapes servers send (`error_message`)."""

from __future__ import annotations

from typing import Any

from slobench.run.records import RequestRecord
from slobench.targets.bounds import brief, json_of
from slobench.targets.preflight import usage_count


def event_text(data: str | bytes) -> str:
    return data if type(data) is str else data.decode("utf-8", "replace")  # type: ignore[union-attr]


def take_usage(record: RequestRecord, usage: dict[str, Any], output: str = "completion_tokens",
               prompt_key: str = "prompt_tokens") -> None:
    """Read a usage object; implausible values (negative, huge, wrong type) are not taken. An all-zero usage
    (LiteLLM puts one on every chunk) says nothing and leaves earlier values alone. `output`, `prompt_key`:
    the counts' names (the Responses API's are "output_tokens" and "input_tokens"); their details are
    `<name>_details`."""
    completion = usage_count(usage.get(output))
    prompt = usage_count(usage.get(prompt_key))
    if not completion and not prompt:
        return
    if completion is not None:
        record.usage_output_tokens = completion
    if prompt is not None:
        record.prompt_tokens = prompt
    out_details = usage.get(output + "_details")  # OpenAI, vLLM: reasoning_tokens of the completion
    if isinstance(out_details, dict):
        reasoning = usage_count(out_details.get("reasoning_tokens"))
        if reasoning is not None and (completion is None or reasoning <= completion):
            record.reasoning_tokens, record.reasoning_tokens_source = reasoning, "usage"
    details = usage.get(prompt_key + "_details")  # OpenAI, vLLM (--enable-prompt-tokens-details), SGLang
    if isinstance(details, dict):
        cached = usage_count(details.get("cached_tokens"))
        if cached is not None and (prompt is None or cached <= prompt):
            record.cached_tokens = cached


def settle_reasoning(record: RequestRecord, num_reasoning: int, first_answer_s: float | None) -> None:
    """The record's reasoning fields, where the stream carried reasoning (`num_reasoning` tokens counted)
    or the server's usage counted some: the first answer token's time (None: reasoning only, no answer)
    and the reasoning count, the server's where it is no less than the events counted, else the events'."""
    if not num_reasoning and not record.reasoning_tokens:
        record.reasoning_tokens = record.reasoning_tokens_source = None  # (a usage of 0: no reasoning)
        return
    record.first_answer_s = first_answer_s if num_reasoning else record.first_token_s
    if record.first_reasoning_s is None:  # reasoning the server counted but did not stream
        record.first_reasoning_s = record.first_token_s
    usage = record.reasoning_tokens if record.reasoning_tokens_source == "usage" else None
    if usage is None or usage < num_reasoning:
        record.reasoning_tokens, record.reasoning_tokens_source = num_reasoning, "events"


def error_message(obj: Any, fallback: str) -> str:
    """The human message in the error shapes servers use: OpenAI, vLLM (old and new), FastAPI."""
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return brief(err["message"])
        if isinstance(err, str) and err:
            return err
        for key in ("message", "detail"):
            if obj.get(key):
                return brief(obj[key])
    return fallback


def event_error_text(data: str) -> str:
    try:
        return error_message(json_of(data), data)
    except ValueError:
        return data
