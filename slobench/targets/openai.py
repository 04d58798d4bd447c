"""The OpenAI-compatible target: /v1/completions and /v1/chat/completions, streamed (SSE) or not.

Timestamps (injected clock): `sent_s` immediately before the request's bytes go; a chunk per network read
that carried a generated token (`is_token`, text or not), with its tokens (`token_ids` or logprobs where
sent, else 1), stamped as the read reaches the client: with the raw transport in the connection's own
callback (`_StreamReader.feed`), not when the request's task next runs (that wait is the client's own);
with httpx as its iterator hands the read over. Events in one read share its stamp. `done_s`: the read
holding the end; `output_tokens`: `_settle_output_tokens`. Complete at `[DONE]`, or once every choice
finished and the usage asked for came: the rest is waited for `DRAIN_S` at most. A failed request is data
on its record, never an exception; no configured secret reaches a record, a message or a repr, even when a
server echoes it (`scrub`). What the server accepts is settled in slobench.targets.preflight.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from orjson import dumps as orjson_dumps
from orjson import loads as orjson_loads  # about twice as fast as json.loads on SSE events

from slobench.errors import SpecError, UsageError
from slobench.redact import is_secret_name
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.base import TargetBase
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, json_of
from slobench.targets.capabilities import SERVES_RESPONSES, Capabilities, name_too_long, profile_capabilities
from slobench.targets.codecs import chat, completions, responses
from slobench.targets.codecs.chat import chat_output, chat_text, has_call_arguments
from slobench.targets.codecs.choices import ChoiceStream, is_token, tokens_in
from slobench.targets.codecs.common import error_message, settle_reasoning, take_usage
from slobench.targets.options import TargetOptions, Timeouts, TransportName
from slobench.targets.preflight import find_model, negotiate
from slobench.targets.rawhttp import RawHttpTransport
from slobench.targets.sse import DONE, SSEDecodeError, SSEParser
from slobench.targets.transport import (
    FedResponse,
    FeedingTransport,
    HttpxTransport,
    Response,
    Transport,
    TransportError,
    endpoint_url,
    is_redirect,
    no_body_reason,
    redirect_reason,
)
from slobench.workload.text import ExactText, ids_to_text, sized_text

MAX_ERROR_CHARS = 300
_CODECS: dict[str, Any] = {"completions": completions, "chat": chat, "responses": responses}  # by --api
# the names the stream's parts had when they lived here (tests reach them so)
_Stream, _is_token, _tokens_in = ChoiceStream, is_token, tokens_in
_MEMO_CHARS = 64 * 1024 * 1024  # text built from token ids, kept for reuse up to this many characters
_SECRET_HEADER_HINTS = ("auth", "key", "token", "secret", "cookie")
_SECRET_BODY_HINTS = ("auth", "key", "secret", "password")  # not "token": max_tokens is no secret
_DONE_BYTES = DONE.encode()
# How long a complete stream's remaining bytes (the body's end) are waited for before its connection is
# dropped: a server that keeps the body open after [DONE] must not hold the request for --timeout.
DRAIN_S = 1.0
_MIN_SECRET_CHARS = 4  # shorter configured values are not scrubbed: they would blank out ordinary words
_AUTH_SCHEMES = frozenset({"bearer", "basic", "token", "apikey", "key"})  # `Scheme <token>`: the token alone too


class OpenAITarget(TargetBase):
    """Any server speaking the OpenAI completions or chat API (vLLM, SGLang, TGI, llama.cpp, OpenAI).

    `url` is the API root, e.g. `http://localhost:8000/v1` (a URL with no path gets `/v1`); `options` say
    what to send and how (their `urls` are not read: a target loads the one URL it is given). A model not
    named is the first the server lists, found by `preflight()` (or `discover_model()`). `transport` stands
    in for the load's HTTP client (tests script responses through one); `capabilities` are what a parent
    settled already (client worker processes); `api_key` is used instead of `options.api_key_env`'s.
    """

    records_live = True  # a read's stamp goes on the record in the same step (`_StreamReader.feed`)

    def __init__(
        self,
        url: str,
        options: TargetOptions | None = None,
        clock: Clock | None = None,
        *,
        transport: Transport | None = None,
        capabilities: Capabilities | None = None,
        api_key: str | None = None,
    ) -> None:
        o = options if options is not None else TargetOptions()
        # credentials in the URL become a Basic header (unless one is given): the URL is recorded, the
        # header never
        self.base_url, url_auth = _split_userinfo(_normalise_base_url(url))
        self.max_body_bytes = o.max_body_bytes
        self.options = o
        self.model: str = o.model or ""  # "": the first the server lists, found at preflight (discover_model)
        self.api = o.api
        self.clock = clock if clock is not None else Clock()
        self.stream = o.stream
        self.codec = _CODECS[o.api]
        self.url = endpoint_url(self.base_url, self.codec.PATH)
        self.timeouts: Timeouts = o.timeouts
        self._given_transport = transport
        self.transport_name = o.transport if transport is None else type(transport).__name__
        self._is_chat = o.api == "chat"
        self._is_responses = o.api == "responses"
        self._text_only = o.api != "completions"  # prompts go as text: token ids become words
        if self._is_responses and o.server_profile not in SERVES_RESPONSES:
            raise SpecError("api", "responses", f"server profile {o.server_profile} does not serve /v1/responses "
                            f"(known to: {', '.join(sorted(SERVES_RESPONSES - {'auto'}))}); use --api chat")

        key = api_key if api_key else (os.environ.get(o.api_key_env) if o.api_key_env else None)
        self._headers: dict[str, str] = {"Content-Type": "application/json"}
        if o.stream:
            self._headers["Accept"] = "text/event-stream"
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._headers.update(o.headers)
        if url_auth and not any(k.lower() == "authorization" for k in self._headers):
            self._headers["Authorization"] = url_auth
        secrets = {key} if key else set()
        secrets |= {v for k, v in self._headers.items() if any(h in k.lower() for h in _SECRET_HEADER_HINTS)}
        secrets |= set(o.headers.values())
        if url_auth:
            secrets.add(url_auth)
        secrets |= _url_secrets(url)
        self._secrets = _secret_forms(secrets)

        self.extra_body: dict[str, Any] = dict(o.extra_body or {})
        self._transport: Transport | None = None
        self._feeds = False  # the transport takes a stream reader's step (`FeedingTransport`)
        self.caps: Capabilities = capabilities if capabilities is not None else profile_capabilities(o.server_profile)
        self.exact_text = ExactText(o.tokenizer) if o.tokenizer else None
        self._texts: dict[Any, str] = {}  # prompt (ids or text) -> the text sent, built once per prompt
        self._texts_chars = 0
        self._set_caps(self.caps)

    def _set_caps(self, caps: Capabilities) -> None:
        self.caps = caps
        self._texts.clear()
        self._texts_chars = 0
        self._base_body: dict[str, Any] = {"model": self.model, "temperature": 0, "stream": self.stream}
        if self.stream and caps.include_usage and not self._is_responses:  # (a Responses stream ends with its usage)
            self._base_body["stream_options"] = {"include_usage": True}

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
            "http2": self.options.http2,
            "header_names": sorted(self._headers),
            "extra_body": _redacted_keys(self.extra_body),
            "timeout_s": self.timeouts.request_s,
            "connect_timeout_s": self.timeouts.connect_s,
            "capabilities": self.caps.to_dict(),
            "tokenizer": self.options.tokenizer,
        } | ({"extra_body_overrides": {k: self.extra_body[k] for k in overrides}}
             if (overrides := self.options.extra_body_overrides) else {})

    def check_compatible(self, spec: RequestSpec) -> None:
        """Every spec can be sent: token ids go as text where the API or the server needs it."""

    # ---- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._transport is None:
            self._transport = self._given_transport or make_transport(
                self.options.transport,
                timeout_s=self.timeouts.request_s,
                connect_timeout_s=self.timeouts.connect_s,
                http2=self.options.http2,
                max_body_bytes=self.max_body_bytes,
            )
            self._feeds = getattr(self._transport, "feeds_body", False) is True

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    # ---- the hot path ----------------------------------------------------------------------------------

    def build_body(self, spec: RequestSpec, *, stream: bool | None = None) -> dict[str, Any]:
        body = self._base_body.copy()
        if stream is not None and stream != self.stream:
            body["stream"] = stream
            if not stream:
                body.pop("stream_options", None)
        prompt = spec.prompt
        caps = self.caps
        if type(prompt) is tuple and (self._text_only or not caps.token_prompts):
            prompt = self._text_of(prompt, spec.input_tokens)
        elif type(prompt) is str and (self.exact_text is not None or caps.tokens_per_word != 1.0
                                      or caps.template_overhead):
            prompt = self._text_of(prompt, spec.input_tokens)
        self.codec.put_prompt(body, prompt)  # type: ignore[arg-type]  # (text where `_text_only`)
        body[self.codec.MAX_TOKENS_FIELD] = spec.max_tokens
        min_tokens = spec.min_tokens
        if spec.ignore_eos:
            if caps.ignore_eos:
                body["ignore_eos"] = True
            if caps.min_tokens and min_tokens is None and (caps.pair_min_tokens or not caps.ignore_eos):
                min_tokens = spec.max_tokens  # enforces the length where ignore_eos is refused, or ignored
        if min_tokens is not None and caps.min_tokens:
            body["min_tokens"] = min_tokens
        if self.extra_body:
            body.update(self.extra_body)
        if spec.extra_body:
            body.update(spec.extra_body)
        return body

    def _text_of(self, prompt: tuple[int, ...] | str, input_tokens: int) -> str:
        """The text sent for a prompt: ids as words; with a tokenizer, exactly the asked token count; else
        as many words as the server counts as the asked length (`sized_text`: the tokens a word and the tokens
        added to every prompt, both fitted at preflight)."""
        text = self._texts.get(prompt)
        if text is None:
            if self.exact_text is None:
                text = sized_text(prompt, self.caps.tokens_per_word, self.caps.template_overhead)
            else:
                text = ids_to_text(prompt) if type(prompt) is tuple else str(prompt)
                n = len(prompt) if type(prompt) is tuple else input_tokens
                text = self.exact_text.fit(text, n - self.caps.template_overhead if self._is_chat else n)
            if self._texts_chars > _MEMO_CHARS:  # bounded by size: long prompts of an endless trace
                self._texts.clear()
                self._texts_chars = 0
            self._texts[prompt] = text
            self._texts_chars += len(text)
        return text

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        transport = self._transport
        if transport is None:
            raise RuntimeError("OpenAITarget.send() called before start()")
        fields = self.build_body(spec)
        body = _body_bytes(fields)
        now = self.clock.now_s

        def on_sent() -> None:
            record.sent_s = now()

        reader: _StreamReader | None = None
        if self.stream:
            n = fields.get("n")
            reader = _StreamReader(self, record, n if type(n) is int and n > 1 else 1,
                                   _max_tokens_sent(fields, spec.max_tokens))
        texts: list[str] | None = None  # the generated text, read only where a tokenizer may count it
        try:
            record.sent_s = now()  # replaced when the bytes really go; kept if the connection fails first
            post: AbstractAsyncContextManager[Response]
            if reader is not None and self._feeds:  # the body's reads go to the reader from the connection's callback
                post = cast(FeedingTransport, transport).post(self.url, body, self._headers, on_sent, reader.feed)
            else:
                post = transport.post(self.url, body, self._headers, on_sent)
            async with post as resp:
                record.http_status = resp.status
                record.retried = getattr(resp, "retried", None)
                if is_redirect(resp.status):
                    where = getattr(resp, "location", None)
                    record.fail("error", self.scrub(redirect_reason(resp.status, where)), now())
                elif resp.status >= 400:
                    raw = await resp.read()
                    retry = getattr(resp, "retry_after", None)
                    record.fail("error", name_too_long(resp.status, self.http_error(resp.status, raw, retry)), now())
                elif (bodiless := no_body_reason(resp.status)) is not None:
                    record.fail("error", bodiless, now())
                elif reader is not None:
                    texts = await self._read_stream(resp, reader, self._feeds)
                else:
                    texts = await self._read_whole(resp, record)
        except TransportError as e:
            if record.done_s is None:  # a connection that drops after the stream completed lost nothing
                record.fail(e.status, self.scrub(e.reason), now())
        finally:
            _settle_output_tokens(record, spec.max_tokens, texts, self.exact_text)

    async def _read_stream(self, resp: Response, reader: _StreamReader, fed: bool) -> list[str] | None:
        """Read an SSE stream through `reader`'s step (`_StreamReader.feed`), which the transport called as
        each read arrived (`fed`: only the end is awaited here) or which is called here on each read of
        `chunks()`. A failure below HTTP once a choice finished or `[DONE]` came loses nothing (only a
        trailing usage chunk or `[DONE]`: llama-cpp-python drops the connection after an interrupted
        stream's `[DONE]`). Once the stream ended, the rest of the body is waited for `DRAIN_S` at most (the
        transport's `drain`, else `_drain`); the text the stream carried, with --tokenizer (else None)."""
        stream = reader.stream
        if fed:
            try:
                await cast(FedResponse, resp).fed()
            except TransportError:  # what the step itself raised passes: a bug must not pass as a cut-off
                if stream.finish is None and not stream.is_done:
                    raise
                return reader.settle()
            if stream.ended and not reader.failed:
                await cast(FedResponse, resp).drain(DRAIN_S)
            return reader.settle()
        feed = reader.feed
        chunks = resp.chunks().__aiter__()
        while True:
            try:
                raw = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except Exception:  # the client's own error: the transport maps it to a TransportError if re-raised
                if stream.finish is None and not stream.is_done:
                    raise
                return reader.settle()
            if feed(raw):
                if stream.ended and not reader.failed:
                    drain = getattr(resp, "drain", None)  # a transport's own, lighter than `_drain`
                    if drain is not None:
                        await drain(DRAIN_S)
                    else:
                        await _drain(chunks)
                break
        return reader.settle()

    async def _read_whole(self, resp: Response, record: RequestRecord) -> list[str] | None:
        """Read a whole JSON answer into `record`; its text, with --tokenizer (else None)."""
        raw = await resp.read()
        record.done_s = self.clock.now_s()
        try:
            obj = json_of(raw)
            if type(obj) is not dict:
                raise ValueError("not an object")
        except ValueError as e:
            text = raw[:120].decode("utf-8", "replace")
            why = f" ({e})" if "nested deeper" in str(e) else ""
            record.fail("error", self.scrub(f"malformed JSON response{why}: {text!r}"))
            return None
        # (a Responses object holds `"error": null` when all went well)
        if (obj.get("error") if self._is_responses else "error" in obj) or obj.get("object") == "error":
            record.fail("error", self.scrub(_truncate("server error: " + error_message(obj, ""))))
            return None
        if self._is_responses:
            return self._read_whole_response(obj, record)
        usage = obj.get("usage")
        if usage and type(usage) is dict:
            take_usage(record, usage)
        choices = obj.get("choices")
        c = choices[0] if choices and type(choices) is list else None
        output = (c.get("message") if self._is_chat else c.get("text")) if type(c) is dict else None
        has_text = bool(chat_output(output) if self._is_chat else output)
        reason = c.get("finish_reason") if type(c) is dict else None
        record.finish_reason = reason if type(reason) is str and reason else None
        if not has_text and not record.usage_output_tokens:
            record.fail("error", "no output: the response holds no generated text")
            return None
        record.first_token_s = record.done_s  # the whole answer arrives at once
        if not record.reasoning_tokens:  # (a usage of 0: no reasoning)
            record.reasoning_tokens = record.reasoning_tokens_source = None
        message = output if self._is_chat and isinstance(output, dict) else None
        if record.reasoning_tokens or (message is not None and (message.get("reasoning_content") or
                                                                message.get("reasoning"))):
            record.first_reasoning_s = record.done_s
            answered = message is None or bool(message.get("content")) or has_call_arguments(message)
            record.first_answer_s = record.done_s if answered else None
        if self.exact_text is None or not has_text:
            return None
        return [chat_text(output) if self._is_chat else str(output)]

    def _read_whole_response(self, obj: dict[str, Any], record: RequestRecord) -> list[str] | None:
        """A whole Responses answer (`responses.whole_answer`) into `record`, as `_read_whole` reads the others."""
        usage = obj.get("usage")
        if usage and type(usage) is dict:
            responses.take_usage(record, usage)
        answer, reasoning, finish, failed = responses.whole_answer(obj)
        if failed:
            record.fail("error", "server error: the response failed (status \"failed\")")
            return None
        record.finish_reason = finish
        if not answer and not reasoning and not record.usage_output_tokens:
            record.fail("error", "no output: the response holds no generated text")
            return None
        record.first_token_s = record.done_s
        if not record.reasoning_tokens:  # (a usage of 0: no reasoning)
            record.reasoning_tokens = record.reasoning_tokens_source = None
        if record.reasoning_tokens or reasoning:
            record.first_reasoning_s = record.done_s
            record.first_answer_s = record.done_s if answer else None
        if self.exact_text is None or not (answer or reasoning):
            return None
        return [(reasoning or "") + answer]

    # ---- errors ----------------------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """`text` with every secret replaced by `***`: the key, every --header value and the token after
        its scheme (`Bearer K`: K too), the URL's password and secret-named query values, each as given,
        decoded and percent-encoded (`_secret_forms`)."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def http_error(self, status: int, raw: bytes, retry_after: str | None = None) -> str:
        """What a record says of an HTTP error answer: the status, and the server's message, scrubbed and cut."""
        text = raw.decode("utf-8", "replace")
        try:
            message = error_message(json_of(raw), text)
        except ValueError as e:
            message = f"an error body with {e}" if "nested deeper" in str(e) else text
        # a 429 is recorded as one, with the server's Retry-After; it is never retried (the schedule is the test)
        label = f"HTTP {status} (rate limited)" if status == 429 else f"HTTP {status}"
        if retry_after and status in (429, 503):
            label = label[:-1] + f", Retry-After {' '.join(retry_after.split())[:40]})" if status == 429 else \
                f"{label} (Retry-After {' '.join(retry_after.split())[:40]})"
        message = " ".join(message.split()) or "(empty body)"
        # Scrub before truncating: a cut could otherwise leave a recognisable head of the key.
        return _truncate(f"{label}: {self.scrub(message)}")

    # ---- setup -----------------------------------------------------------------------------------------

    def control_headers(self) -> dict[str, str]:
        """The headers of a setup request (preflight, probes): the load's, less `Accept: text/event-stream`."""
        return {k: v for k, v in self._headers.items() if k != "Accept"}

    async def discover_model(self) -> str:
        """The model to load: the one given, else the first the server lists at /models (`self.model` is
        set). A server that lists none is unreachable for this purpose: pass --model."""
        if not self.model:
            self.model = await find_model(self)
            self._set_caps(self.caps)
        return self.model

    async def preflight(self) -> str:
        """Find the model when none was given (`discover_model`), check the server answers for it, and
        settle what it accepts (`self.caps`; slobench.targets.preflight)."""
        await self.discover_model()
        caps, served = await negotiate(self)
        self._set_caps(caps)
        return served


def make_transport(
    name: TransportName, *, timeout_s: float, connect_timeout_s: float, http2: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Transport:
    """The load's client: `raw` (HTTP/1.1, the least CPU per request) or `httpx` (HTTP/2 with `http2`)."""
    if name == "httpx":
        return HttpxTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, http2=http2,
                              max_body_bytes=max_body_bytes)
    if name == "raw" and not http2:
        return RawHttpTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,  # type: ignore[return-value]
                                max_body_bytes=max_body_bytes)
    raise UsageError(f"transport: must be 'raw' or 'httpx' (got {name!r}{', http2' if http2 else ''})")


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """`http://u:p@host/v1` -> (`http://host/v1`, `Basic <base64 u:p>`); a URL without credentials as is."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    creds = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return urlunsplit(parts._replace(netloc=host)), "Basic " + base64.b64encode(creds).decode()


def _max_tokens_sent(body: dict[str, Any], max_tokens: int) -> int:
    """The output length asked of the server: the spec's, or a larger one an --extra-body field set."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(name)
        if type(v) is int and v > max_tokens:
            max_tokens = v
    return max_tokens


