"""The chat completions API's codec: the request's `messages`, and what a delta or message carries: answer
text, reasoning (vLLM's and SGLang's `reasoning_content`, vLLM's newer `reasoning`) or tool-call arguments.
Its stream is a `choices` stream (`slobench.targets.codecs.choices`)."""

from __future__ import annotations

from typing import Any

PATH = "/chat/completions"
MAX_TOKENS_FIELD = "max_tokens"


def put_prompt(body: dict[str, Any], prompt: str) -> None:
    body["messages"] = [{"role": "user", "content": prompt}]


def chat_output(delta: Any) -> bool:
    """Whether a chat delta carries generated tokens: answer text, reasoning (vLLM's `reasoning_content`,
    newer `reasoning`; SGLang's `reasoning_content`) or tool-call arguments. A reasoning model's first
    tokens are its reasoning, so TTFT counts them, as vLLM's `bench serve` does; a role-only or empty
    delta is not output."""
    if not isinstance(delta, dict):
        return False
    if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
        return True
    return has_call_arguments(delta)


def is_reasoning(delta: Any) -> bool:
    """Whether a chat delta's token is reasoning, not answer: it has reasoning text (vLLM's and SGLang's
    `reasoning_content`, vLLM's newer `reasoning`), empty or not, and neither answer text nor tool-call
    arguments."""
    if type(delta) is not dict:
        return False
    r = delta.get("reasoning_content")
    if r is None:
        r = delta.get("reasoning")
    if type(r) is not str or delta.get("content"):
        return False
    return not has_call_arguments(delta)


def has_call_arguments(delta: dict[str, Any]) -> bool:
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and fn.get("arguments"):
                return True
    return False


def chat_text(delta: Any) -> str:
    """The generated text of a chat delta or message: answer, reasoning and tool-call arguments."""
    if not isinstance(delta, dict):
        return ""
    parts = [delta.get(k) for k in ("reasoning_content", "reasoning", "content")]
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            parts.append(fn.get("arguments") if isinstance(fn, dict) else None)
    return "".join(p for p in parts if type(p) is str)
