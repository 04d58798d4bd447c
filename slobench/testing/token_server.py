"""A small, fast OpenAI-compatible server that emits tokens on a known schedule, with faults on request.

    python -m slobench.testing.token_server --host 127.0.0.1 --port 0 --ttft-ms 50 --itl-ms 5 [--log FILE]

It prints `LISTENING <port>` once bound. Every request gets `max_tokens` content chunks of one token (QUIRKS
change that): the first at receive + TTFT, then one every ITL, each slept to its absolute deadline; a
stream ends with a usage chunk (when asked) and `[DONE]`, a chat stream opens with an empty role chunk. Per-request knobs in the
body: `x_fault` (one of FAULTS), `x_ttft_ms`/`x_itl_ms`, `x_request_id` (echoed into the log). `--log FILE`
appends one JSON line per request with `recv_s` and each `chunk_s` on `time.perf_counter()` (the machine's
one monotonic clock, which a client in another process can subtract directly), written before the stream's
`[DONE]`. `/metrics` serves a few gauges and counters under vLLM's names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from slobench.testing.process import listen_until_stopped, run_server, server_parser
from slobench.testing.prompt_count import prompt_tokens

FAULTS = frozenset(
    {
        "status_500",  # HTTP 500 with an OpenAI-style error body
        "status_429",  # HTTP 429 with Retry-After
        "echo_auth",  # HTTP 401 whose message echoes the Authorization header (leak test)
        "reset_after_3",  # 3 tokens, then a TCP reset
        "malformed_json",  # 2 tokens, then an event whose data is not JSON, then the rest
        "non_utf8",  # 2 tokens, then an event with bytes that are not UTF-8, then the rest
        "no_done",  # everything but the final `data: [DONE]`
        "error_event",  # 2 tokens, then `data: {"error": {...}}` and [DONE]
        "hang",  # accept the request, never answer (until the client goes away)
        "hang_after_3",  # 3 tokens, then silence
    }
)
# Whole-server behaviours of real third-party servers (`--quirk NAME`, repeatable): each is something a
# popular OpenAI-compatible server does with its defaults.
QUIRKS = frozenset(
    {
        "models-500",  # GET /v1/models answers 500 (seen on a real server's start)
        "models-empty",  # GET /v1/models lists nothing: {"object":"list","data":[]}
        "strict-fields",  # unknown request fields are refused: HTTP 422 "Unexpected fields in the request"
        "text-prompts-only",  # a token-id prompt gets 500 and a validation message (llama-cpp-python)
        "no-done",  # streams end after the finish chunk (and usage) without `data: [DONE]` (TGI, Ollama)
        "no-usage",  # streams never carry usage, whatever stream_options asks (llama.cpp)
        "eos-early",  # ignore_eos is taken and ignored: the model stops at half max_tokens unless min_tokens
        "interrupt",  # streams stop half-way with `data: [DONE]` and no finish_reason (llama.cpp interrupted)
        "refuse-all",  # every completion request is refused with 400
        "no-metrics",  # no /metrics endpoint (404), as llama-cpp-python and most hosted APIs
        "flaky-start",  # the first two generation requests answer 503 (a server still warming up)
        # vLLM: a token that splits a UTF-8 character, or a skipped special token, streams with empty text
        "empty-text",  # the first token's chunk and every third after it carry empty text
        "all-empty-text",  # every token's chunk carries empty text (usage still counts them)
        "two-per-event",  # each event carries two tokens' text (a server batching its stream)
        # ignore_eos, min_tokens and stream_options are taken and dropped: no usage in streams, and the model
        # stops at half max_tokens with finish_reason "stop"; /models names no known server
        "drop-extensions",
        # ids >= the vocabulary's size (SMALL_VOCAB, or --vocab) are out of vocabulary: 400, or an error event
        # in a 200 stream (vLLM)
        "small-vocab",
        "ids-500",  # a token-id prompt gets a bare HTTP 500 with no message (a proxy in front of a text server)
        "max-model-len",  # /v1/models lists max_model_len (MAX_MODEL_LEN, or --max-model-len); a longer request gets vLLM's 400
        # prompts counted as a real server counts them: subword words, a BOS token, a chat template with a
        # system preamble and role markers (slobench.testing.prompt_count)
        "real-tokenizer",
        "slow-first",  # the first generation request answers after SLOW_FIRST_S (Ollama loading a model)
    }
)
SMALL_VOCAB = 2048
MAX_MODEL_LEN = 64
SLOW_FIRST_S = 1.5
# The request fields a strict server knows (OpenAI's), plus the test knobs x_*.
_STRICT_FIELDS = frozenset({"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
                            "top_p", "stream", "stream_options", "seed", "stop", "n", "user"})
_FAULT_AT = 2  # token index at which mid-stream faults strike
_RESET_AT = 3


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str = "test-model"
    ttft_ms: float = 50.0
    itl_ms: float = 5.0
    serve_models: bool = True  # False: /v1/models answers 404, like servers without it
    log_path: Path | None = None
    quirks: frozenset[str] = frozenset()
    vocab_size: int = SMALL_VOCAB  # the vocabulary's size with the small-vocab quirk
    max_model_len: int = MAX_MODEL_LEN  # the context with the max-model-len quirk
    # Reasoning mode: a chat answer's first `reasoning_tokens` tokens (or a request's `x_reasoning_tokens`)
    # are reasoning, streamed in `reasoning_field` deltas and counted in usage's completion_tokens_details;
    # the answer's first token is token `reasoning_tokens` of the schedule (all reasoning: no answer).
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"  # vLLM's and SGLang's; vLLM's newer name is "reasoning"

    def __post_init__(self) -> None:
        if self.ttft_ms < 0:
            raise ValueError(f"ttft_ms must be >= 0 (got {self.ttft_ms!r})")
        if self.itl_ms < 0:
            raise ValueError(f"itl_ms must be >= 0 (got {self.itl_ms!r})")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (got {self.max_model_len!r})")
        if self.reasoning_tokens < 0:
            raise ValueError(f"reasoning_tokens must be >= 0 (got {self.reasoning_tokens!r})")
        if self.reasoning_field not in ("reasoning_content", "reasoning"):
            raise ValueError(f"reasoning_field must be reasoning_content or reasoning (got {self.reasoning_field!r})")
        if unknown := set(self.quirks) - QUIRKS:
            raise ValueError(f"unknown quirks {sorted(unknown)}; known: {sorted(QUIRKS)}")


@dataclass(slots=True)
class _Stats:
    num_running: int = 0
    num_requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    log: IO[str] | None = None


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=_error_body(status, message, kind),
        content_type="application/json",
        headers=headers,
    )


async def _json_body(request: web.Request, model: str) -> dict[str, Any] | web.Response:
    """A generation request's JSON object, or the error answer to it (bad JSON, another model)."""
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise ValueError("body is not a JSON object")
    except ValueError as e:
        return _error(400, f"bad JSON body: {e}", "BadRequestError")
    if body.get("model") != model:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    return body


class TokenServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._stats = _Stats()
        self._model_json = json.dumps(config.model)
        self._answered_first = False  # "slow-first": the first generation request is slow

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.on_startup.append(self._open_log)
        app.on_cleanup.append(self._close_log)
        return app

    async def _open_log(self, _app: web.Application) -> None:
        if self.config.log_path is not None:
            self._stats.log = open(self.config.log_path, "a")

    async def _close_log(self, _app: web.Application) -> None:
        if self._stats.log is not None:
            self._stats.log.close()
            self._stats.log = None

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        if not self.config.serve_models:
            return _error(404, "Not Found", "NotFoundError")
        if "models-500" in self.config.quirks:
            return _error(500, "Internal Server Error", "InternalServerError")
        owner = ("llamacpp" if "eos-early" in self.config.quirks else
                 "organization-owner" if "drop-extensions" in self.config.quirks else "slobench")
        entry: dict[str, Any] = {"id": self.config.model, "object": "model", "owned_by": owner}
        if "max-model-len" in self.config.quirks:
            entry["max_model_len"] = self.config.max_model_len
        listed = [] if "models-empty" in self.config.quirks else [entry]
        body = {"object": "list", "data": listed}
        return web.json_response(body)

    async def _metrics(self, _request: web.Request) -> web.Response:
        if "no-metrics" in self.config.quirks:
            return _error(404, "Not Found", "NotFoundError")
        s = self._stats
        m = self.config.model
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{m}"}} {s.num_running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{m}"}} 0\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="{m}"}} {s.prompt_tokens}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{m}"}} {s.generation_tokens}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=True)

    async def _generate(self, request: web.Request, is_chat: bool) -> web.StreamResponse:
        recv_s = time.perf_counter()
        body = await _json_body(request, self.config.model)
        if isinstance(body, web.Response):
            return body
        quirks = self.config.quirks
        if "flaky-start" in quirks and self._stats.num_requests < 2:
            self._stats.num_requests += 1
            return _error(503, "warming up", "ServiceUnavailableError")
        if "refuse-all" in quirks:
            return _error(400, "this server refuses every request", "BadRequestError")
        if "strict-fields" in quirks:
            extra = {k for k in body if k not in _STRICT_FIELDS and not k.startswith("x_")}
            if extra:
                return _error(422, f"Unexpected fields in the request: {extra}", "BadRequestError")
        is_ids = not is_chat and isinstance(body.get("prompt"), list)
        if "text-prompts-only" in quirks and is_ids:
            return _error(500, "1 validation error: prompt must be a string", "InternalServerError")
        if "ids-500" in quirks and is_ids:
            return web.Response(status=500, text="Internal Server Error")
        if "slow-first" in quirks and not self._answered_first:
            self._answered_first = True
            await asyncio.sleep(SLOW_FIRST_S)
        if "small-vocab" in quirks and is_ids and (bad := next((t for t in body["prompt"] if t >= self.config.vocab_size), None)):
            message = f"Token id {bad} is out of vocabulary"
            if not body.get("stream"):
                return _error(400, message, "BadRequestError")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + _error_body(400, message, "BadRequestError") + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if "max-model-len" in quirks:
            asked = body.get("max_tokens", 16)
            wanted = prompt_tokens(body, is_chat, real="real-tokenizer" in quirks) + (asked if isinstance(asked, int) else 0)
            if wanted > self.config.max_model_len:
                return _error(400, f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                                   f"requested {wanted} tokens. Please reduce the length of the messages or completion.",
                              "BadRequestError")
        fault = body.get("x_fault")
        if fault is not None and fault not in FAULTS:
            return _error(400, f"unknown x_fault {fault!r}; known: {sorted(FAULTS)}", "BadRequestError")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(
                400, f"max_tokens must be a positive integer (got {max_tokens!r})", "BadRequestError"
            )
        if fault == "status_500":
            return _error(500, "injected internal error", "InternalServerError")
        if fault == "status_429":
            return _error(429, "injected rate limit", "RateLimitError", {"Retry-After": "1"})
        if fault == "echo_auth":
            auth = request.headers.get("Authorization", "")
            return _error(401, f"invalid credentials: {auth}", "AuthenticationError")

        stats = self._stats
        stats.num_running += 1
        stats.num_requests += 1
        request_id = body.get("x_request_id", stats.num_requests)
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        peer_port = peer[1] if peer else None
        num_prompt = prompt_tokens(body, is_chat, real="real-tokenizer" in quirks)
        stats.prompt_tokens += num_prompt
        chunk_s: list[float] = []
        logged = False

        def write_log() -> None:
            # Once per request. A stream logs before its usage chunk and [DONE], so the line is on disk
            # before the client can see the response end (a test reads the log as soon as it has).
            nonlocal logged
            if stats.log is None or logged:
                return
            logged = True
            line = {
                "id": request_id,
                "path": request.path,
                "peer_port": peer_port,  # one value over many requests: the client reuses its connection
                "recv_s": recv_s,
                "chunk_s": chunk_s,
                "fault": fault,
                "max_tokens": max_tokens,
                "prompt_tokens": num_prompt,
            }
            stats.log.write(json.dumps(line) + "\n")
            stats.log.flush()

        try:
            if fault == "hang":
                await _wait_for_disconnect(request)
                return web.Response(status=204)
            ttft_s = float(body.get("x_ttft_ms", self.config.ttft_ms)) * 1e-3
            itl_s = float(body.get("x_itl_ms", self.config.itl_ms)) * 1e-3
            if "eos-early" in quirks:  # ignore_eos is ignored; min_tokens is honoured
                min_tokens = body.get("min_tokens")
                floor = min_tokens if isinstance(min_tokens, int) and min_tokens > 0 else 1
                max_tokens = min(max_tokens, max(floor, max_tokens // 2))
            elif "drop-extensions" in quirks:
                max_tokens = max(1, max_tokens // 2)
            usage: dict[str, Any] = {
                "prompt_tokens": num_prompt,
                "completion_tokens": max_tokens,
                "total_tokens": num_prompt + max_tokens,
            }
            asked_reasoning = body.get("x_reasoning_tokens", self.config.reasoning_tokens)
            if not isinstance(asked_reasoning, int) or asked_reasoning < 0:
                return _error(400, f"x_reasoning_tokens must be an integer >= 0 (got {asked_reasoning!r})",
                              "BadRequestError")
            num_reasoning = min(asked_reasoning, max_tokens) if is_chat else 0
            if num_reasoning:
                usage["completion_tokens_details"] = {"reasoning_tokens": num_reasoning}
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                include_usage = include_usage and "no-usage" not in quirks and "drop-extensions" not in quirks
                return await self._stream(
                    request, is_chat, fault, recv_s, ttft_s, itl_s, max_tokens, usage, include_usage, chunk_s,
                    write_log, num_reasoning,
                )
            await _sleep_until(recv_s + ttft_s + (max_tokens - 1) * itl_s)
            chunk_s.append(time.perf_counter())  # the one write carries every token
            stats.generation_tokens += max_tokens - 1
            if fault == "malformed_json":
                return web.Response(body=b'{"choices": [', content_type="application/json")
            return web.json_response(self._full_response(is_chat, max_tokens, usage, num_reasoning))
        finally:
            stats.num_running -= 1
            stats.generation_tokens += len(chunk_s)
            write_log()

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API on the same schedule (token i at received + TTFT + i * ITL; the first
        `x_reasoning_tokens` reasoning): `response.*` events, or one response object. Faults: "error_event"
        (a `response.failed` event after 2 tokens), "no_done" (no `response.completed`)."""
        recv_s = time.perf_counter()
        body = await _json_body(request, self.config.model)
        if isinstance(body, web.Response):
            return body
        n = body.get("max_output_tokens", 16)
        k = body.get("x_reasoning_tokens", self.config.reasoning_tokens)
        if not isinstance(n, int) or n < 1 or not isinstance(k, int) or k < 0:
            return _error(400, f"max_output_tokens must be >= 1 and x_reasoning_tokens >= 0 (got {n!r}, {k!r})",
                          "BadRequestError")
        k = min(k, n)
        fault = body.get("x_fault")
        ttft_s = float(body.get("x_ttft_ms", self.config.ttft_ms)) * 1e-3
        itl_s = float(body.get("x_itl_ms", self.config.itl_ms)) * 1e-3
        num_prompt = len(str(body.get("input", "")).split())
        usage = {"input_tokens": num_prompt, "output_tokens": n, "total_tokens": num_prompt + n,
                 "output_tokens_details": {"reasoning_tokens": k}}
        done = {"id": "resp-0", "object": "response", "model": self.config.model, "status": "completed",
                "error": None, "usage": usage,
                "output": [*([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": " tok" * k}]}]
                             if k else []),
                           {"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": " tok" * (n - k)}]}]}
        self._stats.num_requests += 1
        if not body.get("stream"):
            await _sleep_until(recv_s + ttft_s + (n - 1) * itl_s)
            return web.json_response(done)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def event(kind: str, **fields: Any) -> bytes:
            return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **fields}).encode() + b"\n\n"

        await resp.write(event("response.created", response={**done, "status": "in_progress", "output": []}))
        for i in range(n):
            await _sleep_until(recv_s + ttft_s + i * itl_s)
            if fault == "error_event" and i == _FAULT_AT:
                failed = {**done, "status": "failed", "error": {"code": "server_error", "message": "injected failure"}}
                await resp.write(event("response.failed", response=failed))
                await resp.write_eof()
                return resp
            kind = "response.reasoning_text.delta" if i < k else "response.output_text.delta"
            await resp.write(event(kind, delta=" tok", output_index=0 if i < k else int(k > 0)))
        if fault != "no_done":
            await resp.write(event("response.completed", response=done))
        await resp.write_eof()
        return resp

    def _full_response(self, is_chat: bool, max_tokens: int, usage: dict[str, Any],
                       num_reasoning: int = 0) -> dict[str, Any]:
        text = " tok" * max_tokens
        if is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": " tok" * (max_tokens - num_reasoning) or None}
            if num_reasoning:
                message[self.config.reasoning_field] = " tok" * num_reasoning
            choice: dict[str, Any] = {"index": 0, "message": message}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
            obj = "text_completion"
        choice["finish_reason"] = "length"
        return {
            "id": "cmpl-0",
            "object": obj,
            "created": 0,
            "model": self.config.model,
            "choices": [choice],
            "usage": usage,
        }

    async def _stream(
        self,
        request: web.Request,
        is_chat: bool,
        fault: str | None,
        recv_s: float,
        ttft_s: float,
        itl_s: float,
        max_tokens: int,
        usage: dict[str, Any],
        include_usage: bool,
        chunk_s: list[float],
        write_log: Callable[[], None],
        num_reasoning: int = 0,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head, tail = self._chunk_frame(is_chat)
        if is_chat:
            await resp.write(head + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n')
        quirks = self.config.quirks
        answer = b'"delta":{"content":"%s"}' if is_chat else b'"text":"%s","logprobs":null'
        thought = b'"delta":{"' + self.config.reasoning_field.encode() + b'":"%s"}'
        end = b'"stop"' if "eos-early" in quirks or "drop-extensions" in quirks else b'"length"'
        frames: dict[tuple[bytes, bool, bool], bytes] = {}

        def frame(text: bytes, is_last: bool, is_reasoning: bool = False) -> bytes:
            got = frames.get((text, is_last, is_reasoning))
            if got is None:
                got = frames[text, is_last, is_reasoning] = head + (thought if is_reasoning else answer) % text + (
                    b',"finish_reason":' + (end if is_last else b"null") + tail)
            return got

        write = resp.write
        perf = time.perf_counter
        step = 2 if "two-per-event" in quirks else 1
        for i in range(0, max_tokens, step):
            await _sleep_until(recv_s + ttft_s + i * itl_s)
            if fault is not None and await self._mid_stream_fault(request, resp, fault, i):
                return resp
            if "interrupt" in quirks and i == max(1, max_tokens // 2):
                await write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            is_empty = "all-empty-text" in quirks or ("empty-text" in quirks and i % 3 == 0)
            await write(frame(b"" if is_empty else b" tok" * min(step, max_tokens - i), i + step >= max_tokens,
                              i < num_reasoning))
            chunk_s.append(perf())
        write_log()
        if include_usage:
            obj = "chat.completion.chunk" if is_chat else "text_completion"
            u = {
                "id": "cmpl-0",
                "object": obj,
                "created": 0,
                "model": self.config.model,
                "choices": [],
                "usage": usage,
            }
            await write(b"data: " + json.dumps(u).encode() + b"\n\n")
        if fault != "no_done" and "no-done" not in quirks:
            await write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _mid_stream_fault(
        self, request: web.Request, resp: web.StreamResponse, fault: str, i: int
    ) -> bool:
        """Apply `fault` before token `i`; True if the response is over."""
        if fault == "reset_after_3" and i == _RESET_AT:
            _reset(request)
            return True
        if fault == "hang_after_3" and i == _RESET_AT:
            await _wait_for_disconnect(request)
            return True
        if i != _FAULT_AT:
            return False
        if fault == "malformed_json":
            await resp.write(b'data: {"choices": [{"text": "oops"\n\n')
        elif fault == "non_utf8":
            await resp.write(b'data: {"choices": [{"text": "\xff\xfe"}]}\n\n')
        elif fault == "error_event":
            await resp.write(
                b"data: " + _error_body(500, "injected mid-stream failure", "InternalServerError") + b"\n\n"
            )
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return True
        return False

    def _chunk_frame(self, is_chat: bool) -> tuple[bytes, bytes]:
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        head = (
            f'data: {{"id":"cmpl-0","object":"{obj}","created":0,"model":{self._model_json},'
            '"choices":[{"index":0,'
        ).encode()
        return head, b"}]}\n\n"


async def _sleep_until(deadline_s: float) -> None:
    delay = deadline_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _wait_for_disconnect(request: web.Request) -> None:
    # aiohttp does not cancel handlers when the peer leaves, so poll; a hung request costs nothing else.
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)


def _reset(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed server or a proxy would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start serving in the running loop; returns the runner (call `cleanup()` to stop) and the bound port."""
    # A short shutdown grace: hung test requests must not hold a stopping server for a minute.
    runner = web.AppRunner(
        TokenServer(config).app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
    )
    await runner.setup()
    # IPPROTO_TCP named, and TCP_NODELAY on the listener (inherited on accept): without them Nagle's
    # algorithm holds every chunk after the first on a reused connection back ~40 ms.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()
    return runner, sock.getsockname()[1]


async def _main_async(args: argparse.Namespace) -> None:
    config = ServerConfig(
        model=args.model,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        serve_models=not args.no_models,
        log_path=Path(args.log) if args.log else None,
        quirks=frozenset(args.quirk),
        vocab_size=args.vocab,
        max_model_len=args.max_model_len,
        reasoning_tokens=args.reasoning_tokens,
        reasoning_field=args.reasoning_field,
    )
    runner, port = await serve(config, args.host, args.port)
    await listen_until_stopped(port, runner.cleanup)


def main(argv: list[str] | None = None) -> None:
    p = server_parser("slobench.testing.token_server", __doc__)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--model", default="test-model")
    p.add_argument("--no-models", action="store_true", help="answer 404 on /v1/models")
    p.add_argument("--quirk", action="append", default=[], choices=sorted(QUIRKS),
                   help="behave like a real third-party server in this way (repeatable)")
    p.add_argument("--vocab", type=int, default=SMALL_VOCAB,
                   help=f"with --quirk small-vocab, ids from this one up are out of vocabulary (default {SMALL_VOCAB})")
    p.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN,
                   help=f"with --quirk max-model-len, the context /v1/models lists and requests are held to (default {MAX_MODEL_LEN})")
    p.add_argument("--reasoning-tokens", type=int, default=0,
                   help="a chat answer's first N tokens are reasoning (reasoning deltas); default 0")
    p.add_argument("--reasoning-field", default="reasoning_content", choices=("reasoning_content", "reasoning"),
                   help="the delta field reasoning streams in (vLLM's and SGLang's, or vLLM's newer name)")
    p.add_argument("--log", default=None, help="append per-request JSON lines (perf_counter times) here")
    run_server(_main_async, p.parse_args(argv))


if __name__ == "__main__":
    main()