def max_streamed_tokens(max_tokens: int, num_choices: int = 1) -> int:
    """The most tokens a stream may bring (each token-carrying read is kept on the record): an honest
    server sends at most `max_tokens` a choice; four times that, and 1024 more, leave room for one that
    overshoots without letting one that never stops hold the client for --timeout or fill its memory."""
    return (4 * max(max_tokens, 0) + 1024) * num_choices


def _url_secrets(url: str) -> set[str]:
    """The secrets a URL carries: its password and the values of secret-named query parameters."""
    parts = urlsplit(url)
    out = {parts.password} if parts.password else set()
    out |= {v for k, v in parse_qsl(parts.query, keep_blank_values=True) if v and is_secret_name(k)}
    return out


def _secret_forms(values: set[str]) -> tuple[str, ...]:
    """Every form a server may echo a secret in: as configured, the token after an auth scheme (and, for
    Basic, its decoded `user:password` and password), percent-decoded and percent-encoded. Longest first,
    so "Bearer <key>" is replaced whole before the bare key is looked for."""
    forms: set[str] = set()
    for value in values:
        scheme, _, token = value.strip().partition(" ")
        pieces = {value, token.strip()} if scheme.lower() in _AUTH_SCHEMES and token.strip() else {value}
        if scheme.lower() == "basic" and token:
            try:
                pair = base64.b64decode(token.strip(), validate=True).decode()
                pieces |= {pair, pair.partition(":")[2]}
            except (binascii.Error, UnicodeDecodeError):
                pass
        for piece in pieces:
            forms |= {piece, unquote(piece), quote(piece, safe="")}
    return tuple(sorted((f for f in forms if len(f) >= _MIN_SECRET_CHARS), key=len, reverse=True))


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read a complete stream's remaining bytes for `DRAIN_S` at most, so its connection can be reused;
    whatever happens to them loses nothing measured (a body left open: the transport drops the connection)."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in chunks:
                pass
    except Exception:  # a timeout, a reset, any client's error: after the end nothing measured is lost
        pass


