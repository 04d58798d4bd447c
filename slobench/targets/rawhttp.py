"""A lean HTTP/1.1 client on asyncio's transports: the load's default (`--transport raw`).

It does only what a POST of a prebuilt body and a streamed answer need, and hands the body's bytes to
the reader as they arrive: to its synchronous `feed` step from the connection's own callback, or kept for
its task (`chunks()`). A pooled connection the server closed while idle is noticed before it is used;
a request whose write or first read fails on a kept-alive connection before any byte of an answer came
back (the server closed it as the request left: after an error answer, at its keep-alive timeout) is
sent once more, on a new connection, and its response says why (`retried`); one that got any byte back is
never sent again. Response heads are read by `slobench.targets.http1` (RFC 9112, ASCII digits only). Every failure is a `TransportError`, its status and wording what the record will carry.
The URL's path and query are percent-encoded where they hold what a request line cannot carry; a redirect
is not followed; a whole body (`read`) is refused past the size limit.
Not supported: HTTP/2, proxies, compressed streams (`Accept-Encoding: identity` is sent; a whole body the
server compresses anyway is inflated within the limit), `Expect: 100-continue`.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import quote, urlsplit

from slobench.errors import UsageError
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES
from slobench.targets.http1 import (
    CHUNKED,
    DONE,
    HEAD,
    HEX_DIGITS,
    LENGTH,
    UNTIL_CLOSE,
    Head,
    ProtocolError,
    chunk_size,
    head_end,
    parse_head,
)
from slobench.targets.transport import (
    KEEPALIVE_S,
    NO_ANSWER,
    Feed,
    TransportError,
    is_redirect,
    os_reason,
    read_body,
)

_MAX_HEAD = 65_536  # bytes of status line + headers, and of one chunk-size line, before the answer is refused
_MAX_PIECES = 64  # network reads (each up to 256 KiB) held for a reader that is behind, before reading pauses
# said of a resend that failed too (the first send's failure is in the record's `retried`)
_RESENT = "(sent again on a new connection: the server had closed the kept-alive one as the request left)"
_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})
# what a request target keeps as it is (RFC 3986's unreserved, sub-delims, ":" "@" "/", and "%" of an
# escape already made); anything else (a space, a non-ASCII character as UTF-8) is percent-encoded
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_QUERY_SAFE = _PATH_SAFE + "?"

# protocol states: the body's framing (slobench.targets.http1)
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = HEAD, LENGTH, CHUNKED, UNTIL_CLOSE, DONE


def _reason(e: OSError) -> str:
    """An OSError in plain words; a TLS or name-lookup error by what it said (its errno is no socket's)."""
    if isinstance(e, socket.gaierror):
        return f"name lookup failed: {e.strerror or e}".lower()
    if isinstance(e, ssl.SSLError):
        return f"TLS: {getattr(e, 'verify_message', None) or e.reason or e}".lower()
    return os_reason(e)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    __slots__ = (
        "transport", "key", "closed", "close_exc", "idle_since", "idle", "used", "state", "buf", "status",
        "headers", "keep_alive", "left", "crlf", "trailers", "pieces", "waiter", "error", "got_bytes", "paused",
        "feed", "feed_done", "feed_error",
    )

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.transport: asyncio.Transport | None = None
        self.key = key
        self.closed = False
        self.close_exc: BaseException | None = None
        self.idle_since = 0.0
        self.idle = False  # in the pool: any byte that comes now (a 408, say) answers no request of ours
        self.used = 0  # responses read on this connection
        self._reset()

    def _reset(self) -> None:
        self.state = _HEAD
        self.buf = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.left = 0  # body bytes left (Content-Length) or of the current chunk
        self.crlf = False  # a chunk's data ended; its CRLF is next
        self.trailers = False  # the last chunk came; trailer lines until an empty one
        self.pieces: list[bytes] = []
        self.paused = False  # reading paused: more than _MAX_PIECES reads wait for the reader
        self.waiter: asyncio.Future[None] | None = None
        self.error: TransportError | None = None
        self.got_bytes = False
        # the reader's step for a successful answer's body (`_body`), given with the request and dropped at
        # the head of any other answer; `feed_done`: it wanted no more, or raised (`feed_error`)
        self.feed: Feed | None = None
        self.feed_done = False
        self.feed_error: Exception | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.idle:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            return
        self.got_bytes = True
        state = self.state
        if state == _CHUNKED:  # a stream's read
            try:
                self._chunked(self.buf + data if self.buf else data)
            except ProtocolError as e:
                self._fail(TransportError("error", f"invalid HTTP response: {e}"))
                if self.transport is not None:
                    self.transport.abort()
            return
        if state == _LENGTH:  # the common read of a Content-Length body
            n = len(data)
            if n <= self.left:
                self.left -= n
                if not self.left:
                    self.state = _DONE
            else:
                data = data[: self.left]  # bytes past the body: the connection is not reused
                self.left = 0
                self.keep_alive = False
                self.state = _DONE
            self._body(data)
            return
        if state == _UNTIL_CLOSE:
            self._body(data)
            return
        try:
            if state == _HEAD:
                self._head(data)
            # else _DONE: bytes after the response (none are asked for): the connection is not reused
            elif state == _DONE:
                self.keep_alive = False
        except ProtocolError as e:
            self._fail(TransportError("error", f"invalid HTTP response: {e}"))
            if self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool | None:
        return None  # close our end too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.close_exc = exc
        state = self.state
        if state == _UNTIL_CLOSE:
            self.state = _DONE
            self.keep_alive = False
            self._wake()
            return
        if state == _DONE or self.error is not None:
            self._wake()
            return
        is_reset = isinstance(exc, OSError) and exc.errno in _RESET_ERRNOS
        if state == _HEAD:
            if isinstance(exc, OSError) and not is_reset:
                self._fail(TransportError("error", f"connection error: {_reason(exc)}"))
            else:
                self._fail(TransportError("error", NO_ANSWER))
        else:
            why = "connection reset by peer" if is_reset else "connection closed before the body ended"
            self._fail(TransportError("error", f"connection lost mid-response ({why})"))

    # ---- parsing ---------------------------------------------------------------------------------------

    def _head(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end, rest_at = head_end(buf)
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ProtocolError(f"response head longer than {_MAX_HEAD} bytes")
                self.buf = buf
                return
            block = buf[:end]
            rest = buf[rest_at:]
            head = _HEADS.get(block)
            if head is None:
                head = parse_head(block)
                if head is None:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                    buf = rest
                    continue
                if len(_HEADS) >= _MAX_HEADS:
                    _HEADS.clear()
                _HEADS[block] = head
            break
        self.buf = b""
        self.status, self.headers, self.keep_alive, self.state, self.left = head
        if self.status >= 300:  # an error or a redirect: its body is read whole (`read`), or not at all
            self.feed = None
        if self.feed is None or self.state == _DONE:
            self._wake()  # the head is in (a fed body's reader wakes at its end: `_body`)
        if rest and self.state != _DONE:
            self.data_received(rest)
        elif rest:
            self.keep_alive = False

    def _chunked(self, buf: bytes) -> None:
        if not (self.left or self.crlf or self.trailers) and buf[-2:] == b"\r\n":
            # A read of whole chunks, what a stream's reads mostly are: one (size line, data, CRLF), or
            # several (`_whole_chunks`), each taken without the steps below.
            eol = buf.find(b"\r\n")
            line = buf[:eol]
            # hex digits only (checked inline: this runs a read): int(x, 16) takes "5_09", " 5", "0x5"
            size = int(line, 16) if eol > 0 and not line.translate(None, HEX_DIGITS) else 0
            if size > 0 and eol + 4 + size == len(buf):
                self.buf = b""
                self._body(buf[eol + 2:-2])
                return
            whole = _whole_chunks(buf)
            if whole is not None:
                data, ended = whole
                self.buf = b""
                if ended:
                    self.trailers = True
                    self.state = _DONE
                if data:
                    self._body(data)
                elif ended:
                    self._wake()
                return
        pos = 0
        n = len(buf)
        out: list[bytes] = []
        find = buf.find
        while pos < n:
            if not (self.left or self.crlf or self.trailers):
                # The common case, one whole chunk (size line, data, CRLF) in the buffer, in one step;
                # anything else (a split chunk, an extension, the last chunk) takes the steps below.
                eol = find(b"\r\n", pos)
                if eol > pos:
                    line = buf[pos:eol]
                    size = int(line, 16) if not line.translate(None, HEX_DIGITS) else 0
                    end = eol + 2 + size
                    if size > 0 and end + 2 <= n and buf[end:end + 2] == b"\r\n":
                        out.append(buf[eol + 2:end])
                        pos = end + 2
                        continue
            left = self.left
            if left:
                take = n - pos if n - pos < left else left
                out.append(buf[pos:pos + take] if take < n or pos else buf)
                pos += take
                self.left = left - take
                if not self.left:
                    self.crlf = True
                continue
            if self.crlf:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self.crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > _MAX_HEAD:
                    raise ProtocolError("chunk-size line too long")
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self.trailers:
                if not line:  # the empty line after the trailers: the body ends
                    self.state = _DONE
                    if pos < n:
                        self.keep_alive = False
                    break
                continue
            self.left = chunk_size(line)
            if not self.left:
                self.trailers = True
        self.buf = buf[pos:] if pos < n and self.state != _DONE else b""
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out))
        elif self.state == _DONE:
            self._wake()

    def _body(self, data: bytes) -> None:
        """A piece of the body (the state already says whether it was the last): handed to the feed step
        where one is set, the reader's task woken only once the step wants no more or the body ended; else
        kept for the reader's task (`_Chunks`), which is woken. Whatever the step raises fails the request
        in its own task (`_RawResponse.fed`), never in the event loop's protocol callbacks."""
        feed = self.feed
        if feed is None:
            self.pieces.append(data)
            self._wake()
            return
        try:
            if not feed(data):
                if self.state == _DONE:
                    self._wake()
                return
        except Exception as e:
            self.feed_error = e
        self.feed = None  # what still comes is kept for `drain`, which drops it
        self.feed_done = True
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)
        elif len(self.pieces) > _MAX_PIECES and not self.paused and self.transport is not None:
            self.paused = True  # the reader is behind: the socket's buffer, then the server, wait for it
            self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _fail(self, error: TransportError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def timed_out(self, make_error: Callable[[], TransportError]) -> None:
        self._fail(make_error())
        if self.transport is not None:
            self.transport.abort()

    def wait(self) -> asyncio.Future[None]:
        """To await until something arrives (the head, a piece of body, the end) or the request fails."""
        w = self.waiter = asyncio.get_running_loop().create_future()
        return w


# Parsed heads by their bytes: a server's answers repeat theirs (the Date line changes once a second). The
# headers dict is shared between the responses that reuse it: it is only read.
_HEADS: dict[bytes, Head] = {}
_MAX_HEADS = 256


def _drain_timed_out() -> TransportError:
    return TransportError("timeout", "the body's end did not come")


def _whole_chunks(buf: bytes) -> tuple[bytes, bool] | None:
    """A read of whole chunks, the last chunk perhaps among them (with no trailer and nothing after it):
    their data joined, and whether the body ended. None for anything else (a chunk cut by the read, an
    extension, a trailer, a CRLF inside a chunk's data), which the step-by-step parse takes. What a
    network read of a stream mostly holds, read without a Python step per chunk: split at every CRLF,
    the pieces must pair up as sizes and data of exactly those sizes, none empty but the last chunk's (a
    CRLF inside a chunk's data makes its first piece shorter than its size)."""
    parts = buf.split(b"\r\n")
    if not len(parts) & 1:
        return None
    parts.pop()  # the empty piece after the last CRLF
    datas = parts[1::2]
    lengths = list(map(len, datas))
    sizes = parts[0::2]
    if b"".join(sizes).translate(None, HEX_DIGITS):  # only hex digits: int() takes "5_09", " 5", "0x5"
        return None
    try:
        if list(map(int, sizes, _HEX)) != lengths:
            return None
    except ValueError:
        return None
    if 0 in lengths:  # a last chunk: only at the end, and only as "0" (other spellings take the long way)
        if lengths.index(0) != len(lengths) - 1 or parts[-2] != b"0":
            return None
        return b"".join(datas), True
    return b"".join(datas), False


_HEX = itertools.repeat(16)


class _RawResponse:
    __slots__ = ("status", "retry_after", "location", "retried", "_conn", "_max_body")

    def __init__(self, conn: _Conn, max_body_bytes: int, retried: str | None = None) -> None:
        self.status = conn.status
        self.retried = retried
        self.retry_after = conn.headers.get("retry-after") if conn.status >= 400 else None
        self.location = conn.headers.get("location") if is_redirect(conn.status) else None
        self._conn = conn
        self._max_body = max_body_bytes

    def chunks(self) -> AsyncIterator[bytes]:
        return _Chunks(self._conn)

    async def fed(self) -> None:
        """Await the end of a body handed to `post`'s `feed`: until the step wants no more or the body
        ended. Raises what the step raised, or the request's `TransportError` (the timeout, a connection
        dropped) when it came before the step was done."""
        c = self._conn
        while not c.feed_done and c.state != _DONE and c.error is None:
            await c.wait()
        if c.feed_error is not None:
            raise c.feed_error
        if not c.feed_done and c.error is not None:
            raise c.error

    async def drain(self, within_s: float) -> None:
        """Read and drop the rest of the body for `within_s` at most, so the connection can be reused (one
        whose end has not come by then is closed): reading `chunks()` under an `asyncio.timeout` does the
        same with more steps a request."""
        c = self._conn
        c.pieces.clear()
        if c.paused:
            c.resume()
        if c.state == _DONE or c.error is not None:
            return
        timer = asyncio.get_running_loop().call_later(within_s, c.timed_out, _drain_timed_out)
        try:
            while c.state != _DONE and c.error is None:
                await c.wait()
                c.pieces.clear()
                if c.paused:
                    c.resume()
        finally:
            timer.cancel()

    async def read(self) -> bytes:
        return await read_body(_Chunks(self._conn), self._conn.headers.get("content-encoding"), self._max_body)


class _Chunks:
    """The body's bytes as they arrive: all that came since the last read, joined."""

    __slots__ = ("_conn",)

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        c = self._conn
        while True:
            pieces = c.pieces
            if pieces:
                c.pieces = []
                if c.paused:
                    c.resume()
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if c.error is not None:
                raise c.error
            if c.state == _DONE:
                raise StopAsyncIteration
            await c.wait()


class _Target:
    """What one URL needs, worked out once: the pool key, where to connect, the request's first line."""

    __slots__ = ("key", "host", "port", "ssl", "server_hostname", "line")

    def __init__(self, url: str, ssl_context: Callable[[], ssl.SSLContext]) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UsageError(f"transport 'raw': needs an http:// or https:// URL with a host (got {url!r})")
        if u.username or u.password:
            raise UsageError("transport 'raw': credentials in the URL are not sent; use an Authorization header")
        port = u.port or (443 if u.scheme == "https" else 80)
        host = u.hostname
        self.key = (u.scheme, host, port)
        self.host = host
        self.port = port
        self.ssl = ssl_context() if u.scheme == "https" else None
        self.server_hostname = host if self.ssl is not None else None
        host_header = f"[{host}]" if ":" in host else host
        if u.port is not None and port != (443 if u.scheme == "https" else 80):
            host_header += f":{port}"
        path = quote(u.path or "/", safe=_PATH_SAFE) + (f"?{quote(u.query, safe=_QUERY_SAFE)}" if u.query else "")
        self.line = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n"


class RawHttpTransport:
    """A `Transport` speaking HTTP/1.1 itself.

    - one `asyncio.Protocol` per connection (`loop.create_connection`, TLS through `ssl` for https URLs),
      kept alive in a pool per (scheme, host, port) with no cap: open-loop load never queues behind a pool
      limit. Idle connections are reused newest first and dropped after `KEEPALIVE_S`.
    - the request is one `bytes` written in one call: the request line and header block are encoded once
      per (URL, headers) and reused; only the Content-Length and the body change.
    - the response's head is parsed once; the body (`Content-Length`, chunked, or to the close) is handed
      to the reader as it arrives. With `feed` (a stream's reader), each network read of a successful
      answer's body goes to that step in the connection's own callback, and the request's task wakes only
      at the end (`fed`): nothing queues in the client, so nothing needs pausing; what a stream holds is
      bounded by its reader's limits. Otherwise each read appends to a list, and the reader awaits one
      future only when the list is empty (no queue, no task); one more than 64 reads behind pauses the socket.
    - `on_sent` is called immediately before the request's bytes are written to the socket; the total
      timeout is one timer per request, the connect timeout bounds connection set-up.
    """

    def __init__(self, *, timeout_s: float, connect_timeout_s: float,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._timeouts = (timeout_s, connect_timeout_s)
        self.max_body_bytes = max_body_bytes
        self._pools: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[str, _Target] = {}
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        self._ssl: ssl.SSLContext | None = None
        self._busy: set[_Conn] = set()
        self._closed = False

    def timeout_error(self) -> TransportError:
        return TransportError("timeout", f"request timed out after {self._timeouts[0]:g} s")

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _head(self, url: str, headers: Mapping[str, str]) -> tuple[_Target, bytes]:
        items = tuple(headers.items())
        head = self._heads.get((url, items))
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url, self._ssl_context)
        if head is None:
            lines = [target.line]
            names = set()
            for k, v in items:
                if "\r" in k or "\n" in k or ":" in k or "\r" in v or "\n" in v:
                    raise UsageError(f"transport 'raw': header {k!r} has a line break or a colon in it")
                lower = k.lower()
                if lower in ("host", "content-length", "transfer-encoding", "connection"):
                    raise UsageError(f"transport 'raw': header {k!r} is set by the transport itself")
                names.add(lower)
                lines.append(f"{k}: {v}\r\n")
            if "user-agent" not in names:
                lines.append("User-Agent: slobench\r\n")
            if "accept-encoding" not in names:  # none sent would allow any coding (RFC 9110)
                lines.append("Accept-Encoding: identity\r\n")
            lines.append("Content-Length: ")
            try:
                head = "".join(lines).encode("latin-1")
            except UnicodeEncodeError as e:
                raise UsageError(f"transport 'raw': a header or the URL has a character outside latin-1: {e}") from None
            if len(self._heads) > 64:  # bounded: a caller varying its headers per request
                self._heads.clear()
            self._heads[(url, items)] = head
        return target, head

    async def _connect(self, target: _Target, loop: asyncio.AbstractEventLoop, deadline: float) -> _Conn:
        key = target.key
        connect_by = loop.time() + self._timeouts[1]
        try:
            async with asyncio.timeout_at(min(connect_by, deadline)):
                _, conn = await loop.create_connection(
                    lambda: _Conn(key), target.host, target.port, ssl=target.ssl,
                    server_hostname=target.server_hostname,
                )
        except TimeoutError:
            if deadline < connect_by:
                raise self.timeout_error() from None
            raise TransportError("timeout", f"connect timed out after {self._timeouts[1]:g} s") from None
        except OSError as e:
            raise TransportError("error", f"cannot connect to {target.host}:{target.port}: {_reason(e)}") from e
        return conn

    def _pooled(self, key: tuple[str, str, int]) -> _Conn | None:
        pool = self._pools.get(key)
        if not pool:
            return None
        oldest_ok = time.monotonic() - KEEPALIVE_S
        while pool:
            conn = pool.pop()  # the newest: the least likely to be closing
            tr = conn.transport
            if not conn.closed and tr is not None and not tr.is_closing() and conn.idle_since > oldest_ok:
                conn.idle = False
                return conn
            if tr is not None:
                tr.abort()
        return None

    def _release(self, conn: _Conn) -> None:
        self._busy.discard(conn)
        tr = conn.transport
        if (conn.state != _DONE or not conn.keep_alive or conn.closed or conn.error is not None or tr is None
                or tr.is_closing() or self._closed):
            if tr is not None:
                tr.abort()
            return
        conn.used += 1
        if conn.paused:
            conn.resume()
        conn._reset()
        now = time.monotonic()
        conn.idle_since = now
        conn.idle = True
        pool = self._pools.setdefault(conn.key, [])
        while pool and pool[0].idle_since < now - KEEPALIVE_S:  # expired: the oldest are first
            old = pool.pop(0)
            if old.transport is not None:
                old.transport.abort()
        pool.append(conn)

    feeds_body = True  # a `FeedingTransport`: `post` takes `feed`

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], on_sent: Callable[[], None] | None = None,
        feed: Feed | None = None,
    ) -> _Post:
        if self._closed:
            raise RuntimeError("RawHttpTransport.post() after close()")
        return _Post(self, url, body, headers, on_sent, feed)

    async def close(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()
        self._pools.clear()
        for conn in list(self._busy):
            if conn.transport is not None:
                conn.transport.abort()
        self._busy.clear()


class _Post:
    """One request, as an async context manager: `__aenter__` sends it and waits for the answer's head (with
    `feed`, for a successful answer's body to be fed to its end: one wake-up a request), `__aexit__` puts
    the connection back in the pool (or closes it, when the body was not read to its end)."""

    __slots__ = ("_tr", "_url", "_body", "_headers", "_on_sent", "_feed", "_conn", "_timer")

    def __init__(self, tr: RawHttpTransport, url: str, body: bytes, headers: Mapping[str, str],
                 on_sent: Callable[[], None] | None, feed: Feed | None = None) -> None:
        self._tr = tr
        self._url = url
        self._body = body
        self._headers = headers
        self._on_sent = on_sent
        self._feed = feed
        self._conn: _Conn | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> _RawResponse:
        tr = self._tr
        target, head = tr._head(self._url, self._headers)
        body = self._body
        data = b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + tr._timeouts[0]
        retried: str | None = None
        try:
            for attempt in (0, 1):
                # the first send takes a pooled connection where there is one; a resend, always a new one
                conn = tr._pooled(target.key) if attempt == 0 else None
                reused = conn is not None
                if conn is None:
                    conn = await tr._connect(target, loop, deadline)
                self._conn = conn
                tr._busy.add(conn)
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(deadline, conn.timed_out, tr.timeout_error)
                conn.feed = self._feed
                if self._on_sent is not None and attempt == 0:  # the record keeps the first send's time
                    self._on_sent()
                conn.transport.write(data)  # type: ignore[union-attr]
                # with a feed, a successful answer is awaited to its end: its task has nothing to do before
                while (conn.state == _HEAD or conn.feed is not None and conn.state != _DONE) and conn.error is None:
                    await conn.wait()
                if conn.state == _HEAD:
                    err = conn.error
                    assert err is not None
                    # A kept-alive connection the server closed as the request left on it, no byte of an
                    # answer back (the close raced the send): sent once more, on a new connection.
                    if attempt == 0 and reused and not conn.got_bytes and err.status != "timeout":
                        retried = err.reason
                        conn.feed = None
                        tr._release(conn)
                        self._conn = None
                        continue
                    if retried is not None:
                        raise TransportError(err.status, f"{err.reason} {_RESENT}")
                    raise err
                return _RawResponse(conn, tr.max_body_bytes, retried)
            raise AssertionError("unreachable")
        except BaseException as e:
            self._done()
            if isinstance(e, OSError):  # a write to a socket that broke under us
                raise TransportError("error", f"connection error: {_reason(e)}") from e
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._done()

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.feed = None  # the request is over: nothing may reach its reader after this
            self._tr._release(conn)
