"""The HTTP seam: every request slobench makes goes through here or through `slobench.targets.rawhttp`.

The load: POST a body, get a status and a stream of raw byte chunks (`Transport`), or have the body handed
to a reader's synchronous step as each read arrives (`FeedingTransport`, the raw client). Its clients are
`raw` (`RawHttpTransport`, the default: HTTP/1.1 on asyncio's own transports, the least CPU per request)
and `httpx` (`HttpxTransport`, for HTTP/2 targets). Setup and monitoring: `ControlClient` (whole, short
requests). No other module imports an HTTP library (tests/test_cli_layout.py holds that).

A failure below HTTP (connect, reset, timeout) reaches the target as one kind of exception,
`TransportError(status, reason)`: the raw client raises it itself; whatever httpx or the socket layer
raises becomes one in exactly one place, `map_errors`. Neither client follows a redirect (a 3xx is an error
naming its status and Location: a key must not travel to another host), and every whole body is read within
a size limit (`read_body`, slobench.targets.bounds).
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, contextmanager
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from slobench.errors import UsageError
from slobench.redact import redact_url
from slobench.run.records import Status
from slobench.targets.bounds import ACCEPT_ENCODING, DEFAULT_MAX_BODY_BYTES, Decoder, over_limit

KEEPALIVE_S = 4.0  # idle connections are dropped after this, below uvicorn's 5 s keep-alive (vLLM, SGLang)
# "no cap" for httpx: open-loop load must reach the server when it is scheduled, never queue behind a pool
# limit; httpx's own `None` collapses under load
_HTTPX_MAX_CONNECTIONS = 65_536


NO_ANSWER = "server closed the connection before the response ended"  # and no byte of an answer had come
# how h11 words a connection that closed (anything else it refuses is bytes that are not HTTP/1.1)
_CLOSED_WORDS = ("disconnected", "peer closed")


class TransportError(Exception):
    """A request failed below HTTP: connect, reset, timeout. `status` goes straight onto the record."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason


class BodyTooLarge(TransportError):
    """A body refused for its size (`read_body`): the reason names the limit and its flag."""


class Response(Protocol):
    status: int
    retry_after: str | None  # the Retry-After header of a 429 or 503, as sent
    location: str | None  # the Location header of a 3xx (never followed), as sent
    retried: str | None  # why the request was sent a second time, on a new connection (None: sent once)
    # optional, read with getattr: `async drain(within_s)`, which reads the rest of the body for `within_s`
    # at most (else the caller reads `chunks()` under a timeout)

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, in whatever pieces the network delivers."""
        ...

    async def read(self) -> bytes:
        """The whole body, within the transport's size limit (else a `TransportError` naming it)."""
        ...


Feed = Callable[[bytes], bool]
"""A stream reader's step: one piece of a body in, as it arrives; True once it wants no more."""


class FedResponse(Response, Protocol):
    """The answer of a `FeedingTransport`: its body went to `feed`, and the request's task awaits `fed`."""

    async def fed(self) -> None:
        """Return once `feed` wants no more or the body ended; raise what `feed` raised, or the request's
        `TransportError` (a timeout, a dropped connection) when it failed before `feed` was done."""
        ...

    async def drain(self, within_s: float) -> None: ...


class Transport(Protocol):
    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AbstractAsyncContextManager[Response]:
        """POST and yield the response once its headers are in. `on_sent` is called immediately before
        the request's bytes are handed to the socket, after connection set-up and the client's own work."""
        ...

    async def close(self) -> None: ...


class FeedingTransport(Protocol):
    """A transport that hands a successful answer's body (status below 300) to `feed` from its own network
    callback as each read arrives, instead of through `chunks()`: no task switch a read, and the reader's
    stamp is the read's arrival. `feeds_body` says a transport is one (read with getattr). An exception in
    `feed` never reaches the event loop's protocol machinery: `fed()` raises it in the request's task."""

    feeds_body: bool

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None,
        feed: Feed | None = None,
    ) -> AbstractAsyncContextManager[FedResponse]: ...

    async def close(self) -> None: ...


@contextmanager
def map_errors(timeout_s: float, connect_timeout_s: float) -> Iterator[None]:
    """Turn what httpx or the socket layer raises inside the block into a `TransportError`, raised from it.
    A `TransportError` and anything else (a bug, a cancellation) pass through as they are."""
    try:
        yield
    except TransportError:
        raise
    except Exception as e:
        mapped = _mapped(e, timeout_s, connect_timeout_s)
        if mapped is None:
            raise
        raise mapped from e