def _normalise_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError("url", base_url, "must be an http(s) URL such as http://localhost:8000/v1")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit(parts._replace(path=path, fragment=""))


def _body_bytes(body: dict[str, Any]) -> bytes:
    """A request body: orjson (a tenth of json.dumps' CPU, and it runs once per request), or json for what
    orjson refuses (an int past 64 bits, a type it does not know in a user's --extra-body)."""
    try:
        return orjson_dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()


def _events_of(parser: SSEParser, raw: bytes) -> tuple[list[tuple[str, str]], str | None]:
    """The events of a read that is not whole `data: {...}` events (`_objects_of`) as (event type, data),
    and the read's decode error: the events before the bad line count, then the read fails."""
    try:
        return [(ev.event, ev.data) for ev in parser.feed(raw)], None
    except SSEDecodeError as e:
        return [(ev.event, ev.data) for ev in e.events], str(e)


def _objects_of(datas: list[bytes]) -> list[dict[str, Any]] | None:
    """The JSON object of each event's data before `[DONE]` (fewer objects than datas: it came); None if any
    is not an object (the read then goes through the SSE parser, and nothing of it is taken before all of
    it parsed). orjson reads each event from its bytes, and the loops run in C."""
    if len(datas) == 1:  # the commonest read: one event
        data = datas[0]
        if data == _DONE_BYTES:
            return []
        try:
            obj = orjson_loads(data)
        except ValueError:
            return None
        return [obj] if type(obj) is dict else None
    end = datas.index(_DONE_BYTES) if _DONE_BYTES in datas else None
    try:
        objs = list(map(orjson_loads, datas[:end]))
    except ValueError:
        return None
    if objs and set(map(type, objs)) != _DICT_ONLY:
        return None
    return objs


