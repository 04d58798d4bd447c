"""The OpenAI-compatible HTTP server around an LLMEngine (FastAPI + uvicorn, as vLLM and SGLang).

The engine steps in its own thread; each request gets an asyncio.Queue that the engine feeds through
`loop.call_soon_threadsafe`. A request's KV blocks are freed the moment its client goes away: Starlette
cancels a streaming response on disconnect (we abort in a finally), but a plain handler is never cancelled
(NOTES bug 5), so non-streaming handlers race the result against the client's disconnect message.

    python -m reference_engine.server --executor modeled --port 0   # prints "LISTENING <port>" once bound
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import Counter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from reference_engine.builder import build_engine
from reference_engine.config import EngineSpec
from reference_engine.engine import ERROR_FINISH_REASON, LLMEngine, TokenEvent
from reference_engine.errors import ConfigError
from reference_engine.faults import Fault, FaultInjector, FaultSpec, parse_faults
from reference_engine.http_protocol import protocol_with, reset_connection
from reference_engine.metrics import CONTENT_TYPE, EngineMetrics
from reference_engine.openapi import CHAT_BODY, COMPLETION_BODY, generation_route
from reference_engine.protocol import (
    FAST_JSON_VALUES,
    SSE_DONE,
    BadRequest,
    GenerationRequest,
    ResponseShape,
    TextTokenizer,
    error_body,
    json_value_bound,
    json_values_limit,
    parse_chat,
    parse_completion,
    parse_json_body,
    sse,
)
from reference_engine.scheduler import RequestRejected
from reference_engine.serve_args import (  # noqa: F401  (add_serve_arguments: the name callers know)
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_BODY_BYTES,
    add_serve_arguments,
    engine_spec_from_args,
)
from reference_engine.step_log import StepLog
from reference_engine.tokenizer import ByteTokenizer

log = logging.getLogger(__name__)
# A body larger than this, or that may hold more than FAST_JSON_VALUES values, is parsed, validated and
# tokenized in a worker thread, one at a time: the event loop keeps answering (/health) meanwhile, and only
# one large body's objects exist at once.
INLINE_PARSE_BYTES = 256 << 10

def _error(status: int, message: str, type: str, param: str | None = None, code: str | int | None = None
           ) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


class _AbortingStreamingResponse(StreamingResponse):
    """Runs `on_close` however the response ends: finished, cancelled by a disconnect, or failed to send."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _ContextBoundTokenizer:
    """The byte tokenizer, refusing a text far too long for the context before it runs: it makes a token per
    UTF-8 byte, so at least one per character, and tokenizing (C, holding the GIL) takes ~30 ms a MiB. Up to
    `bound` characters the engine's own check refuses it after tokenizing, in its usual words."""

    def __init__(self, inner: ByteTokenizer, max_model_len: int) -> None:
        self.inner, self.max_model_len, self.bound = inner, max_model_len, max(max_model_len, 1 << 20)
        self.vocab_size, self.eos_token_id = inner.vocab_size, inner.eos_token_id

    def encode(self, text: str) -> list[int]:
        if len(text) > self.bound:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens. However, the "
                             f"prompt alone has at least {len(text)} tokens.", "prompt", "invalid_value")
        return self.inner.encode(text)


@dataclass(slots=True)
class _Live:
    """One in-flight request on the server side."""

    request_id: int
    queue: asyncio.Queue[TokenEvent]
    finished: bool = False