def _mapped(e: Exception, timeout_s: float, connect_timeout_s: float) -> TransportError | None:
    if isinstance(e, httpx.ConnectTimeout | httpx.PoolTimeout):
        return TransportError("timeout", f"connect timed out after {connect_timeout_s:g} s")
    if isinstance(e, TimeoutError | httpx.TimeoutException):
        return TransportError("timeout", f"request timed out after {timeout_s:g} s")
    if isinstance(e, httpx.ConnectError):
        return TransportError("error", f"cannot connect: {chain_reason(e)}")
    if isinstance(e, httpx.RemoteProtocolError) and "without sending a response" in str(e):
        return TransportError("error", NO_ANSWER)  # the raw client's words for the same close
    if isinstance(e, httpx.RemoteProtocolError) and not any(w in str(e) for w in _CLOSED_WORDS):
        return TransportError("error", f"invalid HTTP response: {e}")  # h11 refused the bytes
    if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError):
        return TransportError("error", f"connection lost mid-response ({chain_reason(e)})")
    if isinstance(e, httpx.HTTPError):
        return TransportError("error", f"{type(e).__name__}: {chain_reason(e)}")
    if isinstance(e, OSError):  # a reset surfacing raw from the socket layer
        return TransportError("error", f"connection error: {os_reason(e)}")
    return None


def endpoint_url(base_url: str, path: str) -> str:
    """`path` under the base URL's path, its query kept after it: `http://h/v1?api_key=k` and `/models`
    give `http://h/v1/models?api_key=k` (a server that takes its key in the query gets it on every call)."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def redirect_reason(status: int, location: str | None) -> str:
    """What a request answered by a redirect says: it is not followed, a key must not reach another host."""
    where = " ".join((location or "").split())[:200]
    to = f" to {redact_url(where)}" if where else " (no Location)"
    return f"HTTP {status} redirect{to}: not followed; give the URL the server answers at"


def is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304


def no_body_reason(status: int) -> str | None:
    """What a record says of an answer that cannot carry a completion, its status named: a 1xx that
    reached the reader (101), 204 No Content, 205 Reset Content, 304 Not Modified. None for any other."""
    if status < 200 or status in (204, 205, 304):
        try:
            phrase = f" {HTTPStatus(status).phrase}"
        except ValueError:
            phrase = ""
        return f"HTTP {status}{phrase}: an answer with no body, where a completion was expected"
    return None


async def read_body(chunks: AsyncIterator[bytes], content_encoding: str | None, max_bytes: int,
                    flag: str = "--max-body") -> bytes:
    """A whole body, decompressed, refused with a `TransportError` naming `flag` once past `max_bytes`."""
    try:
        decoder = Decoder(content_encoding)
    except ValueError as e:
        raise TransportError("error", f"response refused: {e}") from None
    out = bytearray()
    async for raw in chunks:
        try:
            piece = decoder.decode(raw, max_bytes - len(out) + 1)
        except ValueError as e:
            raise TransportError("error", f"response refused: {e}") from None
        if len(out) + len(piece) > max_bytes:
            raise BodyTooLarge("error", over_limit(max_bytes, flag, decoder.encoding))
        out += piece
    return bytes(out)


def os_reason(e: BaseException) -> str:
    """An OSError in plain words: asyncio puts "Connect call failed (addr)" in strerror, the errno says why."""
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno).lower()
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


def chain_reason(e: BaseException) -> str:
    """The most specific message in the exception chain (libraries wrap the socket error)."""
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in reversed(seen):
        if isinstance(exc, OSError) and (exc.errno or exc.strerror):
            return os_reason(exc)
    return str(e) or type(e).__name__


class _HttpxResponse:
    __slots__ = ("status", "retry_after", "location", "retried", "_resp", "_max_body")

    def __init__(self, resp: httpx.Response, max_body_bytes: int, retried: str | None = None) -> None:
        self.status = resp.status_code
        self.retried = retried
        self.retry_after = resp.headers.get("Retry-After") if resp.status_code >= 400 else None
        self.location = resp.headers.get("Location") if is_redirect(resp.status_code) else None
        self._resp = resp
        self._max_body = max_body_bytes

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.aiter_raw()

    async def read(self) -> bytes:
        return await read_body(self._resp.aiter_raw(), self._resp.headers.get("Content-Encoding"), self._max_body)


class HttpxTransport:
    """The load's client on httpx: HTTP/2 when asked (`http2=True`), keep-alive, no pool cap. It asks for
    uncompressed bodies: streams are read as they come off the wire."""

    def __init__(self, *, timeout_s: float, connect_timeout_s: float, http2: bool = False,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if http2:
            try:
                import h2  # noqa: F401
            except ImportError:
                raise UsageError("http2=True needs the h2 package: pip install 'httpx[http2]'") from None
        self._timeouts = (timeout_s, connect_timeout_s)
        self._max_body = max_body_bytes
        limits = httpx.Limits(
            max_connections=_HTTPX_MAX_CONNECTIONS,
            max_keepalive_connections=_HTTPX_MAX_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_S,
        )
        # httpx has no total timeout, only per-operation ones; the total is enforced with asyncio.timeout.
        settings: dict[str, Any] = dict(
            http2=http2, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers={"Accept-Encoding": "identity"}, follow_redirects=False, verify=tls_context())
        self._client = httpx.AsyncClient(limits=limits, **settings)
        self._clients = (self._client, _Fresh(settings))

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AsyncIterator[Response]:
        with map_errors(*self._timeouts):
            async with asyncio.timeout(self._timeouts[0]), AsyncExitStack() as stack:
                resp, retried = await open_stream(stack, self._clients, "POST", url, body, headers, on_sent)
                yield _HttpxResponse(resp, self._max_body, retried)

    async def close(self) -> None:
        await self._client.aclose()
        await self._clients[1].aclose()


class _Fresh:
    """The client a resend goes through, made at the first resend: it keeps no connection, so each
    request it sends opens a new one."""

    __slots__ = ("_settings", "_client")

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self._client: httpx.AsyncClient | None = None

    def __call__(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), **self._settings)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class _Attempt:
    """httpcore's trace of one try: whether it opened a connection, and its send (`on_sent`)."""

    __slots__ = ("connected", "on_sent")

    def __init__(self, on_sent: Callable[[], None] | None) -> None:
        self.connected = False
        self.on_sent = on_sent

    async def __call__(self, event: str, _info: dict[str, object]) -> None:
        if event.startswith("connection.connect_tcp."):
            self.connected = True
        # "http11.send_request_headers.started" or the http2 equivalent: the request's first bytes go now.
        elif self.on_sent is not None and event.endswith("send_request_headers.started"):
            self.on_sent()


