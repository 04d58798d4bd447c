"""The OpenAI target: unit tests through a scripted transport, integration tests against the token server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slobench.errors import SpecError, TargetUnreachable
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.openai import _is_token, _Stream, _tokens_in
from slobench.targets.options import TargetOptions, Timeouts
from slobench.targets.sse import SSEParser
from slobench.targets.transport import Response, TransportError
from slobench.testing import TokenServerProcess

KEY = "sk-test-0123456789abcdef"

# ---- a scripted transport and a clock that ticks once per reading ------------------------------------


class TickClock(Clock):
    """Each reading is 1 s after the last: stamps show exactly which reading each one was."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0

    def now_s(self) -> float:
        self.t += 1.0
        return self.t


@dataclass
class ScriptedResponse:
    status: int
    pieces: list[bytes | BaseException]

    async def _gen(self) -> AsyncIterator[bytes]:
        for p in self.pieces:
            if isinstance(p, BaseException):
                raise p
            yield p

    def chunks(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def read(self) -> bytes:
        return b"".join(p for p in self.pieces if isinstance(p, bytes))


@dataclass
class ScriptedTransport:
    status: int = 200
    pieces: list[bytes | BaseException] = field(default_factory=list)
    sent: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    closed: bool = False

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AsyncIterator[Response]:
        self.sent.append((url, json.loads(body), dict(headers)))
        if on_sent is not None:
            on_sent()
        yield ScriptedResponse(self.status, self.pieces)

    async def close(self) -> None:
        self.closed = True


def sse(*objs: Any) -> bytes:
    return b"".join(
        b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs
    )


def tok(text: str = " a", **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, **extra}]}


def ctok(content: str | None = " a", **delta: Any) -> dict[str, Any]:
    d = {"content": content, **delta} if content is not None else delta
    return {"choices": [{"index": 0, "delta": d}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}
FIN = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}  # the finish chunk, without text
CFIN = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


def spec(prompt: str | tuple[int, ...] = (1, 2, 3), **kw: Any) -> RequestSpec:
    return RequestSpec(request_id=kw.pop("request_id", 0), arrival_s=0.0, prompt=prompt, input_tokens=3,
                       max_tokens=kw.pop("max_tokens", 4), **kw)


async def run_scripted(
    pieces: list[bytes | BaseException], *, status: int = 200, api: str = "completions", api_key: str | None = None,
    **kw: Any
) -> tuple[RequestRecord, ScriptedTransport]:
    tr = ScriptedTransport(status, pieces)
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m", api=api, **kw), TickClock(),  # type: ignore[arg-type]
                          transport=tr, api_key=api_key)
    await target.start()
    rec = RequestRecord(0, 0.0)
    await target.send(spec("hi there") if api == "chat" else spec(), rec)
    return rec, tr


# ---- unit: timing and token counting -----------------------------------------------------------------


async def test_stream_stamps_each_read_and_counts_tokens() -> None:
    rec, _ = await run_scripted([sse(tok()), sse(tok(), tok()), sse(FIN, USAGE) + b"data: [DONE]\n\n"])
    assert rec.status == "ok", rec.error
    assert rec.sent_s == 2.0  # reading 1 was the fallback stamp before post(); on_sent replaced it
    # reads stamped at 3, 4, 5: two events in one read are one chunk carrying two tokens
    assert rec.chunk_times_s == [3.0, 4.0]
    assert rec.chunk_tokens == [1, 2]
    assert rec.first_token_s == 3.0 and rec.done_s == 5.0
    assert (rec.output_tokens, rec.prompt_tokens) == (4, 7)  # usage overrides counted chunks
    assert rec.usage_output_tokens == 4


async def test_without_usage_output_tokens_are_the_counted_tokens() -> None:
    rec, _ = await run_scripted([sse(tok(), tok(), tok(finish_reason="stop"), b"[DONE]")])
    assert (rec.status, rec.output_tokens, rec.prompt_tokens) == ("ok", 3, None)


async def test_token_ids_and_logprobs_give_tokens_per_chunk() -> None:
    rec, _ = await run_scripted(
        [sse(tok(token_ids=[5, 6, 7])), sse(tok(logprobs={"tokens": ["a", "b"]})), sse(b"[DONE]")]
    )
    assert rec.chunk_tokens == [3, 2]


async def test_empty_text_and_role_chunks_are_not_content() -> None:
    rec, _ = await run_scripted([sse(ctok("", role="assistant")), sse(ctok(None)), sse(ctok("x")), sse(b"[DONE]")],
                                api="chat")
    assert rec.chunk_times_s == [5.0]
    assert rec.first_token_s == 5.0