_DICT_ONLY = {dict}


class _StreamReader:
    """One SSE stream read into its record, a network read at a time. `feed(raw)` is the whole per-read
    step: stamp the read, parse it, take its events, check the limits; True once nothing more is wanted
    (the stream ended, or failed: the record then says why). A read of whole `data: {...}` events (the
    common one) is parsed and taken in one step (`_objects_of`, `ChoiceStream.take_all`); any other goes
    through the SSE parser, event by event (`ChoiceStream.take`). A stream of more tokens than
    `max_streamed_tokens` allows (a server ignoring `max_tokens` without end) is refused. `settle()`
    finishes the record once reading stopped. It holds no more than the record's chunk lists, the SSE
    parser's unfinished line (up to --max-body) and, until an event comes, the body's first 4 KiB."""

    __slots__ = ("record", "stream", "parser", "now", "scrub", "max_tokens", "max_streamed", "num_streamed",
                 "t", "t_last", "head", "failed")

    def __init__(self, target: OpenAITarget, record: RequestRecord, num_choices: int, max_tokens: int) -> None:
        caps = target.caps
        self.record = record
        self.stream: ChoiceStream | responses.ResponseStream = (
            responses.ResponseStream(record) if target._is_responses else
            ChoiceStream(record, target._is_chat, num_choices, caps.include_usage and caps.usage_in_stream is not False))
        if target.exact_text is not None:
            self.stream.texts = []
        self.parser = SSEParser(target.max_body_bytes)
        self.now = target.clock.now_s
        self.scrub = target.scrub
        self.max_tokens = max_tokens
        self.max_streamed = max_streamed_tokens(max_tokens, num_choices)
        self.num_streamed = 0
        self.t = 0.0  # the last read's stamp
        self.t_last = 0.0  # the last read that carried an event
        self.head = b""  # the first bytes, while no event has come: a JSON error body sent as a 200 stream
        self.failed = False

    def feed(self, raw: bytes) -> bool:
        t = self.t = self.now()
        stream = self.stream
        datas = self.parser.data_events(raw)
        if datas is not None and (objs := _objects_of(datas)) is not None:
            self.t_last = t
            num = stream.take_all(objs, datas, len(objs) < len(datas))
        else:
            events, decode_error = _events_of(self.parser, raw)
            if events:
                self.t_last = t
            elif self.t_last == 0.0 and len(self.head) < 4096:
                self.head += raw
            num = 0
            for kind, data in events:  # those before a line that is not UTF-8 count
                num += stream.take(kind, data)
                if stream.error is not None or stream.is_done:
                    break
            if stream.error is None:
                stream.error = decode_error
        if num:  # tokens that came in the same read as a failure still count
            record = self.record
            times = record.chunk_times_s
            if not times:
                record.first_token_s = t
            if stream.num_reasoning and record.first_reasoning_s is None:
                record.first_reasoning_s = t
            if stream.has_answer and stream.first_answer_s is None:
                stream.first_answer_s = t
            times.append(t)
            record.chunk_tokens.append(num)
            self.num_streamed += num
            if self.num_streamed > self.max_streamed:
                stream.error = f"over {self.max_streamed:,} tokens streamed for max_tokens={self.max_tokens}: refused"
        if stream.error is not None:
            self.record.fail("error", self.scrub(_truncate(stream.error)), self.now())
            self.failed = True
            return True
        return stream.ended

    def settle(self) -> list[str] | None:
        """Finish the record once reading stopped; the text the stream carried, with --tokenizer (else None).
        Complete when a choice carried a `finish_reason`, whether or not `data: [DONE]` follows (TGI, Ollama
        and LiteLLM may close without it); a stream that stops without any `finish_reason` was cut off,
        `[DONE]` or not, and is an error (llama.cpp ends an interrupted stream with `[DONE]` and no finish)."""
        stream = self.stream
        settle_reasoning(self.record, stream.num_reasoning, stream.first_answer_s)
        if self.failed:
            return stream.texts
        record = self.record
        got = sum(record.chunk_tokens)
        finish = stream.finish
        record.finish_reason = finish
        t_last = self.t_last
        if finish is None:
            if stream.is_done:
                record.fail("error", f"cut off by the server after {got} tokens: [DONE] came with no finish_reason",
                            t_last)
            elif t_last == 0.0 and self.head.strip():
                record.fail("error", self.scrub(_truncate(_not_a_stream(self.head))), self.t or self.now())
            else:
                record.fail("error", f"stream ended after {got} tokens without {stream.missing_end}",
                            self.t or self.now())
            return stream.texts
        record.done_s = t_last
        if not got:
            if record.usage_output_tokens:  # the server says it generated tokens, though no event carried one
                record.first_token_s = t_last
            else:
                record.fail("error", f"no output: the stream finished (finish_reason={finish!r}) without a token")
        return stream.texts


