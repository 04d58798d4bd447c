"""The reasoning channel kept apart from the answer: a chat stream's reasoning deltas and answer deltas give
the record the first reasoning token's time, the first answer token's, and the reasoning count (the
server's usage where it gives it and it is plausible, else counted and marked "events")."""

from __future__ import annotations

import json
from typing import Any

from tests.test_openai_target import CFIN, ctok, run_scripted, sse


def usage(completion: int, reasoning: Any = None) -> dict[str, Any]:
    u: dict[str, Any] = {"prompt_tokens": 3, "completion_tokens": completion}
    if reasoning is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return {"choices": [], "usage": u}


async def test_first_reasoning_and_first_answer_token_times() -> None:
    rec, _ = await run_scripted(
        [sse(ctok("", role="assistant")), sse(ctok(None, reasoning_content="hmm")), sse(ctok(None, reasoning="so")),
         sse(ctok("the")), sse(ctok(" answer"), CFIN), sse(b"[DONE]")], api="chat")
    assert rec.status == "ok", rec.error
    # reads stamped 3 (role only), 4 and 5 (reasoning), 6 and 7 (answer)
    assert rec.first_token_s == rec.first_reasoning_s == 4.0  # TTFT keeps counting reasoning
    assert rec.first_answer_s == 6.0
    assert (rec.reasoning_tokens, rec.reasoning_tokens_source, rec.output_tokens) == (2, "events", 4)


async def test_reasoning_count_from_usage_details() -> None:
    rec, _ = await run_scripted(
        [sse(ctok(None, reasoning_content="a")), sse(ctok("b"), CFIN, usage(4, 3)), sse(b"[DONE]")],
        api="chat")
    assert (rec.reasoning_tokens, rec.reasoning_tokens_source, rec.output_tokens) == (3, "usage", 4)
    # a count below the reasoning events streamed, or past the completion's, is not believed
    for bad in (0, 5, -1, "3", True):
        rec, _ = await run_scripted(
            [sse(ctok(None, reasoning_content="a")), sse(ctok(None, reasoning_content="a")),
             sse(ctok("b"), CFIN, usage(4, bad)), sse(b"[DONE]")], api="chat")
        assert (rec.reasoning_tokens, rec.reasoning_tokens_source) == (2, "events"), bad
    # no reasoning streamed and a usage of 0 reasoning tokens (OpenAI's on every answer): no reasoning fields
    rec, _ = await run_scripted([sse(ctok("a")), sse(ctok("b"), CFIN, usage(2, 0)), sse(b"[DONE]")], api="chat")
    assert rec.status == "ok"
    assert (rec.first_reasoning_s, rec.first_answer_s, rec.reasoning_tokens, rec.reasoning_tokens_source) == (
        None, None, None, None)
    assert "reasoning" not in rec.to_json() and "first_answer_s" not in rec.to_json()


async def test_reasoning_only_is_a_completed_request_with_no_answer_token() -> None:
    rec, _ = await run_scripted(
        [sse(ctok(None, reasoning_content="a")), sse(ctok(None, reasoning_content="b")), sse(CFIN), sse(b"[DONE]")],
        api="chat")
    assert rec.status == "ok", rec.error
    assert rec.first_reasoning_s == 3.0 and rec.first_answer_s is None
    assert (rec.reasoning_tokens, rec.output_tokens) == (2, 2)
    line = json.loads(rec.to_json())  # reasoning written, no first answer time: the request had no answer
    assert line["reasoning_tokens"] == 2 and "first_answer_s" not in line


async def test_tool_call_arguments_are_answer_not_reasoning() -> None:
    call = {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    rec, _ = await run_scripted(
        [sse(ctok(None, reasoning_content="a")), sse(ctok(None, **call), CFIN), sse(b"[DONE]")], api="chat")
    assert rec.first_answer_s == 4.0 and rec.reasoning_tokens == 1


async def test_a_whole_answer_with_reasoning() -> None:
    def body(message: dict[str, Any], details: Any = None) -> bytes:
        u = usage(4, details)["usage"]
        return json.dumps({"choices": [{"message": message, "finish_reason": "stop"}], "usage": u}).encode()

    rec, _ = await run_scripted([body({"reasoning_content": "x", "content": "y"}, 3)], api="chat", stream=False)
    assert rec.first_reasoning_s == rec.first_answer_s == rec.done_s
    assert (rec.reasoning_tokens, rec.reasoning_tokens_source) == (3, "usage")
    rec, _ = await run_scripted([body({"reasoning": "x", "content": None})], api="chat", stream=False)
    assert rec.status == "ok" and rec.first_reasoning_s == rec.done_s and rec.first_answer_s is None
    rec, _ = await run_scripted([body({"content": "y"}, 0)], api="chat", stream=False)
    assert (rec.first_reasoning_s, rec.reasoning_tokens) == (None, None)
