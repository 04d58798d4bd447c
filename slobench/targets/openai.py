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

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import urlsplit

from orjson import dumps as _orjson_dumps
from orjson import loads as _loads  # about twice as fast as json.loads on SSE events

from slobench.errors import SpecError, TargetUnreachable, UsageError
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.base import TargetBase
from slobench.targets.capabilities import HONOURS_IGNORE_EOS, Capabilities, is_refusal, profile_capabilities
from slobench.targets.rawhttp import RawHttpTransport
from slobench.targets.sse import DONE, SSEDecodeError, SSEParser
from slobench.targets.transport import (
    TRANSPORTS,
    ControlClient,
    HttpxTransport,
    Reply,
    Response,
    Transport,
    TransportError,
    TransportName,
)
from slobench.workload.text import ExactText, ids_to_text, thin_words, words_for_tokens

Api = Literal["completions", "chat"]
MAX_ERROR_CHARS = 300
_MEMO_CHARS = 64 * 1024 * 1024  # text built from token ids, kept for reuse up to this many characters
_PROBE_TRIES = 3
_PROBE_IDS = (72, 101, 108, 108, 111)  # "Hello" in bytes: inside every vocabulary, byte-level ones included
WORDS_PROBE = 200  # words of the prompt that measures the server's tokens a word (_measure_words)
_WORD_IDS = tuple(range(1000, 1000 + WORDS_PROBE))  # ids standing for as many different prompt words
_PROBE_BACKOFF_S = 0.2
_SECRET_HEADER_HINTS = ("auth", "key", "token", "secret", "cookie")
_SECRET_BODY_HINTS = ("auth", "key", "secret", "password")  # not "token": max_tokens is no secret


