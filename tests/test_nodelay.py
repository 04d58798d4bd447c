"""Issue 19: streamed tokens must leave a server when they are made, and every client socket is TCP_NODELAY.

The servers are checked on one reused keep-alive connection, the case Nagle's algorithm spoils: on it the
first request's chunks used to arrive one by one and every later request's all at once, ~40 ms late
(Nagle waiting for the client's delayed ACK). The client is checked by an in-process server that looks up
the client's end of each accepted connection among this process's sockets and reads its TCP_NODELAY.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.scrape import MetricsScraper
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess
from slobench.testing.process import EngineServerProcess


def _stream_on_one_connection(port: int, model: str, requests: int, max_tokens: int) -> list[list[tuple[float, int]]]:
    """Send `requests` streamed completions one after another on one TCP connection (with TCP_NODELAY on the
    client side, so only the server can delay); per request, the (ms since send, data events) of each read."""
    out: list[list[tuple[float, int]]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(requests):
            body = json.dumps(
                {"model": model, "prompt": f"request {i}", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
            ).encode()
            head = f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            t0 = time.perf_counter()
            s.sendall(head.encode() + body)
            buf = b""
            reads: list[tuple[float, int]] = []
            while not buf.endswith(b"0\r\n\r\n"):  # the chunked body's terminator
                piece = s.recv(65536)
                assert piece, "the server closed a keep-alive connection"
                buf += piece
                reads.append(((time.perf_counter() - t0) * 1000, piece.count(b"data: {")))
            out.append(reads)
    return out


def _assert_paced(per_request: list[list[tuple[float, int]]], max_tokens: int) -> None:
    for i, reads in enumerate(per_request[1:], start=2):  # requests 2..n reuse the connection
        token_reads = [r for r in reads if r[1]]
        assert sum(n for _, n in token_reads) >= max_tokens, reads
        # at the step pace most tokens come in reads of their own; with Nagle they came in one or two
        assert len(token_reads) >= max_tokens // 2, f"request {i}: tokens bunched into {len(token_reads)} reads: {reads}"


def test_engine_server_streams_at_step_pace_on_a_reused_connection() -> None:
    with EngineServerProcess("--executor", "modeled", "--model", "tiny") as srv:
        per_request = _stream_on_one_connection(srv.port, "tiny", requests=4, max_tokens=16)
    _assert_paced(per_request, 16)


def test_token_server_streams_at_its_schedule_on_a_reused_connection() -> None:
    with TokenServerProcess(ttft_ms=5.0, itl_ms=3.0) as srv:
        per_request = _stream_on_one_connection(srv.port, srv.model, requests=4, max_tokens=16)
    _assert_paced(per_request, 16)
    # and on time: the first token at TTFT (5 ms), not at a delayed ACK (40 ms)
    for reads in per_request[1:]:
        first = next(t for t, n in reads if n)
        assert first < 30.0, reads


# ---- the client: every connection slobench opens ---------------------------------------------------------


def _nodelay_of_local_port(port: int) -> int | None:
    """TCP_NODELAY of this process's socket bound to 127.0.0.1:`port`, found among its open descriptors."""
    for fd_name in os.listdir("/proc/self/fd"):
        fd = int(fd_name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET and s.getsockname()[1] == port:
                return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        except OSError:
            pass
        finally:
            s.close()
    return None


class _Observer:
    """An in-process OpenAI-ish server recording the client-side TCP_NODELAY of every connection it serves."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], int | None] = {}  # (path, client port) -> TCP_NODELAY

    def _note(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        assert peer is not None
        self.seen[(request.path, peer[1])] = _nodelay_of_local_port(peer[1])

    async def models(self, request: web.Request) -> web.Response:
        self._note(request)
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        self._note(request)
        return web.Response(text="vllm:num_requests_running 1\n")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._note(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n')
        await resp.write(b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        return app


@pytest.fixture
async def observer() -> AsyncIterator[tuple[_Observer, str]]:
    obs = _Observer()
    runner = web.AppRunner(obs.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield obs, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("transport", ["raw", "httpx"])
async def test_every_client_connection_has_tcp_nodelay(
    observer: tuple[_Observer, str], transport: str, tmp_path: Path
) -> None:
    obs, url = observer
    target = OpenAITarget(url, TargetOptions(model="m", transport=transport))  # type: ignore[arg-type]
    await target.preflight()
    async with target:
        rec = RequestRecord(0, 0.0)
        await target.send(RequestSpec(request_id=0, arrival_s=0.0, prompt="hi", input_tokens=1, max_tokens=2), rec)
        assert rec.status == "ok", rec.error
    scraper = MetricsScraper(url.removesuffix("/v1") + "/metrics", tmp_path / "m.jsonl", interval_s=0.05)
    task = asyncio.create_task(scraper(target.clock))
    while scraper.num_scrapes < 1 and not task.done():
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    paths = {path for path, _ in obs.seen}
    assert {"/v1/models", "/v1/completions", "/metrics"} <= paths, obs.seen
    assert all(v == 1 for v in obs.seen.values()), obs.seen
