"""An OpenAI-compatible server that attacks its client, one behaviour at a time, to test slobench's bounds.

    python -m slobench.testing.hostile_server --port 0 --behaviour gzip-bomb-metrics [--size BYTES] [--log FILE]

It prints `LISTENING <port>` once bound. Without a behaviour it is a plain, instant server: /v1/models
lists `test-model`, a completion (or chat) answers `max_tokens` one-token chunks, the usage when asked and
`[DONE]` (or one JSON answer), and /metrics a few gauges. Each `--behaviour` (see BEHAVIOURS) replaces one
part of that with what a broken or hostile server does; a huge body is written a piece at a time, never
held whole. `--log FILE` appends one JSON line per request received: its method, path and headers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from slobench.testing.process import ServerProcess, listen_until_stopped, run_server, server_parser
from slobench.testing.raw_answers import HOSTILE_BEHAVIOURS, HostileAnswers, RawServer

BEHAVIOURS = {
    "huge-error": "a completion gets HTTP 400 whose JSON error body is --size bytes",
    "huge-answer": "a non-streamed completion's answer is --size bytes; a streamed one, one endless SSE line",
    "gzip-bomb-metrics": "/metrics is --size zero bytes gzipped (a few hundred KB on the wire)",
    "gzip-bomb-models": "/v1/models is --size zero bytes gzipped",
    "huge-metrics": "/metrics is --size bytes of valid Prometheus text",
    "slow-metrics": "/metrics never answers (until the client goes away)",
    "redirect": "every request gets 307 to --redirect-to (same path)",
    "found": "every completion gets 302 with no Location",
    "deep-json-models": "/v1/models is an array nested --depth levels deep",
    "deep-json-error": "a completion gets HTTP 400 whose error is nested --depth levels deep",
    "echo-key": "a completion of more than one token (not preflight's) gets HTTP 401 echoing every request "
                "header value, the token after Bearer, decoded Basic credentials and the URL's query",
    "done-hang": "a stream sends its tokens, finish, usage and [DONE], then keeps the body open",
    "finish-hang": "a stream sends its tokens, finish and usage (no [DONE]), then keeps the body open",
    "endless-stream": "a stream sends tokens without end, whatever max_tokens says",
    **HOSTILE_BEHAVIOURS,  # byte-level: served by a server that writes exact bytes (slobench.testing.raw_answers)
}
MODEL = "test-model"
_PIECE = 1 << 20  # bytes a write


class HostileServer:
    def __init__(self, behaviours: frozenset[str], *, size: int, depth: int, redirect_to: str,
                 log_path: Path | None) -> None:
        self.behaviours = behaviours
        self.size = size
        self.depth = depth
        self.redirect_to = redirect_to.rstrip("/")
        self.log_path = log_path
        self._bomb: bytes | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._first])
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completion)
        app.router.add_post("/v1/chat/completions", self.completion)
        app.router.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _first(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.log_path is not None:
            with open(self.log_path, "a") as fh:
                fh.write(json.dumps({"method": request.method, "path": request.path_qs,
                                     "headers": dict(request.headers)}) + "\n")
        if "redirect" in self.behaviours:
            raise web.HTTPTemporaryRedirect(self.redirect_to + request.path_qs)
        return await handler(request)  # type: ignore[no-any-return]

    def bomb(self) -> bytes:
        """`size` zero bytes, gzipped once (a 1000:1 ratio)."""
        if self._bomb is None:
            z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            zeros = bytes(_PIECE)
            parts = [z.compress(zeros) for _ in range(self.size // _PIECE)]
            self._bomb = b"".join([*parts, z.compress(bytes(self.size % _PIECE)), z.flush()])
        return self._bomb

    async def models(self, request: web.Request) -> web.StreamResponse:
        if "gzip-bomb-models" in self.behaviours:
            return web.Response(body=self.bomb(), headers={"Content-Encoding": "gzip",
                                                           "Content-Type": "application/json"})
        if "deep-json-models" in self.behaviours:
            return web.Response(text="[" * self.depth + "]" * self.depth, content_type="application/json")
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        if "gzip-bomb-metrics" in self.behaviours:
            return web.Response(body=self.bomb(), headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        if "slow-metrics" in self.behaviours:
            await _until_gone(request)
            return web.Response(status=204)
        if "huge-metrics" in self.behaviours:
            line = b'vllm:num_requests_running{model_name="test-model"} 1.0\n'
            resp = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
            await resp.prepare(request)
            await _write_size(resp, b"# TYPE vllm:num_requests_running gauge\n", line, self.size)
            await resp.write_eof()
            return resp
        return web.Response(text="# TYPE vllm:num_requests_running gauge\n"
                                 'vllm:num_requests_running{model_name="test-model"} 0.0\n',
                            content_type="text/plain")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        b = self.behaviours
        if "found" in b:
            return web.Response(status=302, text="moved")
        if "huge-error" in b:
            resp = web.StreamResponse(status=400, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await _write_size(resp, b'{"error": {"message": "', b"x" * 4096, self.size)
            await resp.write(b'"}}')
            await resp.write_eof()
            return resp
        if "deep-json-error" in b:
            return web.Response(status=400, text='{"error": ' + "[" * self.depth + "]" * self.depth + "}",
                                content_type="application/json")
        if "echo-key" in b and (body.get("max_tokens") or 1) > 1:
            echoed = " | ".join(f"{k}={v}" for k, v in request.headers.items())
            auth = request.headers.get("Authorization", "")
            bare = auth[7:] if auth.lower().startswith("bearer ") else ""
            return web.json_response({"error": {"message": f"bad key: {echoed} bearer={bare} query="
                                                           f"{request.query_string} decoded={_basic_decoded(request)}"}},
                                     status=401)
        stream = bool(body.get("stream"))
        if "huge-answer" in b:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if stream else "application/json"})
            await resp.prepare(request)
            head = b'data: {"choices": [{"text": "' if stream else b'{"choices": [{"text": "'
            await _write_size(resp, head, b"y" * 4096, self.size)
            await resp.write_eof()
            return resp
        if "endless-stream" in b and stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            block = _event({"choices": [{"index": 0, "text": "tok ", "finish_reason": None}]})
            try:
                while True:
                    await resp.write(block)
            except (ConnectionError, RuntimeError):
                return resp
        return await self._answer(request, body, stream)

    async def _answer(self, request: web.Request, body: dict[str, Any], stream: bool) -> web.StreamResponse:
        n = max(1, int(body.get("max_tokens") or 1))
        chat = request.path.endswith("/chat/completions")
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
        if not stream:
            choice = {"index": 0, "finish_reason": "length",
                      **({"message": {"role": "assistant", "content": "tok " * n}} if chat else {"text": "tok " * n})}
            return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            out = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
            await resp.write(_event({"choices": [{"index": 0, **out, "finish_reason": "length" if i == n - 1 else None}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(_event({"choices": [], "usage": usage}))
        if "finish-hang" not in self.behaviours:
            await resp.write(b"data: [DONE]\n\n")
        if self.behaviours & {"done-hang", "finish-hang"}:
            await _until_gone(request)
            return resp
        await resp.write_eof()
        return resp


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _basic_decoded(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        return base64.b64decode(auth[6:]).decode(errors="replace")
    return ""


async def _write_size(resp: web.StreamResponse, head: bytes, piece: bytes, size: int) -> None:
    """`head`, then `piece` repeated up to about `size` bytes in all, a MiB a write; a client that goes
    away ends it."""
    await resp.write(head)
    block = piece * max(1, _PIECE // len(piece))
    sent = len(head)
    try:
        while sent < size:
            await resp.write(block)
            sent += len(block)
    except (ConnectionError, RuntimeError):
        pass


async def _until_gone(request: web.Request) -> None:
    # aiohttp does not cancel a handler when the peer leaves: poll, a hung request costs nothing else
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)


class HostileServerProcess(ServerProcess):
    """`with HostileServerProcess("gzip-bomb-metrics", size=64 << 20) as srv: srv.base_url ...`."""

    name = "hostile server"

    def __init__(self, *behaviours: str, size: int = 80 << 20, depth: int = 100_000, redirect_to: str = "",
                 log: bool = False, every: int = 10, keepalive_s: float = 5.0) -> None:
        unknown = set(behaviours) - BEHAVIOURS.keys()
        if unknown:
            raise ValueError(f"unknown behaviour(s) {sorted(unknown)}; known: {sorted(BEHAVIOURS)}")
        if len(set(behaviours) & HOSTILE_BEHAVIOURS.keys()) > 1 or (
                set(behaviours) & HOSTILE_BEHAVIOURS.keys() and len(behaviours) > 1):
            raise ValueError(f"a byte-level behaviour ({sorted(HOSTILE_BEHAVIOURS)}) goes alone")
        args: list[str] = ["-m", "slobench.testing.hostile_server", "--port", "0", "--size", str(size),
                           "--depth", str(depth), "--every", str(every), "--keepalive", str(keepalive_s)]
        for b in behaviours:
            args += ["--behaviour", b]
        if redirect_to:
            args += ["--redirect-to", redirect_to]
        super().__init__(args, startup_timeout_s=15.0)
        self.model = MODEL
        self.log_path: Path | None = self.tmp_path / "requests.jsonl" if log else None
        if self.log_path is not None:
            self._args += ["--log", str(self.log_path)]

    def read_log(self) -> list[dict[str, Any]]:
        """The requests received so far (method, path, headers)."""
        if self.log_path is None or not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]


async def _main_async(args: argparse.Namespace) -> None:
    raw = [b for b in args.behaviour if b in HOSTILE_BEHAVIOURS]
    if raw:
        keepalive = args.keepalive if raw[0] == "short-keepalive" else None
        raw_server = RawServer(HostileAnswers(raw[0], args.every), args.host, args.port, keepalive_s=keepalive)
        await listen_until_stopped(await raw_server.start(), raw_server.stop)
        return
    server = HostileServer(frozenset(args.behaviour), size=args.size, depth=args.depth,
                           redirect_to=args.redirect_to, log_path=Path(args.log) if args.log else None)
    if {"gzip-bomb-metrics", "gzip-bomb-models"} & server.behaviours:
        server.bomb()  # made before the port is announced, not while a client waits
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    port = runner.addresses[0][1]
    await listen_until_stopped(port, runner.cleanup)


def main(argv: Sequence[str] | None = None) -> None:
    p = server_parser("slobench.testing.hostile_server", __doc__)
    p.add_argument("--behaviour", action="append", default=[], choices=sorted(BEHAVIOURS))
    p.add_argument("--size", type=int, default=80 << 20, help="bytes of a huge body or bomb (default 80 MiB)")
    p.add_argument("--depth", type=int, default=100_000, help="nesting of the deep JSON")
    p.add_argument("--redirect-to", default="http://127.0.0.1:9", help="where `redirect` points (a root URL)")
    p.add_argument("--log", default=None, help="append one JSON line per request received here")
    p.add_argument("--every", type=int, default=10, help="close-after-500: one completion in this many gets the 500")
    p.add_argument("--keepalive", type=float, default=5.0, help="short-keepalive: seconds a connection may idle")
    run_server(_main_async, p.parse_args(argv))


if __name__ == "__main__":
    main()
