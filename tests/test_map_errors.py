"""The one place lower-library errors become a TransportError (slobench.targets.transport.map_errors)."""

from __future__ import annotations

import asyncio
import errno

import httpx
import pytest

from slobench.targets.transport import TransportError, map_errors


@pytest.mark.parametrize(
    ("raised", "status", "reason"),
    [
        (httpx.ConnectTimeout("t"), "timeout", "connect timed out after 2 s"),
        (httpx.PoolTimeout("t"), "timeout", "connect timed out after 2 s"),
        (httpx.ReadTimeout("t"), "timeout", "request timed out after 9 s"),
        (TimeoutError(), "timeout", "request timed out after 9 s"),
        (httpx.ConnectError("c"), "error", "cannot connect: c"),
        (httpx.RemoteProtocolError("peer closed"), "error", "connection lost mid-response (peer closed)"),
        # the raw client's words for the same close, and for bytes that are not HTTP/1.1
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), "error",
         "server closed the connection before the response ended"),
        (httpx.RemoteProtocolError("illegal status line: bytearray(b'HTTP/1.1 2\\xb20')"), "error",
         "invalid HTTP response: illegal status line: bytearray(b'HTTP/1.1 2\\xb20')"),
        (httpx.ReadError("r"), "error", "connection lost mid-response (r)"),
        (httpx.UnsupportedProtocol("u"), "error", "UnsupportedProtocol: u"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "error", "connection error: connection reset by peer"),
    ],
)
def test_each_failure_below_http_becomes_a_transport_error_raised_from_it(
    raised: Exception, status: str, reason: str
) -> None:
    with pytest.raises(TransportError) as e, map_errors(9.0, 2.0):
        raise raised
    assert (e.value.status, e.value.reason) == (status, reason)
    assert e.value.__cause__ is raised


@pytest.mark.parametrize("raised", [ValueError("a bug"), TransportError("error", "as it is"),
                                    asyncio.CancelledError()])
def test_anything_else_passes_through_as_it_is(raised: BaseException) -> None:
    with pytest.raises(type(raised)) as e, map_errors(9.0, 2.0):
        raise raised
    assert e.value is raised
