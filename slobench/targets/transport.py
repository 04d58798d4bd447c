"""The HTTP seam: every request slobench makes goes through here. The load: POST a body, get a status and
a stream of raw byte chunks (`Transport`). Setup and monitoring: `ControlClient` (whole, short requests).
No other module builds an HTTP client (tests/test_cli_layout.py holds that).

The load's default is `raw` (`slobench.targets.rawhttp`, HTTP/1.1 on asyncio's own transports): measured
at 0.64-0.77 ms of CPU per 16-token streamed request at 400 req/s on one core, 0.80-0.84x a minimal aiohttp
client's and 0.7-0.8x slobench's on aiohttp (issue 16, benchmarks/client_overhead.py); it passes the same
conformance suites (LiteLLM proxy, llama.cpp server, the quirk servers). aiohttp (`--transport aiohttp`)
was the default before: a third of httpx's CPU per streamed request, and it held 400 req/s where httpx's
pool fell over (issue 2). httpx stays available for HTTP/2 targets.

Pool sizing: aiohttp's connector is built with `limit=0, limit_per_host=0` (no cap), httpx's with an
explicit large `max_connections`, so the client never silently queues requests behind a pool limit;
open-loop load must reach the server when it is scheduled. Keep-alive is on, so a finished stream's
connection is reused by the next request.

Every exception from aiohttp, httpx or the socket layer is turned into a `TransportError(status, reason)`
in exactly one place, `translate_error`, so the target above handles one kind of failure.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import SimpleNamespace
from typing import Literal, Protocol

import aiohttp
import httpx

from slobench.errors import UsageError
from slobench.run.records import Status

TransportName = Literal["aiohttp", "httpx", "raw"]  # raw: slobench.targets.rawhttp
_HTTPX_MAX_CONNECTIONS = 65_536  # "no cap" for httpx; its `None` was measured to collapse under load
_KEEPALIVE_S = 4.0


class TransportError(Exception):
    """A request failed below HTTP: connect, reset, timeout. `status` goes straight onto the record."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason


class Response(Protocol):
    status: int
    retry_after: str | None  # the Retry-After header of a 429 or 503, as sent

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, in whatever pieces the network delivers."""
        ...

    async def read(self) -> bytes: ...


class Transport(Protocol):
    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AbstractAsyncContextManager[Response]:
        """POST and yield the response once its headers are in. `on_sent` is called immediately before
        the request's bytes are handed to the socket, after connection set-up and the client's own work."""
        ...

    async def close(self) -> None: ...


class _AiohttpResponse:
    __slots__ = ("status", "retry_after", "_resp")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.status = resp.status
        self.retry_after = resp.headers.get("Retry-After") if resp.status >= 400 else None
        self._resp = resp

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()

    async def read(self) -> bytes:
        return await self._resp.read()


class AiohttpTransport:
    def __init__(self, *, timeout_s: float, connect_timeout_s: float) -> None:
        self._timeouts = (timeout_s, connect_timeout_s)
        # Idle connections are dropped after 4 s, below uvicorn's 5 s keep-alive (vLLM, SGLang): reusing a
        # connection the server is closing at that instant would fail a request for nothing.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S)
        # On Python < 3.12 aiohttp writes the body from a task started one loop iteration after `post()`
        # is called; under load that wait is long. The chunk-sent hook fires right before the write, so
        # the send stamp excludes the client's own queueing (which shows up as lateness instead).
        # Measured: stamp-to-server-receive 0.25 ms stamping before post(), 0.12 ms with the hook
        # (the raw-socket floor is 0.14 ms), at no measurable CPU cost.
        sent_hook = aiohttp.TraceConfig()
        sent_hook.on_request_chunk_sent.append(_call_on_sent)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s),
            raise_for_status=False,
            trace_configs=[sent_hook],
        )

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AsyncIterator[Response]:
        try:
            async with self._session.post(url, data=body, headers=headers, trace_request_ctx=on_sent) as resp:
                yield _AiohttpResponse(resp)
        except Exception as e:
            t = translate_error(e, *self._timeouts)
            if t is e:
                raise
            raise t from e

    async def close(self) -> None:
        await self._session.close()


async def _call_on_sent(_session: object, ctx: SimpleNamespace, _params: object) -> None:
    on_sent = ctx.trace_request_ctx
    if on_sent is not None:
        on_sent()


class _HttpxResponse:
    __slots__ = ("status", "retry_after", "_resp")

    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self.retry_after = resp.headers.get("Retry-After") if resp.status_code >= 400 else None
        self._resp = resp

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.aiter_raw()

    async def read(self) -> bytes:
        return await self._resp.aread()


class HttpxTransport:
    def __init__(self, *, timeout_s: float, connect_timeout_s: float, http2: bool = False) -> None:
        if http2:
            try:
                import h2  # noqa: F401
            except ImportError:
                raise UsageError("http2=True needs the h2 package: pip install 'httpx[http2]'") from None
        self._timeouts = (timeout_s, connect_timeout_s)
        limits = httpx.Limits(
            max_connections=_HTTPX_MAX_CONNECTIONS,
            max_keepalive_connections=_HTTPX_MAX_CONNECTIONS,
            keepalive_expiry=_KEEPALIVE_S,
        )
        # httpx has no total timeout, only per-operation ones; the total is enforced with asyncio.timeout.
        self._client = httpx.AsyncClient(
            http2=http2, limits=limits, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s)
        )

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None
    ) -> AsyncIterator[Response]:
        ext = {"trace": _httpcore_trace(on_sent)} if on_sent is not None else None
        try:
            async with asyncio.timeout(self._timeouts[0]):
                async with self._client.stream(
                    "POST", url, content=body, headers=headers, extensions=ext
                ) as resp:
                    yield _HttpxResponse(resp)
        except Exception as e:
            t = translate_error(e, *self._timeouts)
            if t is e:
                raise
            raise t from e

    async def close(self) -> None:
        await self._client.aclose()


def _httpcore_trace(on_sent: Callable[[], None]) -> Callable[[str, dict[str, object]], Awaitable[None]]:
    async def trace(event: str, _info: dict[str, object]) -> None:
        # "http11.send_request_headers.started" or the http2 equivalent: the request's first bytes go now.
        if event.endswith("send_request_headers.started"):
            on_sent()

    return trace


def make_transport(
    name: TransportName, *, timeout_s: float, connect_timeout_s: float, http2: bool = False
) -> AiohttpTransport | HttpxTransport:
    """Build a transport; must be called inside a running event loop (aiohttp binds to it)."""
    if name == "aiohttp":
        if http2:
            raise UsageError("http2=True needs transport='httpx' (aiohttp speaks HTTP/1.1 only)")
        return AiohttpTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
    if name == "httpx":
        return HttpxTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, http2=http2)
    if name == "raw" and not http2:
        from slobench.targets.rawhttp import RawHttpTransport  # imports this module: not at its top

        return RawHttpTransport(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)  # type: ignore[return-value]
    raise UsageError(f"transport: must be 'aiohttp', 'httpx' or 'raw' (got {name!r}{', http2' if http2 else ''})")


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
    applies to them. Failures below HTTP are a `TransportError`, translated in `translate_error` like the
    load's; an HTTP error status is a `Reply` like any other.

    httpx, as setup has always used: its one-off client needs no running loop to be built.
    """

    def __init__(self, *, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        if not timeout_s > 0:
            raise UsageError(f"timeout_s: must be > 0 seconds (got {timeout_s!r})")
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=dict(headers or {}))

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Reply:
        try:
            async with asyncio.timeout(self.timeout_s):
                r = await self._client.request(method, url, content=body, headers=headers)
        except Exception as e:
            t = translate_error(e, self.timeout_s, self.timeout_s)
            if t is e:
                raise
            raise t from e
        return Reply(r.status_code, r.content)

    async def get(self, url: str, headers: Mapping[str, str] | None = None) -> Reply:
        return await self.request("GET", url, headers=headers)

    async def close(self) -> None:
        await self._client.aclose()


