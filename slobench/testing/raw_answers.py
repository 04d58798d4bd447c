"""A loopback HTTP/1.1 server that writes exactly the bytes it is given, and the answers that test a client's
reading of HTTP/1.1: the differential test of the two transports (tests/test_transport_differential.py)
and the hostile server's byte-level behaviours (slobench.testing.hostile_server) play them.

`RawServer(answer)` calls `answer(request)` for each request it reads (`Request`: the connection's number,
the request's number on it, its body) and writes what that returns: `Play(data, close=..., drip=...)`, or
None to close the connection without a word (a server closing a kept-alive connection as a request came).
`completion_json`, `sse_body`, `framed` build the answers of an OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODEL = "test-model"
MODELS_ANSWER = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
ERROR_500 = b"Internal Server Error"


@dataclass(frozen=True, slots=True)
class Request:
    conn: int  # the connection's number, from 0
    index: int  # the request's number on its connection, from 0
    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Play:
    """Bytes to write as the answer; then close the connection (`close`), and write them a byte at a time
    (`drip`)."""

    data: bytes
    close: bool = False
    drip: bool = False


Answer = Callable[[Request], "Play | None"]


class RawServer:
    """`async with RawServer(answer) as url:` a server on 127.0.0.1 (url: its /v1 base URL)."""

    def __init__(self, answer: Answer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.answer = answer
        self.host = host
        self.port = port
        self.connections = 0
        self.requests: list[Request] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def __aenter__(self) -> str:
        await self.start()
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections
        self.connections += 1
        try:
            for index in range(1 << 30):
                request = await _read_request(reader, conn, index)
                if request is None:
                    return
                self.requests.append(request)
                play = MODELS if request.method == "GET" else self.answer(request)
                if play is None:
                    return
                if play.drip:
                    for i in range(len(play.data)):
                        writer.write(play.data[i:i + 1])
                        await writer.drain()
                else:
                    writer.write(play.data)
                    await writer.drain()
                if play.close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader, conn: int, index: int) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed the connection
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return Request(conn, index, method, path, await reader.readexactly(length))


def framed(body: bytes, *, status: str = "200 OK", content_type: str = "application/json",
           how: str = "length", extra: bytes = b"") -> bytes:
    """An answer: status line, headers (`extra` raw header lines, each ending in CRLF), `body` framed by a
    Content-Length (`how="length"`), as one chunk (`"chunked"`), or by the close (`"close"`)."""
    head = b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + content_type.encode() + b"\r\n" + extra
    if how == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if how == "chunked":
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return head + b"Connection: close\r\n\r\n" + body


def completion_json(num_tokens: int) -> bytes:
    return json.dumps({"object": "text_completion", "choices": [
        {"index": 0, "text": "tok " * num_tokens, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": num_tokens, "total_tokens": 3 + num_tokens}}).encode()


def sse_body(num_tokens: int, eol: bytes = b"\n") -> bytes:
    """A stream of `num_tokens` one-token events, the usage and [DONE], each line ending in `eol`."""
    events = [{"choices": [{"index": 0, "text": "tok ", "finish_reason": "length" if i == num_tokens - 1 else None}]}
              for i in range(num_tokens)]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": num_tokens,
                                            "total_tokens": 3 + num_tokens}})
    lines = [b"data: " + json.dumps(e).encode() for e in events] + [b"data: [DONE]"]
    return b"".join(line + eol + eol for line in lines)


def error_500() -> bytes:
    """What an ASGI server's error middleware writes for an unhandled exception: a bare 500 with a length
    and no `Connection: close` (the server closes the connection after it all the same)."""
    return framed(ERROR_500, status="500 Internal Server Error", content_type="text/plain; charset=utf-8")


MODELS = Play(framed(MODELS_ANSWER))
