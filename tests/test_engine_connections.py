"""The engine's server against idle, slow and vanishing clients (issue 13, item 11): connections that never
finish a request head are closed, a slow body gets a 408, an idle keep-alive connection is closed, and a
client that leaves mid-body costs no traceback in the log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from slobench.testing.process import EngineServerProcess

pytestmark = pytest.mark.integration

HEAD_S, BODY_S, KEEP_ALIVE_S = 0.5, 0.5, 1
BOUND_S = 8.0  # how long a test waits for the server to close: far past every deadline, far below "forever"


@pytest.fixture(scope="module")
def srv() -> Iterator[EngineServerProcess]:
    with EngineServerProcess("--executor", "modeled", "--header-timeout", str(HEAD_S), "--body-timeout",
                             str(BODY_S), "--keep-alive", str(KEEP_ALIVE_S)) as s:
        yield s


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed within BOUND_S."""
    out = b""
    async with asyncio.timeout(BOUND_S):
        while piece := await reader.read(65536):
            out += piece
    return out


def request(body: bytes, *, length: int | None = None) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length)) + body


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"],
                         ids=["silent", "half-a-head"])
async def test_a_connection_that_never_finishes_its_head_is_closed(srv: EngineServerProcess, sent: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(sent)
    await writer.drain()
    assert await closed_by_server(reader) == b""
    writer.close()


async def test_a_slow_body_gets_408(srv: EngineServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(request(b'{"prompt": "h', length=40))
    await writer.drain()
    async with asyncio.timeout(BOUND_S):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    writer.close()


async def test_idle_keep_alive_connection_is_closed_and_a_late_half_head_too(srv: EngineServerProcess) -> None:
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(request(body))
    await writer.drain()
    async with asyncio.timeout(BOUND_S):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    await closed_by_server(reader)  # keep-alive expiry
    writer.close()

    # a second request's head started inside the keep-alive window, then abandoned
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(request(body) + b"POST /v1/completions HTTP/1.1\r\n")
    await writer.drain()
    out = await closed_by_server(reader)
    assert out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1") == 1
    writer.close()


async def test_clients_leaving_mid_body_log_no_traceback(srv: EngineServerProcess) -> None:
    async def leave() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request(b'{"pro', length=100))
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(leave() for _ in range(20)))
    # the server must still answer, and only after it has handled the 20 disconnects do we read its log
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await writer.drain()
    assert (await closed_by_server(reader)).startswith(b"HTTP/1.1 200")
    writer.close()
    assert "Traceback" not in srv.stderr_text() and "ClientDisconnect" not in srv.stderr_text()


async def test_a_body_declared_too_large_is_refused_at_once(srv: EngineServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(request(b'{"prompt": "', length=10**10))  # 10 GB announced: nothing is buffered
    await writer.drain()
    async with asyncio.timeout(BOUND_S):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    writer.close()
