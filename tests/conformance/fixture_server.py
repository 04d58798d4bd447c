"""Replay a recorded SSE response byte for byte: POST /v1/completions, /v1/chat/completions and
/v1/responses answer with the fixture's bytes, whatever the request said (with `status` and
`content_type` as recorded: a whole JSON answer, or an HTTP error, replays as it came).

The body is written one SSE event at a time (split after each blank line, `\\n\\n` or `\\r\\n\\r\\n`, the
separator kept), each flushed on its own, so a client sees events arrive separately as from a real
server; the bytes on the wire are the file's, unchanged. With `abort`, the connection is closed after
the last event instead of ending the chunked body cleanly. `GET /v1/models` lists `model` so a full
`slobench run` can be pointed at it too.

In a test: `async with FixtureServer(path) as srv: srv.base_url`. From a shell:
`python tests/conformance/fixture_server.py FILE.sse [--abort]` prints `LISTENING <port>` (for ServerProcess).
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from types import TracebackType
from typing import Self

from aiohttp import web

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def split_events(raw: bytes) -> list[bytes]:
    """The body cut after each blank line; joining the pieces gives `raw` back exactly."""
    pieces, start = [], 0
    for m in _EVENT_END.finditer(raw):
        pieces.append(raw[start : m.end()])
        start = m.end()
    if start < len(raw):
        pieces.append(raw[start:])
    return pieces


def make_app(raw: bytes, *, model: str = "fixture-model", abort: bool = False, status: int = 200,
             content_type: str = "text/event-stream") -> web.Application:
    events = split_events(raw)

    async def replay(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        await resp.prepare(request)
        for piece in events:
            await resp.write(piece)
        if abort and request.transport is not None:
            # as llama-cpp-python does when it interrupts a stream: the connection closes after the last
            # event, without the chunked body's terminating chunk
            request.transport.close()
            raise asyncio.CancelledError
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", replay)
    app.router.add_post("/v1/chat/completions", replay)
    app.router.add_post("/v1/responses", replay)
    app.router.add_get("/v1/models", models)
    return app


class FixtureServer:
    """An in-process aiohttp server on 127.0.0.1 and a free port, replaying one fixture."""

    def __init__(self, fixture: str | Path | bytes, *, model: str = "fixture-model", abort: bool = False,
                 status: int = 200, content_type: str = "text/event-stream") -> None:
        self.raw = fixture if isinstance(fixture, bytes) else Path(fixture).read_bytes()
        self.model = model
        self.abort = abort
        self.status = status
        self.content_type = content_type
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Self:
        self._runner = web.AppRunner(make_app(self.raw, model=self.model, abort=self.abort, status=self.status,
                                               content_type=self.content_type), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _main(path: str, abort: bool) -> None:
    async with FixtureServer(path, abort=abort) as srv:
        print(f"LISTENING {srv.port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--abort"]):
        sys.exit("usage: fixture_server.py FILE.sse [--abort]")
    asyncio.run(_main(sys.argv[1], abort=sys.argv[2:] == ["--abort"]))