async def test_reasoning_and_tool_call_deltas_are_output_tokens() -> None:
    # A reasoning model streams its thinking first (vLLM: reasoning_content, newer: reasoning): TTFT is the
    # first of those, not the first answer token; tool-call arguments are output too.
    call = {"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\": 1}"}}]}
    no_args = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]}
    rec, _ = await run_scripted(
        [sse(ctok(None, role="assistant")), sse(ctok(None, reasoning_content="hmm")), sse(ctok(None, reasoning="so")),
         sse(ctok(None, **no_args)), sse(ctok(None, **call)), sse(ctok("answer"), CFIN), sse(b"[DONE]")],
        api="chat",
    )
    assert rec.status == "ok", rec.error
    assert rec.first_token_s == 4.0  # the reasoning delta, read at t=4 (t=3 was the role-only chunk)
    assert rec.chunk_times_s == [4.0, 5.0, 7.0, 8.0] and rec.output_tokens == 4


async def test_cached_prompt_tokens_from_usage_details() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 300, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 256}}}
    rec, _ = await run_scripted([sse(tok(), tok(), FIN, usage, b"[DONE]")])
    assert (rec.prompt_tokens, rec.cached_tokens) == (300, 256)
    for details in (None, {"cached_tokens": None}, {"cached_tokens": True}, "x"):
        odd = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": details}}
        rec, _ = await run_scripted([sse(tok(), FIN, odd, b"[DONE]")])
        assert rec.status == "ok" and rec.cached_tokens is None


async def test_comments_and_data_after_done_are_ignored() -> None:
    rec, _ = await run_scripted([b": keep-alive\n\n", sse(tok(), FIN, b"[DONE]"), sse(tok()), b"garbage"])
    assert rec.status == "ok" and rec.chunk_tokens == [1]
    assert rec.done_s == 4.0  # the read holding [DONE], not the end of the body


async def test_non_streaming_takes_usage_and_one_time() -> None:
    body = json.dumps({"choices": [{"text": "abc"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    rec, tr = await run_scripted([body.encode()], stream=False)
    assert rec.status == "ok"
    assert rec.first_token_s == rec.done_s == 3.0
    assert (rec.output_tokens, rec.prompt_tokens) == (4, 3)
    assert rec.chunk_times_s == []
    assert tr.sent[0][1]["stream"] is False and "stream_options" not in tr.sent[0][1]


# ---- unit: failures are data -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "reason", "num_chunks"),
    [
        ([sse(tok()), b"data: {not json\n\n"], "malformed JSON in SSE event", 1),
        ([sse(tok()), b"data: [1, 2]\n\n"], "malformed JSON in SSE event", 1),
        ([sse(tok()), b"data: \xff\n\n"], "not UTF-8", 1),
        # good events in the same read before the bad line (how a busy client reads): still the failure
        ([sse(tok()) + sse(tok()) + b"data: \xff\n\n" + sse(tok(), FIN, b"[DONE]")], "not UTF-8", 1),
        ([b"d", b"ata: " + sse(tok())[6:] + b'data: {"t": "\xff', b'"}\n\n' + sse(tok(), FIN, b"[DONE]")],
         "not UTF-8", 1),
        ([sse(tok()), sse(tok())], "stream ended after 2 tokens without a finish_reason or [DONE]", 2),
        ([sse(tok()), sse(tok(), b"[DONE]")], "cut off by the server after 2 tokens", 2),
        ([sse(tok()), b'{"error": {"message": "raw"}}'], "stream ended after 1 tokens", 1),
        ([b'{"error": {"message": "overloaded"}}'], "server error: overloaded", 0),
        ([b"event: token\nid: 1\n\n"], "no SSE events in the stream", 0),
        ([sse(FIN, b"[DONE]")], "no output: the stream finished", 0),
        ([sse(tok(), {"error": {"message": "boom"}})], "server error mid-stream: boom", 1),
        ([sse(tok(), {"object": "error", "message": "old vllm"})], "server error mid-stream: old vllm", 1),
        ([sse(tok()), b"event: error\ndata: overloaded\n\n"], "server error mid-stream: overloaded", 1),
        ([sse(tok()), TransportError("error", "connection lost mid-response (x)")], "connection lost", 1),
        ([TransportError("timeout", "request timed out after 1 s")], "timed out", 0),
    ],
)
async def test_stream_failures_become_record_data(pieces: list[Any], reason: str, num_chunks: int) -> None:
    rec, _ = await run_scripted(pieces)
    assert rec.status in ("error", "timeout")
    assert rec.error is not None and reason in rec.error
    assert len(rec.chunk_times_s) == num_chunks  # tokens received before the failure are kept
    assert rec.output_tokens == sum(rec.chunk_tokens)
    assert rec.done_s is not None


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: \xff\n\n", sse({"error": "x"})])
async def test_tokens_in_the_same_read_as_a_failure_are_kept(bad: bytes) -> None:
    rec, _ = await run_scripted([sse(tok()), sse(tok(), tok()) + bad + sse(tok())])
    assert rec.status == "error"
    assert rec.chunk_tokens == [1, 2]  # not the token after the failure


# events of every kind a stream may carry, for both APIs: what a read of whole `data: {...}` events takes in
# one step (`_objects_of`, `_Stream.take_all`) must be what the SSE parser and `take`, event by event, make of it
EVENT_KINDS: list[Any] = [
    tok(), tok(""), tok(" b", token_ids=[1, 2]), tok(" c", logprobs={"tokens": ["x", "y", "z"]}), tok(" d", logprobs=None),
    FIN, tok(" e", finish_reason="stop"), tok("", finish_reason=""), USAGE, {"choices": [], "usage": None},
    {"choices": [], "usage": {"completion_tokens": 0, "prompt_tokens": 0}},
    ctok(), ctok(""), ctok(None, role="assistant"), ctok("", role="assistant"), ctok(None, reasoning_content="r"),
    ctok(None, tool_calls=[{"function": {"arguments": "{}"}}]), ctok(" f", token_ids=[4]), CFIN,
    {"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": {"content": [1, 2]}}]},
    {"error": {"message": "boom"}}, {"object": "error", "message": "old"}, {"choices": [None]}, {"choices": "x"},
    {"choices": [{"text": "a", "finish_reason": 5}]}, {}, b"[1, 2]", b'"text"', b"{not json", b"[DONE]", b"{}",
    b'{"choices": [{"text": "\xff"}]}', b": comment", b"event: error\ndata: overloaded",
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.sampled_from(EVENT_KINDS), max_size=10), cuts=st.lists(st.integers(0, 4000), max_size=3),
       api=st.sampled_from(["completions", "chat"]), usage=st.booleans())
