"""`--api responses`: the Responses API's request body, its typed `response.*` stream events (answer and
reasoning deltas, `response.completed` with usage, `response.failed` / `error` as recorded errors, an end
without `response.completed` as a cut-off), whole answers, and a run against the token server's route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slobench.errors import SpecError
from slobench.report import build_report
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess
from tests.test_openai_target import run_scripted
from tests.test_server_quirks import run_cli


def ev(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **fields}).encode() + b"\n\n"


def completed(out: int = 3, reasoning: int | None = None, status: str = "completed", **extra: Any) -> bytes:
    usage: dict[str, Any] = {"input_tokens": 5, "output_tokens": out}
    if reasoning is not None:
        usage["output_tokens_details"] = {"reasoning_tokens": reasoning}
    kind = "response.completed" if status == "completed" else "response.incomplete"
    return ev(kind, response={"status": status, "usage": usage, "error": None, **extra})


async def test_the_request_body() -> None:
    _, tr = await run_scripted([ev("response.output_text.delta", delta="a"), completed(1)], api="responses")
    url, body, _ = tr.sent[0]
    assert url.endswith("/v1/responses")
    assert isinstance(body["input"], str)  # token ids go as words
    assert body["max_output_tokens"] == 4 and "max_tokens" not in body and "stream_options" not in body
    assert "messages" not in body and "prompt" not in body


async def test_stream_of_reasoning_and_answer_deltas() -> None:
    rec, _ = await run_scripted(
        [ev("response.created", response={"status": "in_progress"}),
         ev("response.reasoning_summary_text.delta", delta="hm"), ev("response.reasoning_text.delta", delta="so"),
         ev("response.output_text.delta", delta="an"), ev("response.output_text.delta", delta="swer"),
         completed(4, 2)], api="responses")
    assert rec.status == "ok", rec.error
    # reads stamped 3 (created), 4 and 5 (reasoning), 6 and 7 (answer), 8 (completed)
    assert rec.first_token_s == rec.first_reasoning_s == 4.0 and rec.first_answer_s == 6.0
    assert rec.chunk_times_s == [4.0, 5.0, 6.0, 7.0] and rec.done_s == 8.0
    assert (rec.output_tokens, rec.output_tokens_source, rec.prompt_tokens) == (4, "usage", 5)
    assert (rec.reasoning_tokens, rec.reasoning_tokens_source, rec.finish_reason) == (2, "usage", "stop")


async def test_incomplete_at_max_output_tokens_is_length() -> None:
    rec, _ = await run_scripted([ev("response.output_text.delta", delta="a"),
                                 completed(4, status="incomplete", incomplete_details={"reason": "max_output_tokens"})],
                                api="responses")
    assert (rec.status, rec.finish_reason, rec.output_tokens) == ("ok", "length", 4)


@pytest.mark.parametrize(("pieces", "error"), [
    ([ev("response.output_text.delta", delta="a"),
      ev("response.failed", response={"status": "failed", "error": {"message": "out of memory"}})],
     "server error mid-stream: out of memory"),
    ([ev("response.output_text.delta", delta="a"), ev("error", code="x", message="rate limited")],
     "server error mid-stream: rate limited"),
    ([ev("response.output_text.delta", delta="a"), ev("response.output_text.delta", delta="b")],
     "stream ended after 2 tokens without response.completed"),
])
async def test_failures_and_cut_offs_are_recorded_errors(pieces: list[bytes], error: str) -> None:
    rec, _ = await run_scripted(pieces, api="responses")
    assert rec.status == "error" and rec.error == error
    assert rec.first_token_s == 3.0  # the tokens before the failure keep their times


@pytest.mark.parametrize(("delta", "item"), [
    ("response.custom_tool_call_input.delta", {"type": "custom_tool_call", "input": "ls -l"}),
    ("response.mcp_call_arguments.delta", {"type": "mcp_call", "arguments": "{}"}),
    ("response.code_interpreter_call_code.delta", {"type": "code_interpreter_call", "code": "print(1)"}),
])
async def test_a_tool_calls_input_is_answer_tokens(delta: str, item: dict[str, Any]) -> None:
    # vLLM streams a custom tool's input, and gpt-oss's built-in tools' calls, under these names
    rec, _ = await run_scripted([ev(delta, delta="ls"), ev(delta, delta=" -l"), completed(2)], api="responses")
    assert (rec.status, rec.chunk_tokens, rec.output_tokens) == ("ok", [1, 1], 2), rec.error
    assert rec.first_token_s == 3.0
    whole = json.dumps({"status": "completed", "error": None, "output": [item], "usage": None}).encode()
    rec, _ = await run_scripted([whole], api="responses", stream=False)
    assert rec.status == "ok", rec.error  # the call's input is generated text: an answer, not "no output"


async def test_whole_answers() -> None:
    def body(**kw: Any) -> bytes:
        out = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
               {"type": "message", "content": [{"type": "output_text", "text": "answer"}]}]
        return json.dumps({"status": "completed", "error": None, "output": out,
                           "usage": {"input_tokens": 5, "output_tokens": 4,
                                     "output_tokens_details": {"reasoning_tokens": 1}}, **kw}).encode()

    rec, tr = await run_scripted([body()], api="responses", stream=False)
    assert rec.status == "ok", rec.error
    assert rec.first_token_s == rec.first_reasoning_s == rec.first_answer_s == rec.done_s
    assert (rec.output_tokens, rec.reasoning_tokens, rec.finish_reason) == (4, 1, "stop")
    assert tr.sent[0][1]["stream"] is False
    rec, _ = await run_scripted([body(status="failed", error={"message": "boom"})], api="responses", stream=False)
    assert rec.status == "error" and rec.error == "server error: boom"


def test_a_profile_known_not_to_serve_responses_is_refused() -> None:
    with pytest.raises(SpecError, match="does not serve /v1/responses"):
        OpenAITarget("http://h:1/v1", TargetOptions(model="m", api="responses", server_profile="tgi"))


@pytest.mark.integration
async def test_against_the_token_servers_route(start_token_server: Any) -> None:
    server: TokenServerProcess = start_token_server(ttft_ms=2, itl_ms=1)
    specs = [RequestSpec(i, 0.0, "hello there", 2, 12, extra_body=(("x_reasoning_tokens", 4 * (i % 2)),))
             for i in range(4)]
    for stream in (True, False):
        async with OpenAITarget(server.base_url, TargetOptions(model=server.model, api="responses",
                                                               stream=stream)) as target:
            for s in specs:
                r = RequestRecord(s.request_id, 0.0)
                await target.send(s, r)
                assert r.status == "ok", r.error
                assert (r.output_tokens, r.prompt_tokens, r.finish_reason) == (12, 2, "stop")
                if s.request_id % 2:
                    assert r.reasoning_tokens == 4 and r.first_answer_s is not None
                    assert r.first_reasoning_s is not None and r.first_reasoning_s <= r.first_answer_s
                else:
                    assert r.first_answer_s is None and r.reasoning_tokens is None
            failed = RequestRecord(9, 0.0)
            await target.send(RequestSpec(9, 0.0, "x", 1, 8, extra_body=(("x_fault", "error_event"),)), failed)
            assert failed.status == ("error" if stream else "ok")
            cut = RequestRecord(10, 0.0)
            await target.send(RequestSpec(10, 0.0, "x", 1, 8, extra_body=(("x_fault", "no_done"),)), cut)
            assert cut.status == ("error" if stream else "ok"), cut.error


@pytest.mark.integration
def test_a_run_with_api_responses_and_a_ttfa_slo(start_token_server: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    server = start_token_server(ttft_ms=2, itl_ms=1, reasoning_tokens=2)
    code, records, manifest = run_cli(server, tmp_path / "r", "--api", "responses", "--slo", "ttft=1s,ttfa=1s")
    assert code == 0, capsys.readouterr().err
    assert manifest["target"]["api"] == "responses"
    assert len(records) == 12 and all(r["status"] == "ok" for r in records)
    # the workload's token-id prompts went as text, and the server's usage counted their words
    assert all(r["reasoning_tokens"] == 2 and r["reasoning_tokens_source"] == "usage" for r in records)
    # a read stamps every token it brings: on a busy machine the reasoning and the first answer token can
    # arrive in one read, 1 ms apart on the server, and share a stamp
    assert all(r["first_reasoning_s"] <= r["first_answer_s"] <= r["done_s"] for r in records)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["slo"]["ttfa_s"] == 1.0 and summary["ttfa_s"]["count"] == 12
    assert summary["reasoning"]["reasoning_share"] == pytest.approx(2 / 6)
    out = capsys.readouterr().out
    assert "TTFA ms, first answer token" in out and "reasoning: 12 answers reasoned" in out
    html = build_report([tmp_path / "r"], tmp_path / "r.html").read_text()
    assert "TTFA p50 / p90 / p99 ms (first answer token)" in html and "33.3% · 0" in html
    code, _, _ = run_cli(server, tmp_path / "tgi", "--api", "responses", "--server-profile", "tgi")
    assert code == 2
    assert "does not serve /v1/responses" in capsys.readouterr().err
