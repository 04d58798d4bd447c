"""The raw HTTP/1.1 transport (`--transport raw`, slobench/targets/rawhttp.py).

Unit tests feed the connection's protocol bytes directly (every split of a chunked body, extensions,
trailers, Content-Length, bodies ending at the close, bad framing). Integration tests (marked slow) drive it
against scripted asyncio servers on 127.0.0.1 for the failures a server causes (a connection closed
mid-stream, a kept-alive connection closed under the client, a hang, a refused connect) and against the
token server, fault by fault and quirk by quirk, beside httpx.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slobench.errors import UsageError
from slobench.run.records import RequestRecord
from slobench.targets import OpenAITarget, rawhttp
from slobench.targets.openai import make_transport
from slobench.targets.options import TargetOptions, Timeouts
from slobench.targets.rawhttp import _DONE, RawHttpTransport, _Chunks, _Conn, _RawResponse, _reason
from slobench.targets.transport import TransportError
from slobench.testing import TokenServerProcess
from tests.test_openai_target import FAULT_CASES, spec

# ---- unit: the protocol, fed bytes ---------------------------------------------------------------------


class _FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

        self.reading = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.aborted


def _conn() -> _Conn:
    c = _Conn(("http", "h", 1))
    c.connection_made(_FakeTransport())  # type: ignore[arg-type]
    return c


def _body(c: _Conn) -> bytes:
    out = b"".join(c.pieces)
    c.pieces = []
    return out


EVENTS = (b"data: {\"a\":1}\n\n", b"data: {\"b\":22222222222}\n\n", b"data: ")
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0])
    + b"%X;name=value\r\n%s\r\n" % (len(EVENTS[1]), EVENTS[1])  # a chunk extension, upper-case hex
    + b"%x\r\n%s\r\n" % (len(EVENTS[2]), EVENTS[2])
    + b"0\r\nX-Trailer: yes\r\n\r\n"  # a trailer
)
CHUNKED_BODY = b"".join(EVENTS)


def test_chunked_body_split_at_every_byte_boundary() -> None:
    assert b"19;name=value" in CHUNKED
    for cut in range(1, len(CHUNKED)):
        for cut2 in (cut, min(len(CHUNKED), cut + 1), min(len(CHUNKED), cut + 7)):
            c = _conn()
            got = b""
            for piece in (CHUNKED[:cut], CHUNKED[cut:cut2], CHUNKED[cut2:]):
                if piece:
                    c.data_received(piece)
                    got += _body(c)
            assert (got, c.state, c.status, c.keep_alive, c.error) == (CHUNKED_BODY, _DONE, 200, True, None), cut


def test_chunked_body_byte_by_byte() -> None:
    c = _conn()
    got = b""
    for i in range(len(CHUNKED)):
        assert c.state != _DONE
        c.data_received(CHUNKED[i:i + 1])
        got += _body(c)
    assert (got, c.state, c.keep_alive) == (CHUNKED_BODY, _DONE, True)
    assert c.headers["content-type"] == "text/event-stream"


_CHUNK_DATA = st.binary(min_size=1, max_size=12) | st.sampled_from(
    [b"\r\n", b"a\r\nb", b"a\r\nb\r\nc", b"\r", b"\n", b"0\r\n\r\n", b"1\r\n\r\n0"])
# how a size line may be spelt: hex either case, leading zeros, an extension (the whole-chunk read refuses
# the last two and the step-by-step parse takes them)
_SPELLINGS = st.sampled_from(["%x", "%X", "0%x", "%x;ext=1"])


@settings(max_examples=300, deadline=None)
@given(datas=st.lists(st.tuples(_CHUNK_DATA, _SPELLINGS), max_size=8),
       last=st.sampled_from([b"", b"0\r\n\r\n", b"00\r\n\r\n", b"+0\r\n\r\n", b"0x0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n",
                             b"0\r\n\r\nextra", b"+3\r\nabc\r\n", b"0\r\n"]),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=4))
def test_a_read_of_whole_chunks_gives_what_the_step_by_step_parse_gives(
    datas: list[tuple[bytes, str]], last: bytes, cuts: list[int]
) -> None:
    body = b"".join(spelling.encode() % len(d) + b"\r\n" + d + b"\r\n" for d, spelling in datas) + last
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    bounds = sorted({0, len(raw), *(min(c, len(raw)) for c in cuts)})

    def parse(fast: bool) -> tuple[object, ...]:
        c = _conn()
        got = b""
        with pytest.MonkeyPatch.context() as mp:
            if not fast:
                mp.setattr(rawhttp, "_whole_chunks", lambda _buf: None)
            for a, b in zip(bounds, bounds[1:], strict=False):
                c.data_received(raw[a:b])
                got += _body(c)
        return got, c.state, c.keep_alive, c.left, c.crlf, c.trailers, c.buf, c.error and c.error.reason

    assert parse(fast=True) == parse(fast=False)


def test_a_server_s_repeated_answer_head_is_parsed_once() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Once: %d\r\nContent-Length: 2\r\n\r\nok"
    a, b, other = _conn(), _conn(), _conn()
    a.data_received(head % 1)
    b.data_received(head % 1)
    other.data_received(head % 2)
    assert a.headers is b.headers and a.headers == {"content-type": "text/plain", "x-once": "1", "content-length": "2"}
    assert other.headers["x-once"] == "2" and (_body(a), _body(b), b.state) == (b"ok", b"ok", _DONE)


def _reading() -> tuple[_Conn, _RawResponse]:
    """A connection whose reader took all it wanted before the body's end."""
    c = _conn()
    c.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    return c, _RawResponse(c, 1000)


