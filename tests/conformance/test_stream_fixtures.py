"""Byte-exact streams of real servers, replayed through OpenAITarget: each `streams/<server>-<case>.sse`
has a sidecar `<name>.json` saying what the client must make of it (and where the shape comes from). A
`.sse` whose sidecar says `"stream": false` holds a whole (non-streamed) JSON answer's body instead.

Sidecar keys: status ("ok"/"error"), content_tokens (tokens counted from content events), output_tokens,
prompt_tokens (null: the server sent no usage), cached_tokens (optional), finish (whether a chunk
carried a finish_reason; checked when the record has a `finish_reason`), error_contains (a substring of
the recorded error, or a list of which any one must appear), api (completions/chat/responses), source, and
optionally abort (true: the server closed the connection after the last event, without ending the body),
max_tokens (what the stream was made under, where it ends in finish_reason "length"; else 16),
finish_reason (the one the record must hold), stream (false: a whole answer, asked with stream false) and
http_status (the status the server answered with; else 200).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_server import FixtureServer, split_events

from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts

STREAMS = Path(__file__).parent / "streams"
FIXTURES = sorted(p.stem for p in STREAMS.glob("*.sse"))
SERVERS = ("vllm", "sglang", "tgi", "ollama", "openai", "lmstudio")


def expected(name: str) -> dict[str, Any]:
    return json.loads((STREAMS / f"{name}.json").read_text())


def test_every_fixture_has_a_sidecar_and_every_server_is_covered() -> None:
    assert FIXTURES, f"no fixtures in {STREAMS}"
    for name in FIXTURES:
        exp = expected(name)
        assert exp["status"] in ("ok", "error"), name
        assert exp["api"] in ("completions", "chat", "responses"), name
        assert exp["source"], name
    assert {p.stem for p in STREAMS.glob("*.json")} == set(FIXTURES)
    for server in SERVERS:
        assert any(n.startswith(server + "-") for n in FIXTURES), f"no fixture for {server}"
    responses = [expected(n) for n in FIXTURES if n.startswith("vllm032-responses-")]
    assert {e.get("stream", True) for e in responses} == {True, False}, "vLLM's Responses API: streamed and whole"


@pytest.mark.parametrize("name", FIXTURES)
def test_replay_is_byte_exact(name: str) -> None:
    raw = (STREAMS / f"{name}.sse").read_bytes()
    assert b"".join(split_events(raw)) == raw


@pytest.mark.integration
@pytest.mark.parametrize("name", FIXTURES)
async def test_stream_fixture(name: str) -> None:
    exp = expected(name)
    spec = RequestSpec(request_id=0, arrival_s=0.0, prompt="Hello there", input_tokens=2,
                       max_tokens=exp.get("max_tokens", 16))
    record = RequestRecord(0, 0.0)
    status, stream = exp.get("http_status", 200), exp.get("stream", True)
    ctype = "text/event-stream" if stream and status == 200 else "application/json"
    async with FixtureServer(STREAMS / f"{name}.sse", abort=exp.get("abort", False), status=status,
                             content_type=ctype) as srv:
        options = TargetOptions(model=srv.model, api=exp["api"], stream=stream, api_key_env=None,
                                timeouts=Timeouts(request_s=10.0))
        async with OpenAITarget(srv.base_url, options) as target:
            await target.send(spec, record)

    got = {
        "status": record.status,
        "content_tokens": sum(record.chunk_tokens),
        "output_tokens": record.output_tokens,
        "prompt_tokens": record.prompt_tokens,
    }
    want = {k: exp[k] for k in got}
    if "cached_tokens" in exp:
        got["cached_tokens"], want["cached_tokens"] = record.cached_tokens, exp["cached_tokens"]
    if hasattr(record, "finish_reason"):
        got["finish"], want["finish"] = record.finish_reason is not None, exp["finish"]
    if "finish_reason" in exp:
        got["finish_reason"], want["finish_reason"] = record.finish_reason, exp["finish_reason"]
    assert got == want, f"{name}: error={record.error!r}\nsource: {exp['source']}"

    if exp["status"] == "ok":
        assert record.error is None
        assert record.done_s is not None and record.first_token_s is not None
    else:
        assert record.error, name
        wanted = exp.get("error_contains")
        if wanted:
            options = [wanted] if isinstance(wanted, str) else wanted
            assert any(w in record.error for w in options), f"{name}: {record.error!r} lacks {options}"
