"""Text from outside (a server's model name and error messages, a file's fields) made safe to print.

A terminal obeys escape sequences wherever they come from: a model name holding `ESC ] 0 ;` retitles the
window, `ESC [ 2 J` clears the screen, a bare CR overwrites the line before it. `printable` spells every
C0 control but newline and tab, DEL, every C1 control and the Unicode bidi overrides as a visible escape
(`\\x1b`, `\\u202e`), so what a server sent is shown, never obeyed. Files and JSON keep the raw text.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object) -> str:
    """`text` (or its str) with every control character a terminal would obey written as an escape."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, s)