def test_a_read_of_whole_events_gives_the_record_event_by_event_gives(
    events: list[Any], cuts: list[int], api: str, usage: bool
) -> None:
    if b"[DONE]" in events:  # what follows is ignored, but for bytes that are not UTF-8 when the parser reads them
        done = events.index(b"[DONE]")
        events = events[:done] + [e for e in events[done:] if not (isinstance(e, bytes) and b"\xff" in e)]
    body = b"".join(e + b"\n\n" if isinstance(e, bytes) and e[:1] in (b":", b"e") else sse(e) for e in events)
    bounds = sorted({0, len(body), *(min(c, len(body)) for c in cuts)})
    pieces: list[bytes | BaseException] = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def record(whole_reads: bool) -> dict[str, Any]:
        with pytest.MonkeyPatch.context() as mp:
            if not whole_reads:
                mp.setattr(SSEParser, "data_events", lambda _self, _chunk: None)
            rec, _ = asyncio.run(run_scripted(pieces, api=api, server_profile="vllm" if usage else "generic"))
        return dataclasses.asdict(rec)

    assert record(whole_reads=True) == record(whole_reads=False)


@pytest.mark.parametrize("is_chat", [False, True])
def test_the_inline_token_count_is_is_token_and_tokens_in(is_chat: bool) -> None:
    for obj in EVENT_KINDS:
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list) or not obj["choices"]:
            continue
        c = obj["choices"][0]
        if not isinstance(c, dict):
            continue
        reason = c.get("finish_reason") if c.get("finish_reason") and isinstance(c.get("finish_reason"), str) else None
        out = c.get("delta") if is_chat else c.get("text")
        stream = _Stream(RequestRecord(0, 0.0), is_chat)
        stream.texts = []
        num = stream.take_all([obj], [b""])
        expected = _tokens_in(c, is_chat) if _is_token(out, reason, is_chat) else 0
        assert (num, len(stream.texts)) == (expected, 1 if expected else 0), obj


async def test_timeout_status_is_timeout() -> None:
    rec, _ = await run_scripted([sse(tok()), TransportError("timeout", "request timed out after 1 s")])
    assert rec.status == "timeout"


async def test_a_drop_after_done_loses_nothing() -> None:
    rec, _ = await run_scripted([sse(tok(), FIN, b"[DONE]"), TransportError("error", "connection lost")])
    assert rec.status == "ok" and rec.error is None
    # after the finish chunk only the usage or [DONE] can be lost: the answer was complete
    stop = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
    rec, _ = await run_scripted([sse(tok(), stop), TransportError("error", "connection lost")])
    assert rec.status == "ok" and rec.error is None and rec.output_tokens == 1