def translate_error(e: Exception, timeout_s: float, connect_timeout_s: float) -> Exception:
    """The one place lower-library exceptions become TransportError. Anything else passes through."""
    if isinstance(e, TransportError):
        return e
    # Connect timeouts first: aiohttp's ConnectionTimeoutError is also a TimeoutError.
    if isinstance(e, aiohttp.ConnectionTimeoutError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return TransportError("timeout", f"connect timed out after {connect_timeout_s:g} s")
    if isinstance(e, TimeoutError | httpx.TimeoutException):
        return TransportError("timeout", f"request timed out after {timeout_s:g} s")
    if isinstance(e, aiohttp.ClientConnectorError):
        return TransportError("error", f"cannot connect to {e.host}:{e.port}: {_os_reason(e.os_error)}")
    if isinstance(e, httpx.ConnectError):
        return TransportError("error", f"cannot connect: {_chain_reason(e)}")
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return TransportError("error", "server closed the connection before the response ended")
    if isinstance(e, aiohttp.ClientPayloadError):
        # aiohttp keeps the socket error only as text inside its message.
        is_reset = "reset by peer" in str(e).lower()
        why = "connection reset by peer" if is_reset else "connection closed before the body ended"
        return TransportError("error", f"connection lost mid-response ({why})")
    if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError):
        return TransportError("error", f"connection lost mid-response ({_chain_reason(e)})")
    if isinstance(e, aiohttp.ClientError | httpx.HTTPError):
        return TransportError("error", f"{type(e).__name__}: {_chain_reason(e)}")
    if isinstance(e, OSError):  # a reset surfacing raw from the socket layer
        return TransportError("error", f"connection error: {_os_reason(e)}")
    return e


def _os_reason(e: BaseException) -> str:
    # asyncio puts "Connect call failed (addr)" in strerror; the errno says why in plain words.
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno).lower()
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


def _chain_reason(e: BaseException) -> str:
    """The most specific message in the exception chain (libraries wrap the socket error)."""
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in reversed(seen):
        if isinstance(exc, OSError) and (exc.errno or exc.strerror):
            return _os_reason(exc)
    return str(e) or type(e).__name__
