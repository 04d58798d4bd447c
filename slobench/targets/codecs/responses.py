"""The Responses API's codec (`POST /v1/responses`, served by OpenAI, vLLM and SGLang): the request's
`input` and `max_output_tokens`, its typed SSE events, and its whole answer.

A stream is `event: response.<kind>` / `data: {"type": ..., ...}` pairs. A token is a delta event:
`response.output_text.delta` (answer), `response.reasoning_text.delta` or
`response.reasoning_summary_text.delta` (reasoning), `response.function_call_arguments.delta` and the
other tool calls' input deltas (answer: `ANSWER_DELTAS`); each carries one token unless it sends its logprobs (a delta may carry several: vLLM sends the
tokens queued since its last delta in one). `response.completed` or `response.incomplete` ends it and
carries the usage (`input_tokens`, `output_tokens`, their details); a response of status "incomplete" with
reason "max_output_tokens" reads as finish_reason "length", whichever of the two events carries it.
`response.failed` and `error` events are recorded errors. A stream that ends without `response.completed`
or `response.incomplete` was cut off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slobench.run.records import RequestRecord
from slobench.targets.bounds import json_of
from slobench.targets.codecs.common import error_message, event_text
from slobench.targets.codecs.common import take_usage as take_any_usage
from slobench.targets.sse import DONE

PATH = "/responses"
MAX_TOKENS_FIELD = "max_output_tokens"
# answer tokens: text, a refusal, and a tool call's input (a function's arguments; vLLM's custom tools, and
# gpt-oss's built-in MCP and code-interpreter calls, stream theirs under their own names)
ANSWER_DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                           "response.refusal.delta", "response.custom_tool_call_input.delta",
                           "response.mcp_call_arguments.delta", "response.code_interpreter_call_code.delta"})
# a whole answer's tool-call items: the field holding what the model generated
TOOL_INPUTS = {"function_call": "arguments", "custom_tool_call": "input", "mcp_call": "arguments",
               "code_interpreter_call": "code"}
REASONING_DELTAS = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
ENDS = {"response.completed": "stop", "response.incomplete": "incomplete"}


def put_prompt(body: dict[str, Any], prompt: str) -> None:
    body["input"] = prompt


def take_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    """The Responses usage object: `input_tokens`, `output_tokens` and their details."""
    take_any_usage(record, usage, "output_tokens", "input_tokens")


def finish_of(response: dict[str, Any], end: str) -> str:
    """The finish_reason a response's end reads as: "length" where it stopped at max_output_tokens. The
    response's own `status` wins over the event's name: vLLM ends a stream cut at max_output_tokens with
    `response.completed` holding a response of status "incomplete"."""
    status = response.get("status")
    if status == "completed" or (end == "stop" and status != "incomplete"):
        return "stop"
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return "length" if reason == "max_output_tokens" else str(reason or "incomplete")


class ResponseStream:
    """What one Responses stream has said so far: `take` applies each event to it and to the record (the
    reader's interface of `slobench.targets.codecs.choices.ChoiceStream`)."""

    __slots__ = ("record", "finish", "error", "is_done", "ended", "texts", "num_reasoning", "has_answer",
                 "first_answer_s")
    missing_end = "response.completed"

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.finish: str | None = None
        self.error: str | None = None
        self.is_done = False  # (a `data: [DONE]`, which the Responses API does not send; some proxies do)
        self.ended = False
        self.texts: list[str] | None = None
        self.num_reasoning = 0
        self.has_answer = False
        self.first_answer_s: float | None = None

    def take(self, kind: str, data: str) -> int:
        if data == DONE:
            self.is_done = self.ended = True
            return 0
        try:
            obj = json_of(data)
        except ValueError:
            obj = None
        if type(obj) is not dict:
            self.error = f"malformed JSON in SSE event: {data[:120]!r}"
            return 0
        if kind == "error" and "type" not in obj:
            obj["type"] = "error"
        return self.take_all((obj,), (data,))

    def take_all(self, objs: Sequence[dict[str, Any]], datas: Sequence[str | bytes], done: bool = False) -> int:
        num = 0
        for obj, data in zip(objs, datas, strict=False):
            kind = obj.get("type")
            if kind in ANSWER_DELTAS or kind in REASONING_DELTAS:
                logprobs = obj.get("logprobs")
                k = len(logprobs) if isinstance(logprobs, list) and logprobs else 1
                num += k
                if kind in REASONING_DELTAS:
                    self.num_reasoning += k
                else:
                    self.has_answer = True
                if self.texts is not None and type(obj.get("delta")) is str:
                    self.texts.append(obj["delta"])
            elif kind in ENDS:
                response = obj.get("response")
                response = response if isinstance(response, dict) else {}
                usage = response.get("usage")
                if isinstance(usage, dict):
                    take_usage(self.record, usage)
                self.finish = finish_of(response, ENDS[kind])
                self.ended = True
            elif kind == "response.failed":
                response = obj.get("response")
                self.error = "server error mid-stream: " + error_message(response, event_text(data))
                return num
            elif kind == "error":
                self.error = "server error mid-stream: " + error_message(obj, event_text(data))
                return num
        if done:
            self.is_done = self.ended = True
        return num


def whole_answer(obj: dict[str, Any]) -> tuple[str, str | None, str | None, bool]:
    """A non-streamed response: its answer text, its reasoning text (None: no reasoning item), its
    finish_reason, and whether it failed (`status` "failed")."""
    answer: list[str] = []
    reasoning: list[str] | None = None
    for item in obj.get("output") or ():
        if not isinstance(item, dict):
            continue
        parts = [p for key in ("content", "summary") for p in (item.get(key) or ()) if isinstance(p, dict)]
        texts = [p["text"] for p in parts if type(p.get("text")) is str]
        if item.get("type") == "reasoning":
            reasoning = (reasoning or []) + texts
        elif item.get("type") in TOOL_INPUTS:
            generated = item.get(TOOL_INPUTS[item["type"]])
            answer += [generated] if type(generated) is str else []
        else:
            answer += texts
    status = obj.get("status")
    finish = finish_of(obj, "stop" if status in (None, "completed") else "incomplete")
    return "".join(answer), None if reasoning is None else "".join(reasoning), finish, status == "failed"