async def test_http_error_message_is_extracted_truncated_and_scrubbed() -> None:
    long = "x" * 1000
    body = json.dumps({"error": {"message": f"bad key Bearer {KEY} and {KEY} {long}"}}).encode()
    rec, _ = await run_scripted([body], status=401, api_key=KEY)
    assert rec.status == "error" and rec.http_status == 401
    assert rec.error is not None
    assert rec.error.startswith("HTTP 401: bad key *** and ***")
    assert "0123456789" not in rec.error  # not even a piece of the key survives the truncation
    assert len(rec.error) <= 300


async def test_http_429_is_labelled() -> None:
    rec, _ = await run_scripted([b"slow down"], status=429)
    assert rec.error == "HTTP 429 (rate limited): slow down" and rec.http_status == 429


async def test_cancellation_propagates_and_keeps_partial_times() -> None:
    tr = ScriptedTransport(200, [sse(tok()), asyncio.CancelledError()])
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m"), TickClock(), transport=tr)  # type: ignore[arg-type]
    await target.start()
    record = RequestRecord(0, 0.0)
    with pytest.raises(asyncio.CancelledError):
        await target.send(spec(), record)
    assert record.chunk_times_s == [3.0] and record.status == "ok"  # the runner marks it cancelled


# ---- unit: request body, headers, key handling -------------------------------------------------------


async def test_completions_body_with_token_ids_and_merge_order() -> None:
    tr = ScriptedTransport(200, [sse(b"[DONE]")])
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m", extra_body={"temperature": 0.5, "top_k": 3}),
                          transport=tr)  # type: ignore[arg-type]
    await target.start()
    s = spec((1, 2, 3), max_tokens=7, min_tokens=7, extra_body=(("top_k", 9), ("x_fault", None)))
    await target.send(s, RequestRecord(0, 0.0))
    url, body, _ = tr.sent[0]
    assert url == "http://h:1/v1/completions"
    assert body == {
        "model": "m", "temperature": 0.5, "stream": True, "stream_options": {"include_usage": True},
        "prompt": [1, 2, 3], "max_tokens": 7, "ignore_eos": True, "min_tokens": 7, "top_k": 9, "x_fault": None,
    }


async def test_chat_body_and_text_prompt() -> None:
    tr = ScriptedTransport(200, [sse(b"[DONE]")])
    target = OpenAITarget("http://h:1/", TargetOptions(model="m", api="chat"), transport=tr)  # type: ignore[arg-type]
    await target.start()
    await target.send(spec("hello world", ignore_eos=False), RequestRecord(0, 0.0))
    url, body, _ = tr.sent[0]
    assert url == "http://h:1/v1/chat/completions"  # a bare host gets /v1
    assert body["messages"] == [{"role": "user", "content": "hello world"}]
    assert "ignore_eos" not in body and "min_tokens" not in body and "prompt" not in body


async def test_chat_with_token_ids_sends_the_ids_as_words() -> None:
    tr = ScriptedTransport(200, [sse(ctok("x"), CFIN, b"[DONE]")])
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m", api="chat"), transport=tr)  # type: ignore[arg-type]
    await target.start()
    rec = RequestRecord(0, 0.0)
    await target.send(spec((1000, 1001, 1000)), rec)
    content = tr.sent[0][1]["messages"][0]["content"]
    words = content.split()
    assert rec.status == "ok" and len(words) == 3 and words[0] == words[2] != words[1]


async def test_api_key_from_env_is_sent_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", KEY)
    tr = ScriptedTransport(200, [sse(b"[DONE]")])
    options = TargetOptions(model="m", api_key_env="MY_KEY", headers={"X-Trace": "t1", "X-Api-Key": "hdr-secret"})
    target = OpenAITarget("http://h:1/v1", options, transport=tr)  # type: ignore[arg-type]
    await target.start()
    rec = RequestRecord(0, 0.0)
    await target.send(spec(), rec)
    headers = tr.sent[0][2]
    assert headers["Authorization"] == f"Bearer {KEY}" and headers["X-Trace"] == "t1"
    shown = repr(target) + json.dumps(target.describe()) + rec.to_json()
    assert KEY not in shown and "hdr-secret" not in shown
    assert "X-Trace" in target.describe()["header_names"]


async def test_no_key_no_authorization_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    tr = ScriptedTransport(200, [sse(b"[DONE]")])
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m"), transport=tr)  # type: ignore[arg-type]
    await target.start()
    await target.send(spec(), RequestRecord(0, 0.0))
    assert "Authorization" not in tr.sent[0][2]