async def open_stream(stack: AsyncExitStack, clients: tuple[httpx.AsyncClient, Callable[[], httpx.AsyncClient]],
                      method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None,
                      on_sent: Callable[[], None] | None = None) -> tuple[httpx.Response, str | None]:
    """Send a request and enter its response on `stack` once the head is in; and why it was sent a second
    time, or None. A request that fails on a kept-alive connection before an answer began (the server
    closed the connection as it left: a write error, a reset before the head, a close with no byte back)
    is sent once more, through `clients[1]()` (a client that keeps no connection: httpx's pool could
    hand the resend another connection the server is closing); its `on_sent` is called for the first send only. httpx does not say whether a
    reset came after part of a head: a reset before the whole head counts as no answer."""
    retried = None
    for attempt in (0, 1):
        trace = _Attempt(on_sent if attempt == 0 else None)
        try:
            client = clients[0] if attempt == 0 else clients[1]()
            stream = client.stream(method, url, content=body, headers=headers, extensions={"trace": trace})
            return await stack.enter_async_context(stream), retried
        except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError) as e:
            no_answer = not isinstance(e, httpx.RemoteProtocolError) or "without sending a response" in str(e)
            if attempt or trace.connected or not no_answer:
                raise
            retried = f"connection lost before the response ({chain_reason(e)})"
    raise AssertionError("unreachable")


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once a process: each client building its own loads the
    CA bundle again (~50 ms of CPU; a run builds several control clients)."""
    return httpx.create_ssl_context()


class Reply:
    """A whole response to a control request: its status and body."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Reply({self.status}, {len(self.body)} bytes)"


class ControlClient:
    """Setup and monitoring HTTP (preflight and its probes, model discovery, /metrics scrapes): short
    requests read whole, each bounded by `timeout_s` in total. Kept apart from the load's transport so a
    slow scrape or probe never holds a connection the load needs, and so a 600 s request timeout never
    applies to them. Failures below HTTP are a `TransportError` (`map_errors`), like the load's; an HTTP
    error status is a `Reply` like any other, a redirect a `TransportError` (not followed). A body past
    `max_body_bytes`, compressed or once inflated, is a `TransportError` naming `limit_flag`. On httpx: its
    one-off client needs no running loop to be built.
    """

    def __init__(self, *, timeout_s: float, headers: Mapping[str, str] | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, limit_flag: str = "--max-body") -> None:
        if not timeout_s > 0:
            raise UsageError(f"timeout_s: must be > 0 seconds (got {timeout_s!r})")
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._limit_flag = limit_flag
        settings: dict[str, Any] = dict(timeout=timeout_s, headers={"Accept-Encoding": ACCEPT_ENCODING, **(headers or {})},
                                        follow_redirects=False, verify=tls_context())
        self._client = httpx.AsyncClient(**settings)
        self._clients = (self._client, _Fresh(settings))

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Reply:
        with map_errors(self.timeout_s, self.timeout_s):
            async with asyncio.timeout(self.timeout_s), AsyncExitStack() as stack:
                r, _ = await open_stream(stack, self._clients, method, url, body, headers)
                if is_redirect(r.status_code):
                    raise TransportError("error", redirect_reason(r.status_code, r.headers.get("Location")))
                raw = await read_body(r.aiter_raw(), r.headers.get("Content-Encoding"), self.max_body_bytes,
                                      self._limit_flag)
        return Reply(r.status_code, raw)

    async def get(self, url: str, headers: Mapping[str, str] | None = None) -> Reply:
        return await self.request("GET", url, headers=headers)

    async def close(self) -> None:
        await self._client.aclose()
        await self._clients[1].aclose()
