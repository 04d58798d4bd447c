"""An incremental Server-Sent Events parser: raw bytes in, in any split; events out. Pure, no I/O.

Follows the WHATWG event-stream rules: lines end in `\\n`, `\\r\\n` or a lone `\\r`; a line starting with `:`
is a comment (keep-alives); `field: value` drops one space after the colon; several `data:` lines join
with `\\n`; a blank line dispatches the event (an event with no data is not dispatched); an incomplete
event at end of stream is discarded. A leading UTF-8 BOM is skipped. Bytes that are not UTF-8 raise
`SSEDecodeError`, since the spec's replacement-character decoding would hide a broken server. Every
streamed token passes through here: line endings are found on bytes, the complete lines of a feed are
decoded once, and a read of whole one-line `data: ` events (the common case) skips all that (`data_events`).
"""

from __future__ import annotations

from typing import NamedTuple

from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, over_limit

DONE = "[DONE]"  # the OpenAI end-of-stream sentinel, carried as an event's data
_BOM = b"\xef\xbb\xbf"
# The longest line, and event, a stream may send (--max-body). An LLM's event is a few hundred bytes (a whole
# non-streamed answer a few MB); a line that never ends is a broken or hostile server, and is refused
# rather than buffered.
MAX_LINE_BYTES = DEFAULT_MAX_BODY_BYTES


class SSEEvent(NamedTuple):
    data: str
    event: str = "message"
    id: str | None = None  # the last event id seen on the stream (it persists across events, per spec)


class SSEDecodeError(ValueError):
    """The stream held bytes that are not UTF-8. `events` holds those completed before the bad line."""

    def __init__(self, message: str, events: list[SSEEvent]) -> None:
        super().__init__(message)
        self.events = events


class SSELineTooLong(SSEDecodeError):
    """A line, or an event's data lines together, grew past `max_line_bytes`."""


def _too_long(max_bytes: int, what: str = "line") -> SSELineTooLong:
    return SSELineTooLong(f"SSE {what} {over_limit(max_bytes, '--max-body').removeprefix('response body ')}: "
                          "the stream is refused", [])


class SSEParser:
    """Feed it bytes as they arrive; it returns the events each feed completes.

    A line arriving in many pieces is gathered in a bytearray and joined once its end comes, so a long
    line read in many pieces costs linear time, not a copy of the whole tail per piece."""

    __slots__ = ("_tail", "_skip_lf", "_at_start", "_data", "_data_chars", "_event", "_last_id", "max_line_bytes")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._tail = bytearray()  # bytes after the last line ending seen (never holds \r or \n)
        self._skip_lf = False  # the previous feed ended in \r: a \n opening the next one ends no line
        self._at_start = True  # a BOM may still be coming
        self._data: list[str] = []
        self._data_chars = 0  # of the data lines in `_data`
        self._event = ""
        self._last_id: str | None = None

    @property
    def has_pending(self) -> bool:
        """True if an unfinished line or event is buffered (a stream that stops here was cut short)."""
        return bool(self._tail or self._data or self._event)

    def data_events(self, chunk: bytes) -> list[bytes] | None:
        """The data of each event in `chunk` when it is nothing but whole events of one `data: ` line each
        (`data: X\\n\\n` repeated) and nothing is buffered: what an LLM server writes, a token an event, and
        what a read mostly returns, one event or a few. The caller skips `feed` for it (no line splitting,
        no decode, no event objects). None: `feed` the chunk instead; the parser's state is then as it was,
        so feeding it gives exactly what feeding alone would have. The bytes are not checked for UTF-8
        here: a caller that cannot parse them feeds the chunk to hear why."""
        if (
            self._tail
            or self._data
            or self._event
            or self._skip_lf
            or not chunk.startswith(b"data: ")
            or not chunk.endswith(b"\n\n")
            or b"\r" in chunk
        ):
            return None
        n = chunk.count(b"\n")
        if n == 2:  # the commonest: one event
            datas = [chunk[6:-2]]
        else:
            # Whole one-line events only when every line feed is in a "\n\ndata: " between two events or
            # in the last "\n\n": then no line holds another field, a comment or a blank.
            if n & 1 or chunk.count(b"\n\ndata: ") != (n >> 1) - 1:
                return None
            datas = chunk[6:-2].split(b"\n\ndata: ")
        self._at_start = False  # it began with "data: ": no BOM can come now
        return datas

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []  # and keeps _skip_lf: the \n may still be coming
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if self._tail and b"\n" not in chunk and b"\r" not in chunk:
            self._tail += chunk  # still inside one line: amortised append, no copy of what came before
            if len(self._tail) > self.max_line_bytes:
                raise _too_long(self.max_line_bytes)
            return []
        buf = bytes(self._tail) + chunk if self._tail else chunk
        if self._at_start:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._tail = bytearray(buf)
                return []
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[3:]
        if b"\r" in buf:
            if buf[-1:] == b"\r":
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = buf.rfind(b"\n")
        if end < 0:
            self._tail = bytearray(buf)
            if len(buf) > self.max_line_bytes:
                raise _too_long(self.max_line_bytes)
            return []
        self._tail = bytearray(buf[end + 1 :])
        try:
            text = buf[:end].decode("utf-8")
        except UnicodeDecodeError as e:
            # Lines before the bad one are good: hand their events over with the error.
            good = buf.rfind(b"\n", 0, e.start)
            events = self._lines(buf[:good].decode("utf-8").split("\n")) if good >= 0 else []
            snippet = buf[max(0, e.start - 20) : e.start + 20]
            raise SSEDecodeError(
                f"SSE stream is not UTF-8: byte {buf[e.start]:#04x} in {snippet!r}", events
            ) from None
        return self._lines(text.split("\n"))

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if line.startswith("data:"):
                data.append(line[6:] if line[5:6] == " " else line[5:])
                self._data_chars += len(line)
                if self._data_chars > self.max_line_bytes:  # an event of endless data lines
                    raise _too_long(self.max_line_bytes, "event")
            elif not line:
                if data:
                    events.append(SSEEvent("\n".join(data), self._event or "message", self._last_id))
                    data.clear()
                    self._data_chars = 0
                self._event = ""
            elif line[0] == ":":
                continue
            else:
                name, colon, value = line.partition(":")
                if colon and value[:1] == " ":
                    value = value[1:]
                if name == "event":
                    self._event = value
                elif name == "id":
                    if "\0" not in value:
                        self._last_id = value
                elif name == "data":  # "data" with no colon: an empty data line
                    data.append(value)
                    self._data_chars += 1
                # "retry" and unknown fields are ignored, as the spec says.
        return events
