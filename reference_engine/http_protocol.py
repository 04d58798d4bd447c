"""uvicorn's h11 protocol with a deadline on reading a request's head.

uvicorn (0.54) offers `timeout_keep_alive`, but it only starts once a response is complete: a connection
that opens and sends nothing, or sends half a request line and stops (slow-loris), is held forever. Here
a connection must finish each request head within `header_timeout_s` of connecting, or of its first
byte after a keep-alive pause; otherwise it is closed. A slow *body* is bounded in the handler instead
(see `server.read_body`). A body answered before it was read (413, 408) is discarded as it comes, as
uvicorn does, but for at most LINGER_BYTES or `header_timeout_s`: then the connection is closed.

It also keeps each open connection's transport by peer address, so that the fault injector
(`reference_engine.faults`) can reset one from inside a handler, which ASGI gives no way to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from reference_engine.serve_args import DEFAULT_HEADER_TIMEOUT_S

_OPEN: dict[tuple[str, int], asyncio.Transport] = {}  # peer address -> its connection's transport
# Discarding the rest of a refused body for a while (a lingering close) lets a client that sends its whole
# body before reading see the answer: closing with unread data sends a TCP reset, which may overtake it.
LINGER_BYTES = 1 << 20


class HeadDeadlineH11Protocol(H11Protocol):
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingered = -1  # bytes of a refused body discarded so far; -1 while not lingering

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client is not None:
            _OPEN[self.client] = transport
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY:
            self._linger(len(data))
        elif self.conn.their_state is h11.IDLE:  # a request head is still incomplete
            if self._head_timer is None:  # first bytes after a keep-alive pause: uvicorn dropped its timer
                self._arm()
        else:
            self._disarm()
            self._lingered = -1

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.client is not None and _OPEN.get(self.client) is self.transport:
            del _OPEN[self.client]
        super().connection_lost(exc)

    def _linger(self, num_bytes: int) -> None:
        """The response has gone out while the request's body still comes: discard it within bounds."""
        if self._lingered < 0:
            self._lingered = 0
            self._arm()
        self._lingered += num_bytes
        if self._lingered > LINGER_BYTES and not self.transport.is_closing():
            self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_with(header_timeout_s: float) -> type[HeadDeadlineH11Protocol]:
    """The protocol class uvicorn instantiates per connection, with this deadline."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0 (got {header_timeout_s!r})")
    return type("HeadDeadlineH11Protocol", (HeadDeadlineH11Protocol,), {"header_timeout_s": header_timeout_s})


def reset_connection(client: Any) -> bool:
    """Abort the connection from peer `client` (host, port) with a TCP RST; False when it is not ours."""
    transport = _OPEN.get(tuple(client)) if client is not None else None
    if transport is None or transport.is_closing():
        return False
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # linger 0: close() sends RST and drops unsent data
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return True
