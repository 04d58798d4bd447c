"""A loopback HTTP/1.1 server that writes exactly the bytes it is given, and the answers that test a client's
reading of HTTP/1.1: the differential test of the two transports (tests/test_transport_differential.py)
and the hostile server's byte-level behaviours (slobench.testing.hostile_server) play them.

`RawServer(answer, keepalive_s=...)` calls `answer(request)` for each request it reads (`Request`: the connection's number,
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

    def __init__(self, answer: Answer, host: str = "127.0.0.1", port: int = 0,
                 keepalive_s: float | None = None) -> None:
        self.answer = answer
        self.keepalive_s = keepalive_s  # a connection idle this long is closed (None: kept)
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
                try:
                    request = await asyncio.wait_for(_read_request(reader, conn, index), self.keepalive_s)
                except TimeoutError:
                    return  # idle past the keep-alive timeout (a request arriving now meets the close)
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
    events: list[dict[str, Any]] = [{"choices": [{"index": 0, "text": "tok ", "finish_reason": "length" if i == num_tokens - 1 else None}]}
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


# The hostile server's byte-level behaviours (slobench.testing.hostile_server, `--behaviour NAME`)
HOSTILE_BEHAVIOURS = {
    "close-after-500": "token-id prompts and every --every'th completion get a bare 500 with a length and no "
                       "Connection: close (an ASGI server's unhandled exception); the connection is then closed as "
                       "its next request comes, unanswered",
    "close-on-token-ids": "a token-id prompt is met with a close, no byte of an answer (a server whose "
                          "connection handler dies on one); text prompts are answered",
    "short-keepalive": "answers as the plain server does, and closes a connection idle for --keepalive seconds",
    "superscript-length": "a completion's Content-Length is '1' and a Latin-1 superscript two",
    "superscript-status": "a completion's status code holds a Latin-1 superscript two",
    "bare-lf-head": "a completion's head lines end in a bare LF (legal: RFC 9112 section 2.2)",
    "duplicate-length": "a whole completion's Content-Length is sent twice, the same value (legal)",
    "chunk-underscore": "a streamed completion's chunk size has an underscore in it (int(x, 16) takes it)",
    "no-content": "a completion is answered 204 No Content",
}


class HostileAnswers:
    """The answer of one byte-level `behaviour` (HOSTILE_BEHAVIOURS) to each completion request."""

    def __init__(self, behaviour: str, every: int = 10) -> None:
        if behaviour not in HOSTILE_BEHAVIOURS:
            raise ValueError(f"unknown byte-level behaviour {behaviour!r}; known: {sorted(HOSTILE_BEHAVIOURS)}")
        self.behaviour = behaviour
        self.every = every
        self.closing: set[int] = set()  # close-after-500: connections whose next request meets a close
        self.count = 0  # close-after-500: the completions answered

    def __call__(self, request: Request) -> Play | None:
        body = request.json()
        body = body if isinstance(body, dict) else {}
        n = body.get("max_tokens")
        n = n if type(n) is int and 0 < n < 100_000 else 1
        stream = bool(body.get("stream"))
        sse = sse_body(n)
        ok = framed(sse, content_type="text/event-stream", how="chunked") if stream else framed(completion_json(n))
        b = self.behaviour
        if b == "close-after-500":
            if request.conn in self.closing:
                return None
            self.count += 1  # the answered completions
            if isinstance(body.get("prompt"), list) or self.count % self.every == 0:
                self.closing.add(request.conn)
                return Play(error_500())
            return Play(ok)
        if b == "close-on-token-ids":
            return None if isinstance(body.get("prompt"), list) else Play(ok)
        if b == "short-keepalive":
            return Play(ok)
        if b == "bare-lf-head":
            head, _, rest = ok.partition(b"\r\n\r\n")
            return Play(head.replace(b"\r\n", b"\n") + b"\n\n" + rest)
        if b == "duplicate-length" and not stream:
            return Play(ok.replace(b"Content-Length:", b"Content-Length: %d\r\nContent-Length:"
                                   % len(completion_json(n)), 1))
        if b == "chunk-underscore" and stream:
            size = b"%x" % len(sse)
            return Play(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + size[:1] + b"_" + size[1:] + b"\r\n" + sse + b"\r\n0\r\n\r\n")
        if b == "superscript-length":
            return Play(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1\xb2\r\n\r\n{}")
        if b == "superscript-status":
            return Play(b"HTTP/1.1 2\xb200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        if b == "no-content":
            return Play(b"HTTP/1.1 204 No Content\r\n\r\n")
        return Play(ok)