@pytest.mark.parametrize(
    ("url", "kwargs", "field_name"),
    [
        ("localhost:8000", {}, "url"),
        ("ftp://h/v1", {}, "url"),
        ("http://h:1/v1", {"api": "embeddings"}, "api"),
        ("http://h:1/v1", {"transport": "requests"}, "transport"),
        ("http://h:1/v1", {"timeouts": {"request_s": 0}}, "request_s"),
        ("http://h:1/v1", {"http2": True}, "http2"),
        ("http://h:1/v1", {"model": ""}, "model"),
    ],
)
def test_bad_arguments_name_the_field(url: str, kwargs: dict[str, Any], field_name: str) -> None:
    with pytest.raises(SpecError) as e:
        if "timeouts" in kwargs:
            kwargs = {**kwargs, "timeouts": Timeouts(**kwargs["timeouts"])}
        OpenAITarget(url, TargetOptions(**{"model": "m", **kwargs}))
    assert e.value.field == field_name


async def test_send_before_start_is_a_programming_error() -> None:
    target = OpenAITarget("http://h:1/v1", TargetOptions(model="m"))
    with pytest.raises(RuntimeError, match="start"):
        await target.send(spec(), RequestRecord(0, 0.0))


# ---- integration: against the scheduled-token server -------------------------------------------------

integration = pytest.mark.integration


def _ids(prefix: str, n: int) -> list[str]:
    u = uuid.uuid4().hex[:8]
    return [f"{prefix}-{u}-{i}" for i in range(n)]


@dataclass
class TimingRound:
    """Medians (s) of one round of 30 requests against the session server (TTFT 50 ms, ITL 5 ms)."""

    ttft: float  # client: first token - sent
    itl: float  # client: gaps between chunks
    server_ttft: float  # server log: first chunk written - request received
    to_server: float  # server received - client sent (same system-wide clock)
    to_client: float  # client first token - server wrote it


async def _timing_round(server: TokenServerProcess) -> TimingRound:
    clock = Clock()
    ids = _ids("timing", 30)
    async with OpenAITarget(server.base_url, TargetOptions(model=server.model), clock) as target:
        await target.send(spec(max_tokens=2), RequestRecord(0, 0.0))  # warm the connection pool

        async def one(i: int) -> RequestRecord:
            await asyncio.sleep(i * 0.02)  # a few in flight at once, like light open-loop load
            rec = RequestRecord(i, 0.0)
            await target.send(spec(max_tokens=16, extra_body=(("x_request_id", ids[i]),)), rec)
            return rec

        records = await asyncio.gather(*(one(i) for i in range(30)))
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    assert all(r.output_tokens == 16 and sum(r.chunk_tokens) == 16 for r in records)
    log = {line["id"]: line for line in server.read_log()}
    origin_s = clock.origin_ns * 1e-9
    med = statistics.median
    return TimingRound(
        ttft=med(r.first_token_s - r.sent_s for r in records),  # type: ignore[operator]
        itl=med(b - a for r in records for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)),
        server_ttft=med(log[i]["chunk_s"][0] - log[i]["recv_s"] for i in ids),
        to_server=med(log[ids[r.request_id]]["recv_s"] - (origin_s + r.sent_s) for r in records),  # type: ignore[operator]
        to_client=med(origin_s + r.first_token_s - log[ids[r.request_id]]["chunk_s"][0] for r in records),  # type: ignore[operator]
    )


@integration
async def test_timing_matches_the_server_schedule_and_log(token_server: TokenServerProcess) -> None:
    r = await _timing_round(token_server)
    for _ in range(2):
        if abs(r.server_ttft - 0.050) <= 0.0005:
            break
        # The server itself missed its schedule: the machine is busy (CI runs helpers side by side).
        # The client is not at fault, so measure again before judging against the schedule.
        r = await _timing_round(token_server)
    # What the issue asks: client-measured TTFT and ITL match the known schedule within 2 ms (median).
    # Whatever the server itself ran late (logged on the shared clock) is not the client's error.
    server_late = abs(r.server_ttft - 0.050)
    assert abs(r.ttft - 0.050) < 0.002 + server_late, r
    assert abs(r.itl - 0.005) < 0.002, r
    # Why they match: the server logs on the same system-wide monotonic clock, so both ends of each
    # request can be compared. Causality holds (> 0) and each direction costs well under 2 ms.
    assert 0 < r.to_server < 0.002, r
    assert 0 < r.to_client < 0.002, r
    assert abs(r.ttft - r.server_ttft) < 0.002, r


FAULT_CASES = [
    ("status_500", "error", "HTTP 500: injected internal error", 0),
    ("status_429", "error", "HTTP 429 (rate limited, Retry-After 1): injected rate limit", 0),
    ("reset_after_3", "error", "connection lost mid-response (connection reset by peer)", 3),
    ("malformed_json", "error", "malformed JSON in SSE event", 2),
    ("non_utf8", "error", "SSE stream is not UTF-8", 2),
    ("no_done", "ok", None, 6),  # the finish chunk came: complete without [DONE]
    ("error_event", "error", "server error mid-stream: injected mid-stream failure", 2),
    ("hang", "timeout", "request timed out after 0.5 s", 0),
    ("hang_after_3", "timeout", "request timed out after 0.5 s", 3),
]