class OpenAITarget(TargetBase):
    """Any server speaking the OpenAI completions or chat API (vLLM, SGLang, TGI, llama.cpp, OpenAI).

    `base_url` is the API root, e.g. `http://localhost:8000/v1`; a URL with no path gets `/v1`. `model`
    None: the first model the server lists, found by `preflight()` (or `discover_model()`).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None,
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
        transport: TransportName | Transport = "raw",
        http2: bool = False,
        server_profile: str = "auto",
        tokenizer: str | None = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        if api not in ("completions", "chat"):
            raise SpecError("api", api, "must be 'completions' or 'chat'")
        if isinstance(transport, str) and transport not in TRANSPORTS:
            raise SpecError("transport", transport, "must be 'raw' or 'httpx'")
        if http2 and transport != "httpx":
            raise SpecError("http2", http2, "needs transport='httpx' (raw speaks HTTP/1.1 only)")
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("preflight_timeout_s", preflight_timeout_s),
        ):
            if not value > 0:
                raise SpecError(name, value, "must be > 0 seconds")
        if model is not None and not model:
            raise SpecError("model", model, "must name the served model (or be None: the first one listed)")
        # credentials in the URL become a Basic header (unless one is given): the URL is recorded, the
        # header never
        self.base_url, url_auth = _split_userinfo(_normalise_base_url(base_url))
        self.model: str = model or ""  # "": the first the server lists, found at preflight (discover_model)
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
        if url_auth and not any(k.lower() == "authorization" for k in self._headers):
            self._headers["Authorization"] = url_auth
        secrets = {key} if key else set()
        secrets |= {v for k, v in self._headers.items() if any(h in k.lower() for h in _SECRET_HEADER_HINTS)}
        # Longest first, so "Bearer <key>" is replaced whole before the bare key is looked for.
        self._secrets = tuple(sorted((s for s in secrets if s), key=len, reverse=True))

        self._extra_body = dict(extra_body or {})
        self._transport: Transport | None = None
        self.server_profile = server_profile
        # `capabilities` travels from a parent that probed already (client worker processes)
        self.caps: Capabilities = (Capabilities.from_dict(dict(capabilities)) if capabilities is not None
                     else profile_capabilities(server_profile))
        self.tokenizer_path = tokenizer
        self._exact = ExactText(tokenizer) if tokenizer else None
        self._texts: dict[Any, str] = {}  # prompt (ids or text) -> the text sent, built once per prompt
        self._texts_chars = 0
        self._set_caps(self.caps)

    def _set_caps(self, caps: Capabilities) -> None:
        self.caps = caps
        self._texts.clear()
        self._texts_chars = 0
        self._base_body: dict[str, Any] = {"model": self.model, "temperature": 0, "stream": self.stream}
        if self.stream and caps.include_usage:
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
            "http2": self.http2,
            "header_names": sorted(self._headers),
            "extra_body": _redacted_keys(self._extra_body),
            "timeout_s": self.timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "capabilities": self.caps.to_dict(),
            "tokenizer": self.tokenizer_path,
        }

    def check_compatible(self, spec: RequestSpec) -> None:
        """Every spec can be sent: token ids go as text where the API or the server needs it."""

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
        caps = self.caps
        if type(prompt) is tuple and (self._is_chat or not caps.token_prompts):
            prompt = self._text_of(prompt, spec.input_tokens)
        elif type(prompt) is str and (self._exact is not None or caps.tokens_per_word != 1.0):
            prompt = self._text_of(prompt, spec.input_tokens)
        if self._is_chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = list(prompt) if type(prompt) is tuple else prompt
        body["max_tokens"] = spec.max_tokens
        min_tokens = spec.min_tokens
        if spec.ignore_eos:
            if caps.ignore_eos:
                body["ignore_eos"] = True
            if caps.min_tokens and min_tokens is None and (caps.pair_min_tokens or not caps.ignore_eos):
                min_tokens = spec.max_tokens  # enforces the length where ignore_eos is refused, or ignored
        if min_tokens is not None and caps.min_tokens:
            body["min_tokens"] = min_tokens
        if self._extra_body:
            body.update(self._extra_body)
        if spec.extra_body:
            body.update(spec.extra_body)
        return body

    def _text_of(self, prompt: tuple[int, ...] | str, input_tokens: int) -> str:
        """The text sent for a prompt: ids as words; with a tokenizer, exactly the asked token count; else,
        where the server counts several tokens a word (`caps.tokens_per_word`), one word in that many."""
        text = self._texts.get(prompt)
        if text is None:
            if type(prompt) is tuple:
                per_word = self.caps.tokens_per_word
                text = ids_to_text(prompt if per_word == 1.0 or self._exact is not None else
                                   words_for_tokens(prompt, per_word))
            elif self._exact is None and self.caps.tokens_per_word != 1.0:
                text = thin_words(str(prompt), self.caps.tokens_per_word)
            else:
                text = str(prompt)
            if self._exact is not None:
                n = len(prompt) if type(prompt) is tuple else input_tokens
                text = self._exact.fit(text, n - self.caps.template_overhead if self._is_chat else n)
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
        body = _body_bytes(self.build_body(spec))
        now = self.clock.now_s

        def on_sent() -> None:
            record.sent_s = now()

        try:
            record.sent_s = now()  # replaced when the bytes really go; kept if the connection fails first
            async with transport.post(self.url, body, self._headers, on_sent) as resp:
                record.http_status = resp.status
                if resp.status >= 400:
                    raw = await resp.read()
                    retry = getattr(resp, "retry_after", None)
                    record.fail("error", self._http_error(resp.status, raw, retry), now())
                elif self.stream:
                    await self._read_stream(resp, record)
                else:
                    await self._read_whole(resp, record)
        except TransportError as e:
            if record.done_s is None:  # a connection that drops after the stream completed lost nothing
                record.fail(e.status, self._scrub(e.reason), now())
        finally:
            _settle_output_tokens(record, spec.max_tokens)

    async def _read_stream(self, resp: Response, record: RequestRecord) -> None:
        """Read an SSE stream into `record`. Complete when a choice carried a `finish_reason`, whether or not
        `data: [DONE]` follows (TGI, Ollama and LiteLLM may close without it); a stream that stops without
        any `finish_reason` was cut off, `[DONE]` or not, and is an error (llama.cpp ends an interrupted
        stream with `[DONE]` and no finish)."""
        parser = SSEParser()
        feed, data_events = parser.feed, parser.data_events
        now = self.clock.now_s
        times = record.chunk_times_s
        tokens = record.chunk_tokens
        is_chat = self._is_chat
        is_done = False
        finish: str | None = None
        error: str | None = None
        t = 0.0
        t_last = 0.0  # the last read that carried an event
        head = b""  # the first bytes, while no event has come: a JSON error body sent as a 200 stream
        chunks = resp.chunks().__aiter__()
        while True:
            try:
                raw = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except Exception:  # the client's own error: the transport maps it to a TransportError if re-raised
                if finish is None and not is_done:
                    raise
                # after a finish only a trailing usage chunk or [DONE] was lost; after [DONE] without a
                # finish (llama-cpp-python interrupting a stream drops the connection next) it is cut off
                break
            t = now()
            if is_done:
                continue  # read on to the end of the body so the connection can be reused
            num = 0
            # The common read: whole `data: {...}` events only, parsed straight from the bytes. Anything else
            # (a split event, other fields, bytes orjson refuses) takes the parser, which also says what is
            # wrong with a bad one; nothing of the read is taken until all of it parsed.
            datas = data_events(raw)
            objs = _parsed(datas)
            if objs is not None:
                t_last = t
                for obj, data in zip(objs, datas or (), strict=False):
                    if obj is None:  # [DONE]: whatever follows in this read is ignored, as below
                        is_done = True
                        break
                    got_num, reason, event_error = _read_event(obj, data, is_chat, record)
                    num += got_num
                    if reason is not None:
                        finish = reason
                    if event_error is not None:
                        error = event_error
                        break
            else:
                try:
                    events = feed(raw)
                except SSEDecodeError as e:  # the events before the bad line count; then the read fails
                    events, error = e.events, str(e)
                if not events and t_last == 0.0 and len(head) < 4096:
                    head += raw
                for ev in events:
                    t_last = t
                    text = ev.data
                    if text == DONE:
                        is_done = True
                        break
                    if ev.event == "error":
                        error = "server error mid-stream: " + _event_error_text(text)
                        break
                    try:
                        obj = _loads(text)
                    except ValueError:
                        obj = None
                    if type(obj) is not dict:
                        error = f"malformed JSON in SSE event: {text[:120]!r}"
                        break
                    # a good event's None must not clear the decode error of a later line in this read
                    got_num, reason, event_error = _read_event(obj, text, is_chat, record)
                    num += got_num
                    if reason is not None:
                        finish = reason
                    if event_error is not None:
                        error = event_error
                        break
            if num:  # tokens that came in the same read as a failure still count
                if not times:
                    record.first_token_s = t
                times.append(t)
                tokens.append(num)
            if error is not None:
                record.fail("error", self._scrub(_truncate(error)), now())
                return
        got = sum(tokens)
        if finish is None:
            if is_done:
                record.fail("error", f"cut off by the server after {got} tokens: [DONE] came with no finish_reason",
                             t_last)
            elif t_last == 0.0 and head.strip():
                record.fail("error", self._scrub(_truncate(_not_a_stream(head))), t or now())
            else:
                record.fail("error", f"stream ended after {got} tokens without a finish_reason or [DONE]", t or now())
            return
        record.done_s = t_last
        if not got:
            record.fail("error", f"no output: the stream finished (finish_reason={finish!r}) without a token")

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
        usage = obj.get("usage")
        if usage and type(usage) is dict:
            _take_usage(record, usage)
        choices = obj.get("choices")
        c = choices[0] if choices and type(choices) is list else None
        has_text = type(c) is dict and bool(
            _chat_output(c.get("message")) if self._is_chat else c.get("text")
        )
        if not has_text and not record.usage_output_tokens:
            record.fail("error", "no output: the response holds no generated text")
            return
        record.first_token_s = record.done_s  # the whole answer arrives at once

    # ---- errors ----------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def _http_error(self, status: int, raw: bytes, retry_after: str | None = None) -> str:
        text = raw.decode("utf-8", "replace")
        try:
            message = _error_message(json.loads(text), text)
        except ValueError:
            message = text
        # a 429 is recorded as one, with the server's Retry-After; it is never retried (the schedule is the test)
        label = f"HTTP {status} (rate limited)" if status == 429 else f"HTTP {status}"
        if retry_after and status in (429, 503):
            label = label[:-1] + f", Retry-After {' '.join(retry_after.split())[:40]})" if status == 429 else \
                f"{label} (Retry-After {' '.join(retry_after.split())[:40]})"
        message = " ".join(message.split()) or "(empty body)"
        # Scrub before truncating: a cut could otherwise leave a recognisable head of the key.
        return _truncate(f"{label}: {self._scrub(message)}")

    # ---- control plane ---------------------------------------------------------------------------------

    def _control_headers(self) -> dict[str, str]:
        return {k: v for k, v in self._headers.items() if k != "Accept"}

    async def discover_model(self) -> str:
        """The model to load: the one given, else the first the server lists at /models (`self.model` is
        set). A server that lists none is unreachable for this purpose: pass --model."""
        if self.model:
            return self.model
        url = self.base_url + "/models"
        async with ControlClient(timeout_s=self.preflight_timeout_s) as client:
            r = await self._control(client, "GET", url, what=f"GET {url}")
        if r.status != 200:
            raise TargetUnreachable(f"GET {url}: HTTP {r.status}; pass --model NAME")
        served = _served_models(r.body)
        if not served:
            raise TargetUnreachable(f"GET {url}: no model listed; pass --model NAME")
        self.model = served[0]
        self._set_caps(self.caps)
        return self.model

    async def preflight(self) -> str:
        """Find the model when none was given (`discover_model`), check the server answers for it, and
        settle what it accepts (`self.caps`).

        `/models` is advisory: a listing that names other models only is an error (a typo in --model), but
        a missing, failing or empty one is a note, and one tiny request decides. Then, with the "auto"
        profile, one probe per extension (see slobench.targets.capabilities); a fixed profile probes none.
        """
        model = await self.discover_model()
        url = self.base_url + "/models"
        notes: list[str] = []
        async with ControlClient(timeout_s=self.preflight_timeout_s) as client:
            r = await self._control(client, "GET", url)
            served = _served_models(r.body) if r.status < 400 else None
            owner = _owner(r.body, model) if served else None
            if r.status in (401, 403):
                raise TargetUnreachable(f"{url}: {self._http_error(r.status, r.body)}{_auth_hint(r)}")
            if served and model not in served:
                listing = ", ".join(repr(m) for m in served[:20])
                raise TargetUnreachable(f"{url}: model {model!r} is not served; served: {listing}")
            if not served:
                why = (f"HTTP {r.status}" if r.status >= 400 else
                       "an empty list" if served == [] else "no model list")
                notes.append(f"GET /models gave {why}; a request to {model!r} decides instead")
            await self._negotiate(client, notes, honours_ignore_eos=owner in HONOURS_IGNORE_EOS)
            if self.caps.probed and self._exact is None and (self._is_chat or not self.caps.token_prompts):
                await self._measure_words(client)
        self._set_caps(self.caps)
        if served:
            return f"{model} served at {self.base_url}"
        return f"{model} answers at {self.url}"

    async def _measure_words(self, client: ControlClient) -> None:
        """How many tokens the server counts a word of the text prompts (`ids_to_text`): the usage of
        WORDS_PROBE words less that of one word (a chat template's tokens cancel), over WORDS_PROBE - 1.
        The words are one token each in common BPE vocabularies; a character-level one counts several, and
        its prompts would be that many times the asked length. Off the 0.95-1.05 band, prompts are sent as
        length / ratio words (`words_for_tokens`), and a note says so. A server that reports no usage
        outside streams, or refuses the request, leaves prompts as they are. Only the "auto" profile measures
        (a fixed --server-profile sends no probe)."""
        counts = []
        for n in (1, WORDS_PROBE):
            resp = await self._control(client, "POST", self.url, self._probe_body(
                **({"messages": [{"role": "user", "content": ids_to_text(_WORD_IDS[:n])}]} if self._is_chat
                   else {"prompt": ids_to_text(_WORD_IDS[:n])})))
            usage = _usage_of(resp.body) if resp.status < 400 else None
            counted = None if usage is None else _count(usage.get("prompt_tokens"))
            if counted is None:
                return
            counts.append(counted)
        ratio = (counts[1] - counts[0]) / (WORDS_PROBE - 1)
        if ratio > 0 and not 0.95 <= ratio <= 1.05:
            self.caps = self.caps.with_note(
                f"the server counts {ratio:.2f} tokens a word of slobench's text prompts (measured): each prompt "
                f"is sent as its length / {ratio:.2f} words, so the server sees about the asked length "
                "(--tokenizer makes it exact)", tokens_per_word=round(ratio, 4))

    def _probe_body(self, **fields: Any) -> bytes:
        body: dict[str, Any] = {"model": self.model, "temperature": 0, "max_tokens": 1, "stream": False}
        if self._is_chat:
            body["messages"] = [{"role": "user", "content": "Hello"}]
        else:
            body["prompt"] = "Hello"
        body.update(self._extra_body)
        body.update(fields)
        return json.dumps(body).encode()

    async def _negotiate(self, client: ControlClient, notes: list[str], *, honours_ignore_eos: bool) -> None:
        caps = self.caps
        for attempt in range(_PROBE_TRIES):  # a transient 5xx is tried again; a 4xx is an answer
            r = await self._control(client, "POST", self.url, self._probe_body())
            if r.status < 500 or attempt == _PROBE_TRIES - 1:
                break
            await asyncio.sleep(_PROBE_BACKOFF_S * (attempt + 1))
        if r.status >= 400:
            raise TargetUnreachable(
                f"{self.url}: the server refused the plainest request (text prompt, max_tokens=1, none of "
                f"slobench's extensions): {self._http_error(r.status, r.body)}{_auth_hint(r)}"
            )
        overhead = 0
        plain_usage = _usage_of(r.body)
        if self._is_chat and plain_usage and self._exact is not None:
            prompt_tokens = _count(plain_usage.get("prompt_tokens"))
            if prompt_tokens is not None:
                overhead = max(0, prompt_tokens - self._exact.count("Hello"))
                notes.append(f"the chat template adds {overhead} prompt tokens (measured); text prompts are "
                             "shortened by that much")
        caps = replace(caps, template_overhead=overhead)
        if caps.profile != "auto":
            self.caps = replace(caps, notes=(*notes, *caps.notes))
            return
        caps = Capabilities("auto", probed=True, template_overhead=overhead, notes=tuple(notes),
                            pair_min_tokens=not honours_ignore_eos)

        async def refused(field_name: str, **fields: Any) -> str | None:
            # a failure that is not a refusal (a 503, a flaky 500) is tried again before the run is given up
            message = ""
            for attempt in range(_PROBE_TRIES):
                resp = await self._control(client, "POST", self.url, self._probe_body(**fields))
                if resp.status < 400:
                    return None
                message = self._http_error(resp.status, resp.body)
                if is_refusal(resp.status, message, field_name):
                    return message
                if attempt < _PROBE_TRIES - 1:
                    await asyncio.sleep(_PROBE_BACKOFF_S * (attempt + 1))
            raise TargetUnreachable(f"{self.url}: probing {field_name} failed {_PROBE_TRIES} times: {message}")

        if not self._is_chat:
            # The probe asks whether the server takes ids at all, so its ids must be in every vocabulary:
            # ids past a small vocabulary's end are refused too, and falling back to text for that turned
            # a byte-level model's 32-token prompts into ~150-token ones (the torch demo ran 8x slower).
            why = await refused("prompt", prompt=list(_PROBE_IDS))
            if why:
                caps = caps.with_note(f"token-id prompts refused ({why}); prompts sent as text "
                                      "(the server's usage counts their tokens)", token_prompts=False)
        why_eos = await refused("ignore_eos", ignore_eos=True)
        why_min = await refused("min_tokens", min_tokens=1)
        if why_eos and why_min:
            caps = caps.with_note(
                f"ignore_eos refused ({why_eos}) and min_tokens refused ({why_min}): output lengths cannot "
                "be enforced, the server may stop early (requested vs produced lengths are reported)",
                ignore_eos=False, min_tokens=False)
        elif why_eos:
            caps = caps.with_note(f"ignore_eos refused ({why_eos}); min_tokens = max_tokens enforces output "
                                  "lengths instead", ignore_eos=False)
        elif why_min:
            caps = caps.with_note(f"min_tokens refused ({why_min}); ignore_eos alone enforces output lengths",
                                  min_tokens=False)
        if self.stream:
            body = self._probe_body(stream=True, stream_options={"include_usage": True}, max_tokens=2)
            resp = await self._control(client, "POST", self.url, body)
            message = self._http_error(resp.status, resp.body) if resp.status >= 400 else ""
            if resp.status >= 400 and is_refusal(resp.status, message, "stream_options"):
                caps = caps.with_note(f"stream_options.include_usage refused ({message}); output tokens are "
                                      "counted from the stream", include_usage=False, usage_in_stream=False)
            elif resp.status >= 400:
                raise TargetUnreachable(f"{self.url}: a streamed request failed: {message}")
            elif not _stream_has_usage(resp.body):
                caps = caps.with_note("the server sends no usage in streams (include_usage asked); output "
                                      "tokens are counted from the stream's chunks", usage_in_stream=False)
            else:
                caps = replace(caps, usage_in_stream=True)
        self.caps = caps

    async def _control(
        self, client: ControlClient, method: str, url: str, body: bytes | None = None, *, what: str | None = None
    ) -> Reply:
        try:
            return await client.request(method, url, body, headers=self._control_headers())
        except TransportError as e:
            raise TargetUnreachable(self._scrub(f"{what or url}: {e}")) from None


def make_transport(
    name: TransportName, *, timeout_s: float, connect_timeout_s: float, http2: bool = False
) -> Transport:
    """The load's client: `raw` (HTTP/1.1, the least CPU per request) or `httpx` (HTTP/2 with `http2`)."""
    if name == "httpx":
        return HttpxTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, http2=http2)
    if name == "raw" and not http2:
        return RawHttpTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)  # type: ignore[return-value]
    raise UsageError(f"transport: must be 'raw' or 'httpx' (got {name!r}{', http2' if http2 else ''})")


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """`http://u:p@host/v1` -> (`http://host/v1`, `Basic <base64 u:p>`); a URL without credentials as is."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    import base64
    from urllib.parse import unquote, urlunsplit

    host = parts.netloc.rsplit("@", 1)[1]
    creds = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    return urlunsplit(parts._replace(netloc=host)), "Basic " + base64.b64encode(creds).decode()


def _normalise_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError("url", base_url, "must be an http(s) URL such as http://localhost:8000/v1")
    url = base_url.rstrip("/")
    if parts.path in ("", "/"):
        url += "/v1"
    return url


def _body_bytes(body: dict[str, Any]) -> bytes:
    """A request body: orjson (a tenth of json.dumps' CPU, and it runs once per request), or json for what
    orjson refuses (an int past 64 bits, a type it does not know in a user's --extra-body)."""
    try:
        return _orjson_dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()


def _parsed(datas: list[bytes] | None) -> list[dict[str, Any] | None] | None:
    """Each event's JSON object (None for `[DONE]`, which ends the list), or None if any is not an object:
    then the whole read goes through the SSE parser instead."""
    if datas is None:
        return None
    objs: list[dict[str, Any] | None] = []
    for data in datas:
        if data == b"[DONE]":
            objs.append(None)
            return objs
        try:
            obj = _loads(data)
        except ValueError:
            return None
        if type(obj) is not dict:
            return None
        objs.append(obj)
    return objs


def _read_event(obj: dict[str, Any], data: str | bytes, is_chat: bool,
                record: RequestRecord) -> tuple[int, str | None, str | None]:
    """One streamed event's JSON: (tokens it carried, its finish_reason or None, an error or None). A usage
    object is taken onto `record` as it comes."""
    num = 0
    finish: str | None = None
    choices = obj.get("choices")
    if choices and type(choices) is list:
        c = choices[0]
        if type(c) is dict:
            text = _chat_output(c.get("delta")) if is_chat else c.get("text")
            if text:
                num = _tokens_in(c, is_chat)
            reason = c.get("finish_reason")
            if reason and type(reason) is str:
                finish = reason
    elif "error" in obj or obj.get("object") == "error":
        text = data if type(data) is str else data.decode("utf-8", "replace")  # type: ignore[union-attr]
        return 0, None, "server error mid-stream: " + _error_message(obj, text)
    usage = obj.get("usage")
    if usage and type(usage) is dict:
        _take_usage(record, usage)
    return num, finish, None


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


_MAX_PLAUSIBLE_TOKENS = 10_000_000  # a count above this is not a token count


def _count(v: Any) -> int | None:
    """A token count from usage: a non-negative int (not a bool) no larger than any real request."""
    if type(v) is int and 0 <= v <= _MAX_PLAUSIBLE_TOKENS:
        return v
    return None


def _take_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    """Read a usage object; implausible values (negative, huge, wrong type) are not taken. An all-zero usage
    (LiteLLM puts one on every chunk) says nothing and leaves earlier values alone."""
    completion = _count(usage.get("completion_tokens"))
    prompt = _count(usage.get("prompt_tokens"))
    if not completion and not prompt:
        return
    if completion is not None:
        record.usage_output_tokens = completion
    if prompt is not None:
        record.prompt_tokens = prompt
    details = usage.get("prompt_tokens_details")  # OpenAI, vLLM (--enable-prompt-tokens-details), SGLang
    if isinstance(details, dict):
        cached = _count(details.get("cached_tokens"))
        if cached is not None and (prompt is None or cached <= prompt):
            record.cached_tokens = cached


def _settle_output_tokens(record: RequestRecord, max_tokens: int) -> None:
    """output_tokens: the server's usage where it is plausible, else what the stream carried.

    The usage count is kept beside it (`usage_output_tokens`) either way, so a disagreement stays visible:
    usage below the tokens streamed (each content event is at least one), or above `max_tokens`, cannot be true, and then the counted
    tokens are used (TPOT must not be computed from a made-up count)."""
    counted = sum(record.chunk_tokens)
    usage = record.usage_output_tokens
    if usage is None or (usage == 0 and counted):
        record.output_tokens = counted
    elif usage < counted or usage > max_tokens:  # every content event carried at least one token
        record.output_tokens = counted
    else:
        record.output_tokens = usage


def _not_a_stream(head: bytes) -> str:
    """What to say of a 200 answer to a streamed request that held no SSE event."""
    text = head.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return f"no SSE events in the stream: {text[:120]!r}"
    if isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error"):
        return "server error: " + _error_message(obj, text)
    return f"no SSE events in the stream (a JSON body instead): {text[:120]!r}"


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


def _usage_of(raw: bytes) -> dict[str, Any] | None:
    try:
        usage = json.loads(raw).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None


def _stream_has_usage(raw: bytes) -> bool:
    """Whether a whole streamed body holds a usage object with a non-zero count."""
    try:
        events = SSEParser().feed(raw + b"\n\n")
    except SSEDecodeError:
        return False
    for ev in events:
        try:
            obj = json.loads(ev.data)
        except ValueError:
            continue
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict) and (_count(usage.get("completion_tokens")) or _count(usage.get("prompt_tokens"))):
            return True
    return False


def _owner(raw: bytes, model: str) -> str | None:
    """The `owned_by` of `model` in a /models listing (vLLM says "vllm", SGLang "sglang")."""
    try:
        for m in json.loads(raw)["data"]:
            if str(m.get("id")) == model:
                return str(m.get("owned_by") or "") or None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def _served_models(raw: bytes) -> list[str] | None:
    try:
        data = json.loads(raw)["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return None


def _auth_hint(r: Reply) -> str:
    return " (check the API key)" if r.status in (401, 403) else ""


def _redacted_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(h in k.lower() for h in _SECRET_BODY_HINTS) else v) for k, v in body.items()}
