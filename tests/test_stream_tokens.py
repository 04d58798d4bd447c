"""How a stream's tokens are read: which chunks carry a generated token (TTFT and chunk times), how many
tokens came (`output_tokens` and `output_tokens_source`), and what a server is known to do with the length
fields it takes. Scripted streams first, then the token server's quirks that reproduce real servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import main
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.capabilities import Capabilities, profile_capabilities, with_length_evidence
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess
from tests.test_openai_target import ScriptedTransport, TickClock, sse


def text(t: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": finish}]}


def delta(finish: str | None = None, **d: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def usage(n: int) -> dict[str, Any]:
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}


async def scripted(reads: list[bytes], *, api: str = "completions", max_tokens: int = 4,
                   tokenizer: str | None = None) -> RequestRecord:
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m", api=api, tokenizer=tokenizer),  # type: ignore[arg-type]
                          TickClock(), transport=ScriptedTransport(200, list(reads)))
    await target.start()
    rec = RequestRecord(0, 0.0)
    prompt = "hi there" if api == "chat" else (1, 2, 3)
    await target.send(RequestSpec(0, 0.0, prompt, 3, max_tokens), rec)
    return rec


# ---- which chunks carry a token ------------------------------------------------------------------------


async def test_an_empty_text_chunk_is_a_token_and_starts_ttft() -> None:
    # vLLM completions: the first token split a UTF-8 character, so its chunk's text is empty
    rec = await scripted([sse(text("")), sse(text(" caf\u00e9")), sse(text("")), sse(text(" b", "length")),
                          sse(usage(4), b"[DONE]")])
    assert rec.status == "ok", rec.error
    # the clock reads 1 at the fallback send stamp, 2 at on_sent, then 3, 4, 5, 6, 7 at each read
    assert rec.first_token_s == 3.0
    assert rec.chunk_times_s == [3.0, 4.0, 5.0, 6.0] and rec.chunk_tokens == [1, 1, 1, 1]
    assert (rec.output_tokens, rec.output_tokens_source, rec.finish_reason) == (4, "usage", "length")


async def test_chat_preamble_and_empty_finish_are_not_tokens_an_empty_delta_is() -> None:
    # vLLM chat: a role preamble with content "", then tokens, one with empty text; SGLang's all-null finish
    rec = await scripted([
        sse(delta(role="assistant", content="")), sse(delta(content="")), sse(delta(content=" a")),
        sse(delta("length", role=None, content=None, reasoning_content=None, tool_calls=None)),
        sse(usage(2), b"[DONE]"),
    ], api="chat", max_tokens=2)
    assert rec.status == "ok", rec.error
    assert rec.first_token_s == 4.0 and rec.chunk_times_s == [4.0, 5.0]
    assert rec.output_tokens == 2


async def test_a_stream_of_empty_texts_whose_usage_counts_tokens_is_not_no_output() -> None:
    rec = await scripted([sse(text("")), sse(text("")), sse(text("", "length")), sse(usage(3), b"[DONE]")],
                         max_tokens=3)
    assert rec.status == "ok", rec.error
    assert rec.chunk_times_s == [3.0, 4.0] and rec.output_tokens == 3
    # no event carried a token at all, but usage says one came: ok, its time is the end's
    rec = await scripted([sse(text("", "length")), sse(usage(1), b"[DONE]")], max_tokens=1)
    assert rec.status == "ok" and rec.first_token_s == rec.done_s == 4.0 and rec.output_tokens == 1
    # without usage it is still no output
    rec = await scripted([sse(text("", "stop"), b"[DONE]")])
    assert rec.status == "error" and rec.error is not None and rec.error.startswith("no output")


# ---- how many tokens came ------------------------------------------------------------------------------


async def test_finish_length_without_usage_means_max_tokens() -> None:
    # two tokens an event, no usage: 8 events of a 16-token answer
    reads = [sse(text(" a b")) for _ in range(7)] + [sse(text(" a b", "length"), b"[DONE]")]
    rec = await scripted(reads, max_tokens=16)
    assert (rec.output_tokens, rec.output_tokens_source) == (16, "max_tokens")
    assert sum(rec.chunk_tokens) == 8


async def test_without_usage_or_length_events_are_counted_and_marked_estimated() -> None:
    rec = await scripted([sse(text(" a")), sse(text(" b c", "stop"), b"[DONE]")], max_tokens=16)
    assert (rec.output_tokens, rec.output_tokens_source, rec.finish_reason) == (2, "events", "stop")
    line = json.loads(rec.to_json())
    assert line["output_tokens_source"] == "events" and line["finish_reason"] == "stop"


async def test_with_a_tokenizer_the_streamed_text_is_counted(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    rec = await scripted([sse(text(" a")), sse(text(" b c", "stop"), b"[DONE]")], max_tokens=16,
                         tokenizer=str(tmp_path / "tok.json"))
    assert (rec.output_tokens, rec.output_tokens_source) == (3, "tokenizer")


async def test_a_whole_answer_is_counted_in_the_same_order(tmp_path: Path) -> None:
    answer = {"choices": [{"index": 0, "text": " a b c", "finish_reason": "length"}]}
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m", stream=False), TickClock(),
                          transport=ScriptedTransport(200, [json.dumps(answer).encode()]))
    await target.start()
    rec = RequestRecord(0, 0.0)
    await target.send(RequestSpec(0, 0.0, (1, 2, 3), 3, 6), rec)
    assert (rec.status, rec.output_tokens, rec.output_tokens_source, rec.finish_reason) == (
        "ok", 6, "max_tokens", "length")


# ---- what is known of the length fields ----------------------------------------------------------------


def test_an_accepted_length_field_is_enforced_only_where_the_server_is_known_to_honour_it() -> None:
    probed = Capabilities("auto", probed=True)
    assert probed.to_dict()["enforces_output_length"] is False
    unknown = with_length_evidence(probed, honours_ignore_eos=False)
    assert (unknown.enforces_output_length, unknown.output_length) == (False, "accepted, not verified")
    assert any("ignore_eos and min_tokens accepted, not verified" in n for n in unknown.notes)
    known = with_length_evidence(probed, honours_ignore_eos=True)
    assert (known.enforces_output_length, known.output_length, known.notes) == (True, "enforced", ())
    assert profile_capabilities("vllm").enforces_output_length is True
    assert profile_capabilities("llamacpp").output_length == "accepted, not verified"
    assert profile_capabilities("generic").output_length == "not enforced"


# ---- the token server's quirks, through `slobench run` -------------------------------------------------


def _run(srv: TokenServerProcess, out: Path, *extra: str) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    code = main([
        "run", "--url", srv.base_url, "--model", srv.model, "--workload", "tiny", "--rate", "50",
        "--num-requests", "6", "--input-len", "8", "--output-len", "6", "--out", str(out),
        "--no-progress", "--scrape-interval", "0", "--warmup", "0", *extra,
    ])
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return code, records, json.loads((out / "manifest.json").read_text())


@pytest.fixture
def quirky() -> Iterator[Any]:
    started: list[TokenServerProcess] = []

    def start(*quirks: str, itl_ms: float = 1) -> TokenServerProcess:
        srv = TokenServerProcess(ttft_ms=2, itl_ms=itl_ms, quirks=quirks).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.mark.integration
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_text_chunks_count_for_ttft_and_chunk_times(quirky: Any, tmp_path: Path, api: str) -> None:
    code, records, _ = _run(quirky("empty-text", itl_ms=20), tmp_path / "r", "--api", api)
    assert code == 0 and all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    for r in records:  # six tokens, the first and the fourth with empty text: each counted in its read's chunk
        # (events 20 ms apart get a read each, unless the client was held up and two share one), TTFT at the first
        assert sum(r["chunk_tokens"]) == 6 and 1 <= len(r["chunk_times_s"]) <= 6
        assert abs(r["first_token_s"] - r["chunk_times_s"][0]) < 1e-9
        assert (r["output_tokens"], r["output_tokens_source"]) == (6, "usage")


@pytest.mark.integration
def test_a_stream_of_empty_texts_with_usage_is_ok(quirky: Any, tmp_path: Path) -> None:
    code, records, _ = _run(quirky("all-empty-text"), tmp_path / "r")
    assert code == 0 and all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    # six tokens of empty text: five events carry one each, the sixth is the finish chunk's (not counted)
    assert {(sum(r["chunk_tokens"]), r["output_tokens"]) for r in records} == {(5, 6)}


@pytest.mark.integration
def test_two_tokens_an_event_without_usage_count_max_tokens(quirky: Any, tmp_path: Path) -> None:
    code, records, _ = _run(quirky("two-per-event", "no-usage"), tmp_path / "r")
    assert code == 0
    assert {(r["output_tokens"], r["output_tokens_source"], r["finish_reason"]) for r in records} == {
        (6, "max_tokens", "length")}


@pytest.mark.integration
def test_dropped_length_fields_are_accepted_not_verified(
    quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, records, manifest = _run(quirky("drop-extensions"), tmp_path / "r")
    assert code == 0
    caps = manifest["target"]["capabilities"]
    assert (caps["enforces_output_length"], caps["output_length"]) == (False, "accepted, not verified")
    assert capsys.readouterr().err.count("accepted, not verified") == 1  # said once, before the run
    # the run's own records show the server stopping early despite ignore_eos
    assert {(r["finish_reason"], r["output_tokens"], r["output_tokens_source"]) for r in records} == {
        ("stop", 3, "events")}
    _, _, manifest = _run(quirky(), tmp_path / "honest")
    assert manifest["target"]["capabilities"]["output_length"] == "enforced"