@integration
@pytest.mark.parametrize("transport", ["raw", "httpx"])
async def test_each_fault_is_a_failed_record_and_the_next_request_works(
    token_server: TokenServerProcess, transport: str
) -> None:
    fast = {"x_ttft_ms": 1, "x_itl_ms": 1}
    options = TargetOptions(model=token_server.model, extra_body=fast, timeouts=Timeouts(request_s=0.5),
                            transport=transport)  # type: ignore[arg-type]
    async with OpenAITarget(token_server.base_url, options) as target:
        for fault, status, reason, num_tokens in FAULT_CASES:
            rec = RequestRecord(0, 0.0)
            await target.send(spec(max_tokens=6, extra_body=(("x_fault", fault),)), rec)
            assert (rec.status, fault) == (status, fault)
            assert reason is None and rec.error is None or rec.error is not None and reason in rec.error, (
                fault, rec.error)
            assert sum(rec.chunk_tokens) == num_tokens, fault
            assert rec.done_s is not None and rec.sent_s is not None and rec.done_s >= rec.sent_s
            after = RequestRecord(1, 0.0)
            await target.send(spec(max_tokens=3), after)
            assert (after.status, after.output_tokens) == ("ok", 3), (fault, after.error)
    assert rec.http_status == 200  # hang_after_3 had started its stream


@integration
@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("stream", [True, False])
async def test_apis_prompts_and_usage(token_server: TokenServerProcess, api: str, stream: bool) -> None:
    prompts: list[str | tuple[int, ...]] = ["one two three four five"]
    if api == "completions":
        prompts.append(tuple(range(11)))
    fast = {"x_ttft_ms": 1, "x_itl_ms": 1}
    options = TargetOptions(model=token_server.model, api=api, stream=stream, extra_body=fast)  # type: ignore[arg-type]
    async with OpenAITarget(token_server.base_url, options) as target:
        for prompt in prompts:
            rec = RequestRecord(0, 0.0)
            await target.send(spec(prompt, max_tokens=5), rec)
            assert rec.status == "ok", rec.error
            assert rec.output_tokens == 5
            assert rec.prompt_tokens == (5 if isinstance(prompt, str) else 11)
            assert rec.first_token_s is not None and rec.done_s is not None
            assert rec.sent_s is not None and rec.sent_s < rec.first_token_s <= rec.done_s
            assert sum(rec.chunk_tokens) == (5 if stream else 0)


