"""Reading an HTTP/1.1 response's framing as RFC 9112 writes it: the head (status line and fields) and a
chunk's size line. Pure, no I/O: the raw client (`slobench.targets.rawhttp`) feeds it bytes.

Numbers are ASCII digits only: Python's `str.isdigit()` and `int()` take `²` or `٣`, and `int(x, 16)` takes
`5_09`, ` 5` and `0x5`; none of those is HTTP. A line may end in a bare LF (RFC 9112 section 2.2 lets a
recipient take one, as httpx does); a bare CR inside a line is refused. A field line folded onto the next
(obs-fold) is joined with a space, as section 5.2 asks of a user agent. Identical repeated Content-Length
values are one length (RFC 9110 section 8.6); differing ones are refused. A Transfer-Encoding other than
`chunked` alone is refused: a coding under the chunks would reach the reader still encoded.
"""

from __future__ import annotations

import re

# the body's framing, as a response head sets it (the raw client's protocol states)
HEAD, LENGTH, CHUNKED, UNTIL_CLOSE, DONE = range(5)

# What a response head says: (status, headers, keep-alive, the body's state, its Content-Length)
Head = tuple[int, dict[str, str], bool, int, int]

_STATUS_LINE = re.compile(r"HTTP/1\.[0-9] ([0-9]{3})(?: [^\r\n]*)?\Z")
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+\Z")
HEX_DIGITS = b"0123456789abcdefABCDEF"


class ProtocolError(Exception):
    """The server's bytes are not HTTP/1.1 this client can read."""


def head_end(buf: bytes) -> tuple[int, int]:
    """Where the head in `buf` ends: (the end of its last field line, where the body starts), or (-1, -1)
    while the empty line has not come. Lines end in CRLF or a bare LF; the common all-CRLF head is found
    with one search, the bare-LF forms are looked for only before it."""
    end = buf.find(b"\r\n\r\n")
    limit = end + 2 if end >= 0 else len(buf)
    lf = buf.find(b"\n\n", 0, limit)
    crlf_after_lf = buf.find(b"\n\r\n", 0, limit)
    candidates = [(i, i + 2) for i in (lf,) if i >= 0] + [(i, i + 3) for i in (crlf_after_lf,) if i >= 0]
    if candidates:
        return min(candidates)
    return (end, end + 4) if end >= 0 else (-1, -1)


def parse_head(block: bytes) -> Head | None:
    """A response head (status line and field lines, without the empty line that ends it); None for an
    interim 1xx answer (a 100 Continue or 103 Early Hints: the real answer follows)."""
    text = block.decode("latin-1")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.endswith("\r"):
            lines[i] = line = line[:-1]
        if "\r" in line or "\0" in line:
            raise ProtocolError(f"bad line {line[:100]!r} (a bare CR or NUL in it)")
    m = _STATUS_LINE.match(lines[0])
    if m is None:
        raise ProtocolError(f"bad status line {lines[0][:100]!r}")
    status = int(m.group(1))
    version = lines[0][:8]
    headers: dict[str, str] = {}
    last = ""
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):  # obs-fold: the previous field's value goes on
            if not last:
                raise ProtocolError(f"bad header line {line[:100]!r} (a folded line with no field before it)")
            more = line.strip(" \t")
            headers[last] = f"{headers[last]} {more}" if headers[last] else more
            continue
        name, sep, value = line.partition(":")
        if not sep or _TOKEN.match(name) is None:
            raise ProtocolError(f"bad header line {line[:100]!r}")
        last = name = name.lower()
        value = value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if 100 <= status < 200 and status != 101:
        return None
    conn = headers.get("connection", "").lower()
    keep_alive = "close" not in conn and (version != "HTTP/1.0" or "keep-alive" in conn)
    te = headers.get("transfer-encoding")
    cl = headers.get("content-length")
    left = 0
    if status in (204, 304):
        state = DONE
    elif te is not None:
        if te.strip(" \t").lower() != "chunked":
            raise ProtocolError(f"unsupported Transfer-Encoding {te[:100]!r} (only chunked is read)")
        state = CHUNKED
    elif cl is not None:
        left = content_length(cl)
        state = LENGTH if left else DONE
    else:
        state = UNTIL_CLOSE
        keep_alive = False
    return status, headers, keep_alive, state, left


def content_length(value: str) -> int:
    """A Content-Length field's value: ASCII digits, or a list of identical ones (a field sent twice)."""
    values = {v.strip(" \t") for v in value.split(",")}
    if len(values) != 1:
        raise ProtocolError(f"bad Content-Length {value[:100]!r} (differing values)")
    (digits,) = values
    if not (digits.isascii() and digits.isdigit()):
        raise ProtocolError(f"bad Content-Length {value[:100]!r}")
    return int(digits)


def is_hex(digits: bytes) -> bool:
    """Whether `digits` is a chunk size as RFC 9112 spells it: ASCII hex digits, at least one, nothing else."""
    return bool(digits) and not digits.translate(None, HEX_DIGITS)


def chunk_size(line: bytes) -> int:
    """A chunk-size line's size (its CRLF taken off): hex digits, then perhaps an extension (`;` and what
    follows, spaces or tabs allowed before it: RFC 9112's BWS), which is ignored, or trailing spaces or
    tabs (some servers send them; httpx takes them too)."""
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not is_hex(digits):
        raise ProtocolError(f"bad chunk size {line[:40]!r}")
    return int(digits, 16)
