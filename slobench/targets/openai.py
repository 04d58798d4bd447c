"""The OpenAI-compatible target: /v1/completions and /v1/chat/completions, streamed (SSE) or not.

Timestamps (all on the injected clock): `sent_s` immediately before the request is handed to the HTTP
client; each network read that carried content is one chunk, stamped when the read returns, with the
number of tokens it carried; `first_token_s` is the first such chunk, `done_s` the read holding `[DONE]`.
Several SSE events in one read share that one stamp, so they are one chunk: the client cannot know
they left the server at different times, and splitting them would invent zero-length gaps.

Tokens per content event: the length of `token_ids` (vLLM's `return_token_ids`) or of the logprobs
token list when the server sends one, else 1. An event counts as content when its `choices[0].text`
(completions) or `choices[0].delta.content` (chat) is non-empty, so chat's opening role chunk does not
start TTFT. The final `usage` (requested with `stream_options.include_usage`) overrides the count:
`output_tokens` and `prompt_tokens` come from it when present, else output_tokens = sum(chunk_tokens).

A failed request is data on its record, never an exception; `asyncio.CancelledError` propagates.
The API key never reaches a record, a message or a repr: every error text is scrubbed of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from orjson import loads as _loads  # about twice as fast as json.loads on SSE events

from slobench.clock import Clock
from slobench.errors import SpecError, TargetUnreachable, UsageError
from slobench.records import RequestRecord, RequestSpec
from slobench.targets.sse import DONE, SSEDecodeError, SSEParser
from slobench.targets.transport import (
    Response,
    Transport,
    TransportError,
    TransportName,
    make_transport,
    translate_error,
)

Api = Literal["completions", "chat"]
MAX_ERROR_CHARS = 300
_SECRET_HEADER_HINTS = ("auth", "key", "token", "secret", "cookie")
_SECRET_BODY_HINTS = ("auth", "key", "secret", "password")  # not "token": max_tokens is no secret


class OpenAITarget:
    """Any server speaking the OpenAI completions or chat API (vLLM, SGLang, TGI, llama.cpp, OpenAI).

    `base_url` is the API root, e.g. `http://localhost:8000/v1`; a URL with no path gets `/v1`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api: Api = "completions",
        clock: Clock | None = None,
        *,
        stream: bool = True,
        api_key_env: str | None = "OPENAI_API_KEY",
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        preflight_timeout_s: float = 5.0,
        transport: TransportName | Transport = "aiohttp",
        http2: bool = False,
    ) -> None:
        if api not in ("completions", "chat"):
            raise SpecError("api", api, "must be 'completions' or 'chat'")
        if isinstance(transport, str) and transport not in ("aiohttp", "httpx"):
            raise SpecError("transport", transport, "must be 'aiohttp' or 'httpx'")
        if http2 and transport != "httpx":
            raise SpecError("http2", http2, "needs transport='httpx' (aiohttp speaks HTTP/1.1 only)")
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("preflight_timeout_s", preflight_timeout_s),
        ):
            if not value > 0:
                raise SpecError(name, value, "must be > 0 seconds")
        if not model:
            raise SpecError("model", model, "must name the served model")
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.api: Api = api
        self.clock = clock if clock is not None else Clock()
        self.stream = stream
        self.url = self.base_url + ("/chat/completions" if api == "chat" else "/completions")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.preflight_timeout_s = preflight_timeout_s
        # A Transport instance may be given instead of a name: tests script responses through it.
        self._given_transport = None if isinstance(transport, str) else transport
        self.transport_name = transport if isinstance(transport, str) else type(transport).__name__
        self.http2 = http2
        self._is_chat = api == "chat"

        key = api_key if api_key else (os.environ.get(api_key_env) if api_key_env else None)
        self._headers: dict[str, str] = {"Content-Type": "application/json"}
        if stream:
            self._headers["Accept"] = "text/event-stream"
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._headers.update(headers or {})
        secrets = {key} if key else set()
        secrets |= {v for k, v in self._headers.items() if any(h in k.lower() for h in _SECRET_HEADER_HINTS)}
        # Longest first, so "Bearer <key>" is replaced whole before the bare key is looked for.
        self._secrets = tuple(sorted((s for s in secrets if s), key=len, reverse=True))

        self._base_body: dict[str, Any] = {"model": model, "temperature": 0, "stream": stream}
        if stream:
            self._base_body["stream_options"] = {"include_usage": True}
        self._extra_body = dict(extra_body or {})
        self._transport: Transport | None = None

    def __repr__(self) -> str:
        return (
            f"OpenAITarget(url={self.url!r}, model={self.model!r}, api={self.api!r}, stream={self.stream}, "
            f"transport={self.transport_name!r})"
        )

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this target: never the key or any header value."""
        return {
            "kind": "openai",
            "base_url": self.base_url,
            "model": self.model,
            "api": self.api,
            "stream": self.stream,
            "transport": self.transport_name,
            "http2": self.http2,
            "header_names": sorted(self._headers),
            "extra_body": _redacted_keys(self._extra_body),
            "timeout_s": self.timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
        }

    def check_compatible(self, spec: RequestSpec) -> None:
        """Raise UsageError if this target cannot send `spec` (the runner calls it before the run)."""
        if self._is_chat and isinstance(spec.prompt, tuple):
            raise UsageError(_CHAT_TOKEN_IDS.format(request_id=spec.request_id))

    # ---- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._transport is None:
            self._transport = self._given_transport or make_transport(
                self.transport_name,  # type: ignore[arg-type]
                timeout_s=self.timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                http2=self.http2,
            )

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    async def __aenter__(self) -> OpenAITarget:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the hot path ----------------------------------------------------------------------------------

    def build_body(self, spec: RequestSpec, *, stream: bool | None = None) -> dict[str, Any]:
        body = self._base_body.copy()
        if stream is not None and stream != self.stream:
            body["stream"] = stream
            if not stream:
                body.pop("stream_options", None)
        prompt = spec.prompt
        if self._is_chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = list(prompt) if isinstance(prompt, tuple) else prompt
        body["max_tokens"] = spec.max_tokens
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.min_tokens is not None:
            body["min_tokens"] = spec.min_tokens
        if self._extra_body:
            body.update(self._extra_body)
        if spec.extra_body:
            body.update(spec.extra_body)
        return body

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        transport = self._transport
        if transport is None:
            raise RuntimeError("OpenAITarget.send() called before start()")
        if self._is_chat and isinstance(spec.prompt, tuple):
            record.fail("error", _CHAT_TOKEN_IDS.format(request_id=spec.request_id))
            return
        body = json.dumps(self.build_body(spec), separators=(",", ":")).encode()
        now = self.clock.now_s

        def on_sent() -> None:
            record.sent_s = now()

        try:
            record.sent_s = now()  # replaced when the bytes really go; kept if the connection fails first
            async with transport.post(self.url, body, self._headers, on_sent) as resp:
                record.http_status = resp.status
                if resp.status >= 400:
                    raw = await resp.read()
                    record.fail("error", self._http_error(resp.status, raw), now())
                elif self.stream:
                    await self._read_stream(resp, record)
                else:
                    await self._read_whole(resp, record)
        except TransportError as e:
            if record.done_s is None:  # a connection that drops after [DONE] lost nothing
                record.fail(e.status, self._scrub(e.reason), now())
        finally:
            if not record.output_tokens and record.chunk_tokens:
                record.output_tokens = sum(record.chunk_tokens)

    async def _read_stream(self, resp: Response, record: RequestRecord) -> None:
        feed = SSEParser().feed
        now = self.clock.now_s
        times = record.chunk_times_s
        tokens = record.chunk_tokens
        is_chat = self._is_chat
        is_done = False
        error: str | None = None
        t = 0.0
        async for raw in resp.chunks():
            t = now()
            if is_done:
                continue  # read on to the end of the body so the connection can be reused
            try:
                events = feed(raw)
            except SSEDecodeError as e:
                events, error = e.events, str(e)
            num = 0
            for ev in events:
                data = ev.data
                if data == DONE:
                    is_done = True
                    break
                if ev.event == "error":
                    error = "server error mid-stream: " + _event_error_text(data)
                    break
                try:
                    obj = _loads(data)
                except ValueError:
                    obj = None
                if type(obj) is not dict:
                    error = f"malformed JSON in SSE event: {data[:120]!r}"
                    break
                choices = obj.get("choices")
                if choices:
                    c = choices[0]
                    if is_chat:
                        text = _chat_output(c.get("delta"))
                    else:
                        text = c.get("text")
                    if text:
                        num += _tokens_in(c, is_chat)
                elif "error" in obj or obj.get("object") == "error":
                    error = "server error mid-stream: " + _error_message(obj, data)
                    break
                usage = obj.get("usage")
                if usage:
                    _take_usage(record, usage)
            if num:  # tokens that came in the same read as a failure still count
                if not times:
                    record.first_token_s = t
                times.append(t)
                tokens.append(num)
            if is_done:
                record.done_s = t
            elif error is not None:
                record.fail("error", self._scrub(_truncate(error)), now())
                return
        if not is_done:
            record.fail("error", "stream ended without [DONE]", t or now())

    async def _read_whole(self, resp: Response, record: RequestRecord) -> None:
        raw = await resp.read()
        record.done_s = self.clock.now_s()
        try:
            obj = _loads(raw)
            if type(obj) is not dict:
                raise ValueError("not an object")
        except ValueError:
            text = raw[:120].decode("utf-8", "replace")
            record.fail("error", self._scrub(f"malformed JSON response: {text!r}"))
            return
        if "error" in obj or obj.get("object") == "error":
            record.fail("error", self._scrub(_truncate("server error: " + _error_message(obj, ""))))
            return
        record.first_token_s = record.done_s  # the whole answer arrives at once
        usage = obj.get("usage")
        if usage:
            _take_usage(record, usage)

    # ---- errors ----------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def _http_error(self, status: int, raw: bytes) -> str:
        text = raw.decode("utf-8", "replace")
        try:
            message = _error_message(json.loads(text), text)
        except ValueError:
            message = text
        label = f"HTTP {status} (rate limited)" if status == 429 else f"HTTP {status}"
        message = " ".join(message.split()) or "(empty body)"
        # Scrub before truncating: a cut could otherwise leave a recognisable head of the key.
        return _truncate(f"{label}: {self._scrub(message)}")

    # ---- control plane ---------------------------------------------------------------------------------

    def _control_headers(self) -> dict[str, str]:
        return {k: v for k, v in self._headers.items() if k != "Accept"}

    async def preflight(self) -> str:
        """GET /models and check the model is served; without /models, send a 1-token request."""
        url = self.base_url + "/models"
        async with httpx.AsyncClient(timeout=self.preflight_timeout_s) as client:
            r = await self._control(client, "GET", url)
            if r.status_code in (404, 405):
                return await self._preflight_by_request(client)
            if r.status_code >= 400:
                raise TargetUnreachable(f"{url}: {self._http_error(r.status_code, r.content)}{_auth_hint(r)}")
            served = _served_models(r.content)
            if served is None:
                return await self._preflight_by_request(client)
            if self.model not in served:
                listing = ", ".join(repr(m) for m in served) or "(none)"
                raise TargetUnreachable(f"{url}: model {self.model!r} is not served; served: {listing}")
            return f"{self.model} served at {self.base_url}"

    async def _preflight_by_request(self, client: httpx.AsyncClient) -> str:
        spec = RequestSpec(request_id=-1, arrival_s=0.0, prompt="Hello", input_tokens=1, max_tokens=1)
        body = json.dumps(self.build_body(spec, stream=False)).encode()
        r = await self._control(client, "POST", self.url, body)
        if r.status_code >= 400:
            raise TargetUnreachable(
                f"{self.url}: {self._http_error(r.status_code, r.content)}{_auth_hint(r)}"
            )
        return f"{self.model} answers at {self.url} (no /models endpoint)"

    async def _control(
        self, client: httpx.AsyncClient, method: str, url: str, body: bytes | None = None
    ) -> httpx.Response:
        try:
            return await client.request(method, url, content=body, headers=self._control_headers())
        except Exception as e:
            t = translate_error(e, self.preflight_timeout_s, self.preflight_timeout_s)
            if t is e:
                raise
            raise TargetUnreachable(self._scrub(f"{url}: {t}")) from None


_CHAT_TOKEN_IDS = (
    "request {request_id}: api='chat' sends text messages, but this prompt is token ids; "
    "use api='completions' or a text-prompt workload"
)


def _normalise_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError("url", base_url, "must be an http(s) URL such as http://localhost:8000/v1")
    url = base_url.rstrip("/")
    if parts.path in ("", "/"):
        url += "/v1"
    return url


def _chat_output(delta: Any) -> bool:
    """Whether a chat delta carries generated tokens: answer text, reasoning (vLLM's `reasoning_content`,
    newer `reasoning`; SGLang's `reasoning_content`) or tool-call arguments. A reasoning model's first
    tokens are its reasoning, so TTFT counts them, as vLLM's `bench serve` does; a role-only or empty
    delta is not output."""
    if not isinstance(delta, dict):
        return False
    if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
        return True
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and fn.get("arguments"):
                return True
    return False


def _tokens_in(choice: dict[str, Any], is_chat: bool) -> int:
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    logprobs = choice.get("logprobs")
    if logprobs:
        toks = logprobs.get("content") if is_chat else logprobs.get("tokens")
        if toks:
            return len(toks)
    return 1


def _take_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    completion = usage.get("completion_tokens")
    if isinstance(completion, int):
        record.output_tokens = completion
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int):
        record.prompt_tokens = prompt
    details = usage.get("prompt_tokens_details")  # OpenAI, vLLM (--enable-prompt-tokens-details), SGLang
    if isinstance(details, dict):
        cached = details.get("cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            record.cached_tokens = cached


def _error_message(obj: Any, fallback: str) -> str:
    """The human message in the error shapes servers use: OpenAI, vLLM (old and new), FastAPI."""
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        for key in ("message", "detail"):
            if obj.get(key):
                return str(obj[key])
    return fallback


def _event_error_text(data: str) -> str:
    try:
        return _error_message(json.loads(data), data)
    except ValueError:
        return data


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _served_models(raw: bytes) -> list[str] | None:
    try:
        data = json.loads(raw)["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return None


def _auth_hint(r: httpx.Response) -> str:
    return " (check the API key)" if r.status_code in (401, 403) else ""


def _redacted_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(h in k.lower() for h in _SECRET_BODY_HINTS) else v) for k, v in body.items()}