async def test_drain_reads_the_rest_of_the_body_and_leaves_the_connection_reusable() -> None:
    c, resp = _reading()
    drain = asyncio.ensure_future(resp.drain(30.0))
    await asyncio.sleep(0)
    assert c.pieces == [] and not drain.done()  # what came unread is dropped
    c.data_received(b"3\r\nabc\r\n")
    await asyncio.sleep(0)
    assert c.pieces == [] and not drain.done()
    c.data_received(b"0\r\n\r\n")
    await asyncio.wait_for(drain, 5)
    assert (c.state, c.keep_alive, c.error, c.transport.aborted) == (_DONE, True, None, False)  # type: ignore[union-attr]
    await asyncio.wait_for(_RawResponse(c, 1000).drain(30.0), 5)  # nothing left: at once, not at its timer
    tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
    tr._release(c)
    assert tr._pooled(c.key) is c


async def test_drain_gives_up_on_a_body_whose_end_does_not_come() -> None:
    c, resp = _reading()
    await asyncio.wait_for(resp.drain(0.01), 5)
    assert c.transport.aborted and c.error is not None and c.state != _DONE  # type: ignore[union-attr]
    c, resp = _reading()
    drain = asyncio.ensure_future(resp.drain(30.0))
    await asyncio.sleep(0)
    c.connection_lost(None)  # a connection lost while draining: nothing to reuse, nothing raised
    await asyncio.wait_for(drain, 5)
    assert c.error is not None


def test_content_length_body_and_headers() -> None:
    raw = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 11\r\n\r\nhello world"
    for cut in range(1, len(raw)):
        c = _conn()
        c.data_received(raw[:cut])
        c.data_received(raw[cut:])
        assert (_body(c), c.state, c.status, c.headers["retry-after"], c.keep_alive) == (
            b"hello world", _DONE, 429, "7", True)


def test_interim_answers_are_skipped_and_empty_bodies_end_at_once() -> None:
    c = _conn()
    c.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert (c.status, c.state, _body(c)) == (204, _DONE, b"")


def test_a_body_without_length_ends_at_the_close_and_is_not_kept_alive() -> None:
    c = _conn()
    c.data_received(b"HTTP/1.1 200 OK\r\n\r\nsome")
    c.data_received(b" bytes")
    assert c.state != _DONE
    c.connection_lost(None)
    assert (_body(c), c.state, c.keep_alive, c.error) == (b"some bytes", _DONE, False, None)


