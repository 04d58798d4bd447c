"""What a server's answer may cost the client: a body's size, its decompressed size, and JSON's depth.

A broken or hostile server controls all three. A body is read a piece at a time and refused, with an error
naming the limit and its flag, as soon as it (or, compressed, what it inflates to) passes the limit;
decompression (gzip, deflate: all slobench advertises) never produces more than the bytes still allowed.
JSON from a server is parsed by orjson, which refuses nesting deeper than `MAX_JSON_DEPTH` with a
ValueError (the standard library's parser would recurse into a RecursionError); `brief` shows any parsed
value without recursing into it.
"""

from __future__ import annotations

import reprlib
import zlib
from typing import Any

from orjson import loads as orjson_loads

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 64 * MIB  # any one response body, SSE line or event (--max-body)
DEFAULT_MAX_METRICS_BODY_BYTES = 16 * MIB  # one /metrics page (--max-metrics-body); vLLM's is ~100 KB
MAX_JSON_DEPTH = 1024  # orjson's own limit: deeper nesting is a ValueError
ACCEPT_ENCODING = "gzip, deflate"  # what `Decoder` undoes, so what a setup request may advertise
_STEP = 1 << 20  # bytes inflated a call: the thread holds the GIL between calls only briefly
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 4, 200, 200


def size_text(num_bytes: int) -> str:
    """`67108864` -> `64 MiB`; sizes that are not whole MiB or KiB in bytes."""
    for unit, size in (("MiB", MIB), ("KiB", 1024)):
        if num_bytes >= size and num_bytes % size == 0:
            return f"{num_bytes // size} {unit}"
    return f"{num_bytes} bytes"


def over_limit(max_bytes: int, flag: str, encoding: str | None = None) -> str:
    """The message of a body refused for its size."""
    how = f" once decompressed ({encoding})" if encoding else ""
    return f"response body over the {size_text(max_bytes)} limit{how} ({flag})"


def parse_size(text: str) -> int:
    """`64MiB`, `16M`, `512k`, `1048576` -> bytes (K/M/G and KiB/MiB/GiB are both powers of 1024)."""
    s = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    for suffix, factor in (("k", 1024), ("m", MIB), ("g", 1024 * MIB)):
        if s.endswith(suffix):
            s, scale = s[:-1].strip(), factor
            break
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (say e.g. 64MiB, 512KiB or a number of bytes)") from None
    if not value >= 1 or value * scale > 2**62:
        raise ValueError(f"a size must be at least 1 byte (got {text!r})")
    return int(value * scale)


class Decoder:
    """Undoes one Content-Encoding (identity, gzip, deflate) a piece at a time, never producing more than
    asked: a gzip bomb inflates only as far as the limit before it is refused. Anything else raises
    ValueError: it was not asked for (`ACCEPT_ENCODING`)."""

    __slots__ = ("encoding", "_z", "_wbits", "_out")

    def __init__(self, content_encoding: str | None) -> None:
        enc = (content_encoding or "").strip().lower()
        self.encoding: str | None = None if enc in ("", "identity") else enc
        self._out = 0
        if self.encoding is None:
            self._wbits = 0
        elif enc in ("gzip", "x-gzip"):
            self._wbits = 16 + zlib.MAX_WBITS
        elif enc == "deflate":
            self._wbits = zlib.MAX_WBITS  # zlib-wrapped, as the RFC says; raw deflate is tried on failure
        else:
            raise ValueError(f"Content-Encoding {content_encoding!r} was not asked for")
        self._z = zlib.decompressobj(self._wbits) if self._wbits else None

    def decode(self, data: bytes, max_out: int) -> bytes:
        """What `data` inflates to, at most `max_out` bytes (more exist when exactly `max_out` came back),
        inflated a MiB a call."""
        z = self._z
        if z is None:
            return data
        parts: list[bytes] = []
        n = 0
        while n < max_out:
            step = min(_STEP, max_out - n)
            try:
                piece = z.decompress(data, step)
            except zlib.error:
                if self._wbits != zlib.MAX_WBITS or self._out or n:
                    raise ValueError(f"a bad {self.encoding} body") from None
                self._wbits = -zlib.MAX_WBITS  # a server sending raw deflate (some do)
                z = self._z = zlib.decompressobj(self._wbits)
                continue
            parts.append(piece)
            n += len(piece)
            data = z.unconsumed_tail
            if z.eof and z.unused_data:  # a gzip body of several members
                data = z.unused_data
                z = self._z = zlib.decompressobj(self._wbits)
            elif not data and len(piece) < step:
                break  # all the input inflated
        self._out += n
        return parts[0] if len(parts) == 1 else b"".join(parts)


def json_of(raw: bytes | str) -> Any:
    """A server's JSON, or ValueError, naming the depth limit where the nesting is what is wrong."""
    try:
        return orjson_loads(raw)
    except ValueError as e:
        if "depth" in str(e) or "recursion" in str(e).lower():
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
        raise


def brief(value: Any) -> str:
    """A parsed JSON value as text: a string as it is, anything else shown to a few levels (str() of
    deeply nested lists would recurse past Python's limit)."""
    return value if type(value) is str else _BRIEF.repr(value)