def build_app(
    engine: LLMEngine,
    model_name: str,
    tokenizer: TextTokenizer,
    api_key: str | None = None,
    *,
    on_ready: Callable[[], None] | None = None,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: FaultSpec | None = None,
) -> FastAPI:
    """The app; its lifespan starts the engine's thread (and stops it on shutdown). A request body may take
    `body_timeout_s` to arrive and hold `max_body_bytes` (else 408, 413)."""
    metrics = EngineMetrics(model_name, engine.stats)
    engine.observer = metrics
    max_model_len = engine.config.max_model_len
    if isinstance(tokenizer, ByteTokenizer):
        tokenizer = _ContextBoundTokenizer(tokenizer, max_model_len)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="slobench reference engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    injector = FaultInjector(faults) if faults is not None and faults.is_active else None
    injected = Counter("slobench_engine:faults_injected", "Faults injected (slobench serve --faults), by kind.",
                       ["kind"], registry=metrics.registry) if injector is not None else None

    # ---- errors, all in OpenAI's shape -----------------------------------------------------------------
    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return _error(400, f"invalid request: {first.get('msg', 'validation failed')}", "invalid_request_error",
                      param, "invalid_value")

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        # An ordinary event (a client gave up mid-body), not a server error: no traceback, nobody to answer.
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, str(exc.detail), kind, None, exc.status_code)

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise BadRequest("Incorrect API key provided.", None, "invalid_api_key", status=401)

    async def read_body(request: Request) -> bytearray:
        """The body, bounded in size (a huge one would be buffered whole) and in time (a slow one holds a task)."""
        too_big = BadRequest(f"the request body exceeds {_size(max_body_bytes)} (slobench serve --max-body-size)",
                             None, "body_too_large", status=413)
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > max_body_bytes:
            raise too_big  # before a byte of it is read (what follows is discarded within bounds: http_protocol)
        body = bytearray()
        async for chunk in request.stream():
            if len(body) + len(chunk) > max_body_bytes:  # chunked uploads declare no length
                raise too_big
            body += chunk
        return body  # json.loads reads a bytearray as it is: no copy

    parse_one_at_a_time = asyncio.Lock()
    max_json_values = json_values_limit(max_model_len)

    def parse_checked(raw: bytearray, parse: Callable[[Any], GenerationRequest]) -> GenerationRequest:
        req = parse(parse_json_body(raw, max_json_values))
        # Checked here too (validate reads only the config): a prompt too long is refused before add_request
        # copies it on the event loop.
        try:
            engine.scheduler.validate(len(req.prompt_token_ids), req.max_tokens, req.min_tokens)
        except RequestRejected as e:
            raise BadRequest(str(e), e.param, "invalid_value") from None
        return req

    async def parsed(request: Request, parse: Callable[[Any], GenerationRequest]) -> GenerationRequest:
        """The request its body describes: read within body_timeout_s, then parsed and validated, a large
        body in a worker thread (INLINE_PARSE_BYTES)."""
        try:
            raw = await asyncio.wait_for(read_body(request), body_timeout_s)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {body_timeout_s:g} s "
                             "(slobench serve --body-timeout)", None, "request_timeout", status=408) from None
        if len(raw) <= INLINE_PARSE_BYTES and json_value_bound(raw) <= FAST_JSON_VALUES:
            return parse_checked(raw, parse)
        async with parse_one_at_a_time:
            return await asyncio.to_thread(parse_checked, raw, parse)

    # ---- routes ----------------------------------------------------------------------------------------
    @app.get("/health", response_class=Response, responses={503: {"description": "the engine loop has stopped"}})
    async def health() -> Response:
        if engine.is_healthy():
            return Response(status_code=200)
        return _error(503, "the engine loop has stopped", "server_error", None, 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_auth(request)
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "slobench",
                "max_model_len": max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", **generation_route(COMPLETION_BODY))
    async def completions(request: Request) -> Response:
        check_auth(request)
        req = await parsed(request, lambda body: parse_completion(body, model_name, tokenizer, max_model_len))
        return await generate(request, req, is_chat=False, fault=injector.draw() if injector else None)

    @app.post("/v1/chat/completions", **generation_route(CHAT_BODY))
    async def chat_completions(request: Request) -> Response:
        check_auth(request)
        req = await parsed(request, lambda body: parse_chat(body, model_name, tokenizer, max_model_len))
        return await generate(request, req, is_chat=True, fault=injector.draw() if injector else None)

    # ---- the bridge to the engine ----------------------------------------------------------------------
    # ---- injected faults (FaultSpec: error, reset, stall, slow-headers) --------------------------------
    def strike(fault: Fault) -> None:
        assert injected is not None
        injected.labels(fault.kind).inc()

    async def faulty(chunks: AsyncIterator[str], fault: Fault, live: _Live, request: Request
                     ) -> AsyncIterator[str]:
        """The stream, reset or stalled after `fault.after_chunks` chunks; one that has already carried its
        finish_reason by then escapes (the client has its answer: a fault there would not be one)."""
        assert faults is not None
        num_chunks = 0
        async for chunk in chunks:
            yield chunk
            num_chunks += 1
            if num_chunks == fault.after_chunks and not live.finished:
                strike(fault)
                if fault.kind == "reset":
                    reset_connection(request.client)
                    return  # without a socket of ours (in-process tests) the stream just stops short
                await asyncio.sleep(faults.stall_s)

    async def generate(request: Request, req: GenerationRequest, *, is_chat: bool, fault: Fault | None = None
                       ) -> Response:
        if fault is not None and fault.kind == "error":
            strike(fault)
            return _error(500, "injected fault: internal server error (slobench serve --faults)", "server_error",
                          None, 500)
        if fault is not None and fault.kind == "slow-headers":
            assert faults is not None
            strike(fault)
            await asyncio.sleep(faults.slow_headers_s)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def on_token(ev: TokenEvent) -> None:  # engine thread
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        try:
            rid = engine.add_request(
                req.prompt_token_ids, req.max_tokens, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos,
                sampling=req.sampling, on_token=on_token, stop_check=req.stop_check(),
            )
        except RequestRejected as e:
            raise BadRequest(str(e), e.param, "invalid_value") from None
        except RuntimeError as e:
            return _error(503, str(e), "server_error", None, 503)
        live = _Live(rid, queue)
        shape = ResponseShape(f"{'chatcmpl' if is_chat else 'cmpl'}-{rid}", model_name, is_chat)

        def abort_unless_finished() -> None:
            if not live.finished:
                live.finished = True
                engine.abort(rid)

        if req.stream:
            chunks = stream(live, shape, req)
            if fault is not None and fault.kind in ("reset", "stall"):
                chunks = faulty(chunks, fault, live, request)
            return _AbortingStreamingResponse(chunks, abort_unless_finished)
        try:
            response = await whole(request, live, shape, req)
        finally:
            abort_unless_finished()
        if fault is not None and fault.kind in ("reset", "stall") and response.status_code == 200:
            assert faults is not None
            strike(fault)
            if fault.kind == "stall":
                await asyncio.sleep(faults.stall_s)
            elif reset_connection(request.client):
                return Response(status_code=499)  # the connection is gone; nobody reads this
            else:
                return _error(502, "injected fault: connection reset", "server_error", None, 502)
        return response

    async def stream(live: _Live, shape: ResponseShape, req: GenerationRequest) -> AsyncIterator[str]:
        text_out = req.output_text()
        num_tokens = 0
        cached: int | None = None
        if shape.is_chat:
            yield sse(shape.chunk(None, None, role=True))
        while not live.finished:
            events = [await live.queue.get()]
            while not live.queue.empty():  # tokens that arrived together go out in one write
                events.append(live.queue.get_nowait())
            out = []
            for ev in events:
                if ev.finish_reason == ERROR_FINISH_REASON:
                    live.finished = True
                    out.append(sse(error_body("the engine failed while generating", "server_error", None, 500)))
                    break
                text = ""
                cached = ev.num_cached_tokens if ev.num_cached_tokens is not None else cached
                if ev.token_id is not None:
                    num_tokens += 1
                    text = text_out.push(ev.token_id)
                if ev.finish_reason is not None:
                    live.finished = True
                    text += text_out.flush()
                if text or ev.finish_reason is not None:
                    out.append(sse(shape.chunk(text, ev.finish_reason)))
                if live.finished:
                    break
            yield "".join(out)
        if req.include_usage:
            yield sse(shape.usage_chunk(len(req.prompt_token_ids), num_tokens, cached))
        yield SSE_DONE

    async def whole(request: Request, live: _Live, shape: ResponseShape, req: GenerationRequest) -> Response:
        collect = asyncio.ensure_future(_collect(live))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((collect, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():
                collect.cancel()
        if not collect.done() or collect.cancelled():
            return Response(status_code=499)  # client closed request; nobody will read this
        token_ids, reason, cached = collect.result()
        if reason == ERROR_FINISH_REASON:
            return _error(500, "the engine failed while generating", "server_error", None, 500)
        text_out = req.output_text()
        text = "".join(text_out.push(t) for t in token_ids) + text_out.flush()
        return JSONResponse(shape.whole(text, reason, len(req.prompt_token_ids), len(token_ids), cached))

    async def _collect(live: _Live) -> tuple[list[int], str | None, int | None]:
        tokens: list[int] = []
        while True:
            ev = await live.queue.get()
            if ev.token_id is not None:
                tokens.append(ev.token_id)
            if ev.finish_reason is not None:
                live.finished = True
                return tokens, ev.finish_reason, ev.num_cached_tokens

    return app


def _size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes} bytes"


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body is read already, so `receive` only waits for that."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---- building and serving ------------------------------------------------------------------------------
def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket whose accepted connections send each write at once (TCP_NODELAY).

    The protocol must be named: asyncio sets TCP_NODELAY on accepted connections only for sockets whose
    `proto` is IPPROTO_TCP, and `socket.socket(family, SOCK_STREAM)` leaves it 0. Without it, Nagle's
    algorithm meets the client's delayed ACK on a reused connection and every streamed chunk of a request
    is held back to ~40 ms, arriving in one read. Linux also copies TCP_NODELAY from the
    listening socket to the accepted ones, so it is set here too.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError("--port", port, f"cannot listen on {host}:{port} ({e.strerror or e}); "
                                          "another process holds it: choose another port, or 0 for a free one") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    spec: EngineSpec,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    served_model_name: str | None = None,
    log_level: str = "warning",
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: FaultSpec | None = None,
    step_log: str | None = None,
) -> None:
    """Build the engine `spec` describes, bind (port 0 picks a free one), print `LISTENING <port>` once ready,
    serve. `step_log`: a path to write the engine's step log to (reference_engine.step_log)."""
    import uvicorn

    engine, tokenizer = build_engine(spec)
    if step_log is not None:
        engine.step_log = StepLog(step_log, clock_now_s=engine.clock.now_s(),
                                  header={"model": spec.model, "executor": spec.executor})
    name = served_model_name or spec.model
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]

    def ready() -> None:
        print(f"LISTENING {bound_port}", flush=True)

    app = build_app(engine, name, tokenizer, api_key, on_ready=ready, body_timeout_s=body_timeout_s,
                    max_body_bytes=max_body_bytes, faults=faults)
    # Idle and slow connections are closed: a head must arrive within header_timeout_s, a body within
    # body_timeout_s (and hold at most max_body_bytes), and an idle keep-alive connection lasts keep_alive_s
    # (slow-loris).
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5,
                            http=protocol_with(header_timeout_s), timeout_keep_alive=keep_alive_s)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if engine.step_log is not None:
            engine.step_log.close()


def faults_from_args(args: argparse.Namespace) -> FaultSpec | None:
    """The --faults spec, or exit 2 with one line naming what is wrong (before the engine is built)."""
    if args.faults is None:
        return None
    try:
        return parse_faults(args.faults, stall_s=args.fault_stall_s, slow_headers_s=args.fault_delay_s,
                            seed=args.seed if args.fault_seed is None else args.fault_seed)
    except ValueError as e:
        print(f"slobench serve: --faults: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def serve_from_args(args: argparse.Namespace) -> None:
    faults = faults_from_args(args)
    serve(
        engine_spec_from_args(args), args.host, args.port, api_key=args.api_key,
        served_model_name=args.served_model_name, log_level=args.log_level, header_timeout_s=args.header_timeout,
        keep_alive_s=args.keep_alive, body_timeout_s=args.body_timeout, max_body_bytes=args.max_body_size,
        faults=faults,
        step_log=args.step_log,
    )


def main(argv: SequenceABC[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_engine.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        serve_from_args(args)
    except ConfigError as e:
        parser.error(str(e))  # one line naming the flag, exit 2 (as `slobench serve` says it)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