def test_connection_close_and_http10_are_not_kept_alive() -> None:
    c = _conn()
    c.data_received(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert (c.state, c.keep_alive) == (_DONE, False)
    c = _conn()
    c.data_received(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert (c.state, c.keep_alive) == (_DONE, False)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (None, "connection lost mid-response (connection closed before the body ended)"),
        (ConnectionResetError(104, "Connection reset by peer"), "connection lost mid-response (connection reset by peer)"),
    ],
)
def test_a_connection_lost_mid_body_is_an_error(exc: Exception | None, reason: str) -> None:
    for head in (b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", b"Content-Length: 100\r\n\r\nhello"):
        c = _conn()
        c.data_received(b"HTTP/1.1 200 OK\r\n" + head)
        assert _body(c) == b"hello"
        c.connection_lost(exc)
        assert c.error is not None and (c.error.status, c.error.reason) == ("error", reason)


def test_a_connection_lost_before_the_answer_is_an_error() -> None:
    c = _conn()
    c.data_received(b"HTTP/1.1 200")
    c.connection_lost(None)
    assert c.error is not None
    assert c.error.reason == "server closed the connection before the response ended"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad size
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",  # a sign
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",  # no CRLF after the data
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_bad_framing_is_an_error_and_the_connection_is_dropped(raw: bytes) -> None:
    c = _conn()
    c.data_received(raw)
    assert c.error is not None and c.error.status == "error"
    assert c.error.reason.startswith("invalid HTTP response: ")
    assert c.transport.aborted  # type: ignore[union-attr]


async def test_chunks_returns_what_came_since_the_last_read_joined() -> None:
    c = _conn()
    c.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nab")
    c.data_received(b"cd")
    it = _Chunks(c)
    assert await it.__anext__() == b"abcd"
    c.data_received(b"ef")
    assert [p async for p in it] == [b"ef"]


async def test_reading_pauses_while_the_reader_is_behind_and_resumes_when_it_catches_up() -> None:
    c = _conn()
    tr = c.transport
    c.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for i in range(100):
        c.data_received(b"x")
        assert tr.reading == (i < 64), i  # type: ignore[union-attr]
    assert await _Chunks(c).__anext__() == b"x" * 100
    assert tr.reading  # type: ignore[union-attr]


def test_request_bytes_are_built_once_per_url_and_headers() -> None:
    tr = RawHttpTransport(timeout_s=1, connect_timeout_s=1)
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer k"}
    target, head = tr._head("http://example.test:8080/v1/completions?x=1", hdrs)
    assert head == (b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: example.test:8080\r\n"
                    b"Content-Type: application/json\r\nAuthorization: Bearer k\r\nUser-Agent: slobench\r\n"
                    b"Accept-Encoding: identity\r\n"
                    b"Content-Length: ")
    assert target.key == ("http", "example.test", 8080) and target.ssl is None
    assert tr._head("http://example.test:8080/v1/completions?x=1", dict(hdrs))[1] is head  # cached
    t6, head6 = tr._head("https://[::1]/v1/chat/completions", {})
    assert head6.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: [::1]\r\n")
    assert t6.key == ("https", "::1", 443) and t6.ssl is not None and t6.server_hostname == "::1"


@pytest.mark.parametrize(
    ("url", "headers", "wrong"),
    [
        ("ftp://h/x", {}, "http:// or https://"),
        ("http://u:p@h/x", {}, "credentials"),
        ("http://h/x", {"X-Bad": "a\r\nInjected: 1"}, "line break"),
        ("http://h/x", {"Content-Length": "3"}, "set by the transport"),
    ],
)
def test_bad_urls_and_headers_are_refused_by_name(url: str, headers: dict[str, str], wrong: str) -> None:
    tr = RawHttpTransport(timeout_s=1, connect_timeout_s=1)
    with pytest.raises(UsageError, match=wrong):
        tr._head(url, headers)


def test_name_lookup_and_tls_errors_are_said_in_their_own_words() -> None:
    assert _reason(socket.gaierror(socket.EAI_NONAME, "Name or service not known")) == (
        "name lookup failed: name or service not known")
    assert _reason(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")) == "connection refused"


async def test_make_transport_builds_it_and_refuses_http2() -> None:
    tr = make_transport("raw", timeout_s=1, connect_timeout_s=1)
    assert isinstance(tr, RawHttpTransport)
    await tr.close()
    with pytest.raises(UsageError, match="'raw'"):
        make_transport("raw", timeout_s=1, connect_timeout_s=1, http2=True)


# ---- integration: scripted servers ---------------------------------------------------------------------

slow = pytest.mark.slow
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def scripted_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on 127.0.0.1 running `handler(reader, writer, connection_number)` per connection; yields
    its URL and the list of connection numbers seen."""
    seen: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen))
        try:
            await handler(reader, writer, seen[-1])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/completions", seen
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def post(tr: RawHttpTransport, url: str, body: bytes = b"{}") -> tuple[int, str | None, bytes]:
    async with asyncio.timeout(10):  # a guard: every case here ends in well under a second
        async with tr.post(url, body, {"Content-Type": "application/json"}) as resp:
            return resp.status, resp.retry_after, await resp.read()


@slow
async def test_a_body_written_byte_by_byte_arrives_whole_and_the_connection_is_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        while True:
            req = await read_request(reader)
            assert req.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
            for i in range(len(CHUNKED)):
                writer.write(CHUNKED[i:i + 1])
                await writer.drain()

    async with scripted_server(handler) as (url, seen):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            for _ in range(3):
                assert await post(tr, url) == (200, None, CHUNKED_BODY)
            (conn,) = [c for pool in tr._pools.values() for c in pool]
            sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # issue 19: no Nagle delay
        finally:
            await tr.close()
    assert seen == [0]  # one keep-alive connection for all three


@slow
async def test_429_with_retry_after() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nslow")
        await writer.drain()
        await reader.read()

    async with scripted_server(handler) as (url, _):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            assert await post(tr, url) == (429, "3", b"slow")
        finally:
            await tr.close()


@slow
async def test_a_connection_closed_mid_stream_is_an_error_not_a_hang() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()  # and close, the stream unfinished

    async with scripted_server(handler) as (url, _):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            with pytest.raises(TransportError) as err:
                await post(tr, url)
        finally:
            await tr.close()
    assert (err.value.status, err.value.reason) == (
        "error", "connection lost mid-response (connection closed before the body ended)")


@slow
async def test_a_kept_alive_connection_the_server_drops_is_retried_once_on_a_new_one() -> None:
    # The server answers the first request of each connection, then closes it on the next one without an
    # answer: the race where the client picks a pooled connection the server is closing.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # then close

    async with scripted_server(handler) as (url, seen):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        sent: list[int] = []
        try:
            assert await post(tr, url) == (200, None, b"ok")
            async with tr.post(url, b"{}", {}, lambda: sent.append(1)) as resp:
                assert (resp.status, await resp.read()) == (200, b"ok")
        finally:
            await tr.close()
    assert seen == [0, 1] and sent == [1]  # sent twice, answered on the second connection; on_sent the first time


@slow
async def test_a_connection_closed_before_any_answer_is_reported() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)  # and close without a word

    async with scripted_server(handler) as (url, seen):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            with pytest.raises(TransportError) as err:
                await post(tr, url)
        finally:
            await tr.close()
    assert err.value.reason == "server closed the connection before the response ended"
    assert seen == [0]  # a new connection is not retried


@slow
async def test_a_hang_times_out_and_a_refused_connect_says_where() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _n: int) -> None:
        await read_request(reader)
        await reader.read()  # never answers

    async with scripted_server(handler) as (url, _):
        tr = RawHttpTransport(timeout_s=0.2, connect_timeout_s=5)
        try:
            with pytest.raises(TransportError) as err:
                await post(tr, url)
        finally:
            await tr.close()
    assert (err.value.status, err.value.reason) == ("timeout", "request timed out after 0.2 s")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
    try:
        with pytest.raises(TransportError) as err:
            await post(tr, f"http://127.0.0.1:{port}/v1/completions")
    finally:
        await tr.close()
    assert (err.value.status, err.value.reason) == ("error", f"cannot connect to 127.0.0.1:{port}: connection refused")


# ---- integration: the token server, beside httpx ---------------------------------------------------------


@slow
@pytest.mark.integration
async def test_each_fault_is_the_record_httpx_gives(token_server: TokenServerProcess) -> None:
    fast = {"x_ttft_ms": 1, "x_itl_ms": 1}
    options = TargetOptions(model=token_server.model, extra_body=fast, timeouts=Timeouts(request_s=0.5), transport="raw")
    async with OpenAITarget(token_server.base_url, options) as target:
        for fault, status, reason, num_tokens in FAULT_CASES:
            rec = RequestRecord(0, 0.0)
            await target.send(spec(max_tokens=6, extra_body=(("x_fault", fault),)), rec)
            assert (rec.status, fault) == (status, fault)
            assert rec.error is None if reason is None else rec.error is not None and reason in rec.error, (
                fault, rec.error)
            assert sum(rec.chunk_tokens) == num_tokens, fault
            assert rec.done_s is not None and rec.sent_s is not None and rec.done_s >= rec.sent_s
            after = RequestRecord(1, 0.0)
            await target.send(spec(max_tokens=3), after)
            assert (after.status, after.output_tokens) == ("ok", 3), (fault, after.error)


@slow
@pytest.mark.integration
@pytest.mark.parametrize("quirk", ["no-done", "strict-fields", "no-usage", "interrupt", "eos-early"])
@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_quirky_servers_give_the_records_httpx_gives(
    start_token_server: Callable[..., TokenServerProcess], quirk: str, api: str
) -> None:
    srv = start_token_server(ttft_ms=1.0, itl_ms=1.0, quirks=(quirk,))
    records = {}
    for transport in ("httpx", "raw"):
        options = TargetOptions(model=srv.model, api=api, transport=transport, server_profile="vllm")  # type: ignore[arg-type]
        async with OpenAITarget(srv.base_url, options) as target:
            recs = []
            for max_tokens in (1, 4, 8):
                rec = RequestRecord(0, 0.0)
                await target.send(spec(max_tokens=max_tokens, ignore_eos=True), rec)
                recs.append((rec.status, rec.error, rec.http_status, rec.output_tokens, sum(rec.chunk_tokens)))
            records[transport] = recs
    assert records["raw"] == records["httpx"]


@slow
@pytest.mark.integration
async def test_the_pool_does_not_cap_concurrency(token_server: TokenServerProcess) -> None:
    num = 120
    u = uuid.uuid4().hex[:8]
    ids = [f"rawpool-{u}-{i}" for i in range(num)]
    options = TargetOptions(model=token_server.model, transport="raw", extra_body={"x_ttft_ms": 1000, "x_itl_ms": 1})
    async with OpenAITarget(token_server.base_url, options) as target:
        records = [RequestRecord(i, 0.0) for i in range(num)]
        await asyncio.gather(*(target.send(spec(max_tokens=1, extra_body=(("x_request_id", ids[r.request_id]),)), r)
                               for r in records))
    assert all(r.status == "ok" for r in records)
    log = {line["id"]: line for line in token_server.read_log()}
    received = [log[i]["recv_s"] for i in ids]
    assert max(received) - min(received) < 0.5, max(received) - min(received)


@slow
@pytest.mark.parametrize("when", ["with the answer", "while idle"])
async def test_bytes_after_the_answer_retire_the_connection(when: str) -> None:
    # A server may say more than it was asked (a 408 before closing a keep-alive connection): that answers
    # no request, so the connection is not reused for the next one.
    first_read = asyncio.Event()
    client_closed = asyncio.Event()
    late = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % n + (late if when == "with the answer" else b""))
        await writer.drain()
        if n == 0 and when == "while idle":
            await first_read.wait()  # the client has put the connection back in its pool
            writer.write(late)
            await writer.drain()
        await reader.read()  # until the client closes
        client_closed.set()

    async with scripted_server(handler) as (url, seen):
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            assert await post(tr, url) == (200, None, b"0")
            first_read.set()
            async with asyncio.timeout(5):
                await client_closed.wait()  # the client dropped the connection, and did not wait to reuse it
            assert await post(tr, url) == (200, None, b"1")
        finally:
            await tr.close()
    assert seen == [0, 1]


def _self_signed(d: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files in `d`."""
    import datetime
    import ipaddress

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return str(d / "cert.pem"), str(d / "key.pem")


@slow
async def test_https_verifies_the_server_and_streams_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                writer.write(CHUNKED)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    url = f"https://127.0.0.1:{port}/v1/completions"
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "nothing.pem"))  # trusts nothing
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            with pytest.raises(TransportError) as err:
                await post(tr, url)
        finally:
            await tr.close()
        assert err.value.status == "error"
        assert err.value.reason.startswith(f"cannot connect to 127.0.0.1:{port}: tls: "), err.value.reason
        assert "certificate" in err.value.reason

        monkeypatch.setenv("SSL_CERT_FILE", cert)  # trusts the server's certificate
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        try:
            for _ in range(2):
                assert await post(tr, url) == (200, None, CHUNKED_BODY)
        finally:
            await tr.close()
    finally:
        server.close()
        await server.wait_closed()