@integration
async def test_api_key_is_sent_and_an_echoing_server_cannot_leak_it(
    token_server: TokenServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    echo = (("x_fault", "echo_auth"),)
    async with OpenAITarget(token_server.base_url, TargetOptions(model=token_server.model)) as target:
        rec = RequestRecord(0, 0.0)
        await target.send(spec(extra_body=echo), rec)
    assert rec.http_status == 401
    assert rec.error == "HTTP 401: invalid credentials: ***"  # the server saw the key and echoed it
    assert KEY not in rec.to_json()
    monkeypatch.delenv("OPENAI_API_KEY")
    async with OpenAITarget(token_server.base_url, TargetOptions(model=token_server.model)) as target:
        rec = RequestRecord(0, 0.0)
        await target.send(spec(extra_body=echo), rec)
    assert rec.error == "HTTP 401: invalid credentials:"  # no key, nothing sent


@integration
@pytest.mark.parametrize("transport", ["raw", "httpx"])
async def test_the_pool_does_not_cap_concurrency(token_server: TokenServerProcess, transport: str) -> None:
    # httpx's default pool holds 100 connections: with a cap, request 101 would reach
    # the server only once an earlier one had finished, 2 s after it arrived.
    num = 120
    ids = _ids("pool", num)
    body = {"x_ttft_ms": 2000, "x_itl_ms": 1}
    options = TargetOptions(model=token_server.model, extra_body=body, transport=transport)  # type: ignore[arg-type]
    async with OpenAITarget(token_server.base_url, options) as target:
        records = [RequestRecord(i, 0.0) for i in range(num)]
        await asyncio.gather(*(target.send(spec(max_tokens=1, extra_body=(("x_request_id", ids[r.request_id]),)), r)
                               for r in records))
    assert all(r.status == "ok" for r in records)
    log = {line["id"]: line for line in token_server.read_log()}
    received = [log[i]["recv_s"] for i in ids]
    ended = [log[i]["chunk_s"][-1] for i in ids]
    # every request was at the server before any had finished: nothing waited for a pooled connection
    # (a spread of arrivals alone would say so only by a threshold: 120 httpx connects took 0.63 s in CI)
    assert max(received) < min(ended), (max(received) - min(received), min(ended) - min(received))


@integration
async def test_raw_and_httpx_give_the_same_records(token_server: TokenServerProcess) -> None:
    fast = {"x_ttft_ms": 10, "x_itl_ms": 3}
    results = {}
    for transport in ("raw", "httpx"):
        options = TargetOptions(model=token_server.model, transport=transport, extra_body=fast)  # type: ignore[arg-type]
        async with OpenAITarget(token_server.base_url, options) as target:
            await target.send(spec(max_tokens=1), RequestRecord(0, 0.0))  # connect outside the comparison
            recs = []
            for max_tokens in (1, 4, 9, 2, 5, 3, 7):
                rec = RequestRecord(0, 0.0)
                await target.send(spec(max_tokens=max_tokens), rec)
                recs.append(rec)
            results[transport] = recs
    for a, b in zip(results["raw"], results["httpx"], strict=True):
        assert (a.status, a.error, a.http_status) == (b.status, b.error, b.http_status)
        assert (a.output_tokens, a.prompt_tokens, sum(a.chunk_tokens)) == (
            b.output_tokens, b.prompt_tokens, sum(b.chunk_tokens))
    # Both stamp on the schedule: never before the server's 10 ms, and not far after. (httpx costs more CPU
    # per request, so on a busy 2-core machine its median can trail raw's by several ms; the exact
    # 2 ms agreement is checked for the default transport in the timing test above.)
    ttft = {k: statistics.median(r.first_token_s - r.sent_s for r in v) for k, v in results.items()}  # type: ignore[operator]
    assert all(0.010 <= v < 0.040 for v in ttft.values()), ttft


# ---- integration: preflight --------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket closes


@integration
async def test_preflight_ok(token_server: TokenServerProcess) -> None:
    target = OpenAITarget(token_server.base_url, TargetOptions(model=token_server.model))
    assert "test-model" in await target.preflight()


@integration
async def test_preflight_unreachable_fails_fast_naming_the_url() -> None:
    port = _closed_port()
    target = OpenAITarget(f"http://127.0.0.1:{port}/v1", TargetOptions(model="m"))
    t0 = time.perf_counter()
    with pytest.raises(TargetUnreachable) as e:
        await target.preflight()
    assert time.perf_counter() - t0 < 2.0
    msg = str(e.value)
    assert f"http://127.0.0.1:{port}/v1/models" in msg and "connection refused" in msg
    assert "\n" not in msg and e.value.exit_code == 3


@integration
async def test_preflight_wrong_model_lists_the_served_ones(token_server: TokenServerProcess) -> None:
    target = OpenAITarget(token_server.base_url, TargetOptions(model="llama-9000"))
    with pytest.raises(TargetUnreachable, match=r"model 'llama-9000' is not served; served: 'test-model'"):
        await target.preflight()


@integration
async def test_preflight_without_models_endpoint_falls_back_to_a_request(
    start_token_server: Callable[..., TokenServerProcess],
) -> None:
    srv = start_token_server(serve_models=False, ttft_ms=1, itl_ms=1)
    assert "answers at" in await OpenAITarget(srv.base_url, TargetOptions(model=srv.model, api="chat")).preflight()
    with pytest.raises(
        TargetUnreachable, match=r"/v1/completions: the server refused the plainest request .*HTTP 404: The model `nope`"
    ):
        await OpenAITarget(srv.base_url, TargetOptions(model="nope")).preflight()


# ---- integration: the token server's own promises ----------------------------------------------------


@integration
@pytest.mark.parametrize("transport", ["raw", "httpx"])
async def test_connections_are_kept_alive_and_reused(
    token_server: TokenServerProcess, transport: str
) -> None:
    ids = _ids("keepalive", 5)
    fast = {"x_ttft_ms": 1, "x_itl_ms": 1}
    options = TargetOptions(model=token_server.model, extra_body=fast, transport=transport)  # type: ignore[arg-type]
    async with OpenAITarget(token_server.base_url, options) as target:
        for i in ids:
            rec = RequestRecord(0, 0.0)
            await target.send(spec(max_tokens=4, extra_body=(("x_request_id", i),)), rec)
            assert rec.status == "ok"
    log = {line["id"]: line for line in token_server.read_log()}
    assert len({log[i]["peer_port"] for i in ids}) == 1  # one TCP connection for all five streams


@integration
async def test_metrics_endpoint_reports_running_requests(token_server: TokenServerProcess) -> None:
    body = {"x_ttft_ms": 2000, "x_itl_ms": 1}
    async with OpenAITarget(token_server.base_url, TargetOptions(model=token_server.model, extra_body=body)) as target:
        task = asyncio.create_task(target.send(spec(max_tokens=1), RequestRecord(0, 0.0)))
        metrics_url = token_server.base_url.removesuffix("/v1") + "/metrics"
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 1.5
            running = 0.0
            while running < 1 and time.monotonic() < deadline:  # bounded poll until the request lands
                text = (await client.get(metrics_url)).text
                line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running"))
                running = float(line.rsplit(" ", 1)[1])
                await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert running >= 1
    assert "vllm:num_requests_waiting" in text


# ---- issue 13 items 4, 6, 7: no content is no success; usage is checked; wrong types are the server's ---


@pytest.mark.parametrize(
    ("usage", "output", "prompt", "cached"),
    [
        ({"completion_tokens": 999999, "prompt_tokens": 3}, 2, 3, None),  # above max_tokens: counted instead
        ({"completion_tokens": -3, "prompt_tokens": 3}, 2, 3, None),
        ({"completion_tokens": True, "prompt_tokens": 3}, 2, 3, None),
        ({"completion_tokens": 1, "prompt_tokens": 3}, 2, 3, None),  # below the 2 content events streamed
        ({"completion_tokens": 2, "prompt_tokens": 10**12}, 2, None, None),
        ({"completion_tokens": 2, "prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 10**9}}, 2, 3, None),
        ("abc", 2, None, None),
        ([1, 2], 2, None, None),
    ],
)
async def test_implausible_usage_is_kept_aside_and_not_used(usage: Any, output: int, prompt: Any, cached: Any) -> None:
    rec, _ = await run_scripted([sse(tok(), tok(finish_reason="stop"), {"choices": [], "usage": usage}, b"[DONE]")])
    assert rec.status == "ok", rec.error
    assert (rec.output_tokens, rec.prompt_tokens, rec.cached_tokens) == (output, prompt, cached)


@pytest.mark.parametrize("odd", [{"choices": [None]}, {"choices": "x"}, {"choices": [{"text": "a", "finish_reason": 5}]},
                                 {"choices": [{"delta": None}]}])
async def test_wrong_typed_fields_are_skipped_not_internal_errors(odd: dict[str, Any]) -> None:
    rec, _ = await run_scripted([sse(tok(), odd, tok(finish_reason="length"), b"[DONE]")])
    assert rec.status == "ok" and "internal" not in (rec.error or "")


@pytest.mark.parametrize("body", [b"{}", b'{"choices": []}', b'{"choices": [{"text": ""}]}', b'{"choices": [null]}'])
async def test_a_whole_answer_without_output_is_not_ok(body: bytes) -> None:
    rec, _ = await run_scripted([body], stream=False)
    assert rec.status == "error" and "no output" in (rec.error or "")


async def test_credentials_in_the_url_become_a_basic_header_and_leave_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # an Authorization header as well as the URL's credentials
    tr = ScriptedTransport(200, [sse(tok(finish_reason="length"), b"[DONE]")])
    target = OpenAITarget("http://user:pw@h:1/v1", TargetOptions(model="m"), transport=tr)  # type: ignore[arg-type]
    assert target.base_url == "http://h:1/v1" and "pw" not in json.dumps(target.describe())
    await target.start()
    rec = RequestRecord(0, 0.0)
    await target.send(spec(), rec)
    assert rec.status == "ok" and tr.sent[0][0] == "http://h:1/v1/completions"
    assert tr.sent[0][2]["Authorization"] == f"Bearer {KEY}"  # the explicit key wins
    monkeypatch.delenv("OPENAI_API_KEY")
    basic = OpenAITarget("http://user:pw@h:1/v1", TargetOptions(model="m"), transport=ScriptedTransport())  # type: ignore[arg-type]
    assert basic._headers["Authorization"] == "Basic dXNlcjpwdw=="


def test_the_request_body_is_the_json_of_build_body_whatever_extra_body_holds() -> None:
    from slobench.targets.openai import _body_bytes

    t = OpenAITarget("http://127.0.0.1:9/v1", TargetOptions(model="m", extra_body={"big": 2**70, "note": "café ☕",
                                                                                    "seq": (1, 2)}))
    s = spec(prompt=(1, 2, 3), extra_body=(("x_request_id", "é-1"),))
    body = t.build_body(s)
    sent = _body_bytes(body)  # orjson, or json where orjson refuses (the int past 64 bits here)
    assert json.loads(sent) == json.loads(json.dumps(body)) and b", " not in sent and b": " not in sent
    del t.extra_body["big"]
    assert json.loads(_body_bytes(t.build_body(s))) == json.loads(json.dumps(t.build_body(s)))
