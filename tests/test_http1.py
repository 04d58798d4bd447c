"""RFC 9112 response framing (slobench.targets.http1) and the raw client's protocol callback fed any bytes:
whatever a server sends is read or refused as a `ProtocolError`, never another exception (an exception in
`data_received` is asyncio's "Fatal error on transport", and the request is left to a misleading error)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slobench.targets.http1 import (
    CHUNKED,
    DONE,
    LENGTH,
    ProtocolError,
    chunk_size,
    content_length,
    head_end,
    parse_head,
)
from slobench.targets.rawhttp import _Conn

# digits Python's int() takes that HTTP does not: superscripts, other scripts' digits, full-width ones
NOT_ASCII_DIGITS = ["\u00b2", "\u0663", "\uff15", "\u09ea", "\u00b9"]


@pytest.mark.parametrize("digit", NOT_ASCII_DIGITS)
def test_only_ascii_digits_are_numbers(digit: str) -> None:
    with pytest.raises(ProtocolError, match="bad Content-Length"):
        content_length("1" + digit)
    with pytest.raises(ProtocolError, match="bad status line"):
        parse_head(f"HTTP/1.1 20{digit} OK".encode("utf-8", "replace"))
    if ord(digit) < 256:  # a byte of the Latin-1 a head is read as
        with pytest.raises(ProtocolError, match="bad status line"):
            parse_head(b"HTTP/1.1 20" + digit.encode("latin-1") + b" OK")
        with pytest.raises(ProtocolError, match="bad Content-Length"):
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1" + digit.encode("latin-1"))


@pytest.mark.parametrize("line", [b"5_09", b"0x5", b"+5", b"-5", b" 5", b"", b";ext", b"g", b"5\xb2"])
def test_a_chunk_size_is_hex_digits_only(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad chunk size"):
        chunk_size(line)


def test_chunk_sizes_as_rfc_9112_spells_them() -> None:
    assert [chunk_size(x) for x in (b"1a", b"1A", b"001a", b"1a;name=value", b"1a ;name", b"1a  ")] == [26] * 6


def test_repeated_content_lengths_are_one_length_when_they_agree() -> None:
    assert content_length("12, 12") == 12 and content_length("7") == 7
    with pytest.raises(ProtocolError, match="differing values"):
        content_length("12, 13")


def test_a_head_ends_at_its_first_empty_line_whatever_its_line_endings() -> None:
    # (the end of the last field line, where the body starts)
    for buf, end in [(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody\r\n\r\n", (21, 25)),
                     (b"HTTP/1.1 200 OK\nA: b\n\nbody\r\n\r\n", (20, 22)),
                     (b"HTTP/1.1 200 OK\nA: b\r\n\r\nbody", (20, 24)),
                     (b"HTTP/1.1 200 OK\r\nA: b\n\r\nbody", (21, 24)),
                     (b"HTTP/1.1 200 OK\r\nA: b\r\n", (-1, -1))]:
        assert head_end(buf) == end, buf
    status, headers, keep_alive, state, left = parse_head(b"HTTP/1.1 200 OK\nA: b\r\nX: 1\n  2\nContent-Length: 3")
    assert (status, headers, keep_alive, state, left) == (200, {"a": "b", "x": "1 2", "content-length": "3"}, True,
                                                          LENGTH, 3)
    assert parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked")[3] == CHUNKED
    assert parse_head(b"HTTP/1.1 204 No Content")[3] == DONE  # type: ignore[index]


class _Socket:
    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False


STATUS = [b"HTTP/1.1 200 OK", b"HTTP/1.1 2\xb20 OK", b"HTTP/1.1 20\xb2", b"HTTP/1.0 200", b"HTTP/1.1 100 Continue",
          b"HTTP/1.1 204 No Content", b"HTTP/2 200", b"HTTP/1.1 OK", b""]
FIELDS = [b"Content-Length: 5", b"Content-Length: 1\xb2", b"Content-Length: 5, 6", b"Content-Length: \xd9\xa3",
          b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip", b"Connection: close", b"X: y", b"  folded",
          b"Bad : x", b"X: a\rb", b""]
BODY = [b"5\r\nhello\r\n", b"5_09\r\n", b"\xb2\r\n", b"0x5\r\n", b"0\r\n\r\n", b"hello", b"\r\n", b";ext",
        b"0\r\nTrailer: 1\r\n\r\n"]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(STATUS), st.lists(st.sampled_from(FIELDS) | st.binary(max_size=6), max_size=5),
       st.sampled_from([b"\r\n", b"\n"]), st.lists(st.sampled_from(BODY) | st.binary(max_size=6), max_size=6),
       st.integers(1, 64))
def test_the_protocol_callback_never_raises_whatever_the_bytes(status: bytes, fields: list[bytes], eol: bytes,
                                                               body: list[bytes], cut: int) -> None:
    data = eol.join([status, *fields]) + eol + eol + b"".join(body)
    c = _Conn(("http", "h", 1))
    c.connection_made(_Socket())  # type: ignore[arg-type]
    for i in range(0, len(data), cut):
        c.data_received(data[i:i + cut])  # raises nothing: a refusal is the request's error
    c.connection_lost(None)
    assert c.state == DONE or c.error is not None