def _settle_output_tokens(record: RequestRecord, max_tokens: int, texts: list[str] | None,
                          exact_text: ExactText | None) -> None:
    """output_tokens, and where it came from (`output_tokens_source`), first of:

    - "usage": the server's count, where plausible. It is kept beside (`usage_output_tokens`) either way:
      below the tokens streamed (each token-carrying event is at least one) or above `max_tokens` it
      cannot be true (TPOT must not be computed from a made-up count);
    - "max_tokens": finish_reason "length" says the server produced exactly the max_tokens it accepted
      (a server may stream several tokens an event);
    - "tokenizer": --tokenizer over the streamed text;
    - "events": counted from the stream, an estimate unless the events carried token ids."""
    counted = sum(record.chunk_tokens)
    usage = record.usage_output_tokens
    if usage is not None and not (usage == 0 and counted) and counted <= usage <= max_tokens:
        record.output_tokens, record.output_tokens_source = usage, "usage"
    elif record.finish_reason == "length" and record.status == "ok" and counted <= max_tokens:
        record.output_tokens, record.output_tokens_source = max_tokens, "max_tokens"
    elif texts and exact_text is not None:
        record.output_tokens, record.output_tokens_source = exact_text.count("".join(texts)), "tokenizer"
    else:
        record.output_tokens, record.output_tokens_source = counted, "events"


def _not_a_stream(head: bytes) -> str:
    """What to say of a 200 answer to a streamed request that held no SSE event."""
    text = head.decode("utf-8", "replace").strip()
    try:
        obj = json_of(text)
    except ValueError:
        return f"no SSE events in the stream: {text[:120]!r}"
    if isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error"):
        return "server error: " + error_message(obj, text)
    return f"no SSE events in the stream (a JSON body instead): {text[:120]!r}"


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _redacted_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(h in k.lower() for h in _SECRET_BODY_HINTS) else v) for k, v in body.items()}
