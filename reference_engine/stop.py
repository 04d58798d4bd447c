"""Stop strings: a request's output text, cut at the first stop string, as its tokens arrive.

Semantics follow vLLM's: a stop string is looked for only in text that ends at or after the request's
`min_tokens`-th output token; the text is cut before the stop string (or after it with
`include_stop_str_in_output`) and the request finishes with reason "stop" on the token that completed it.
While a stop string could still be forming, up to (longest stop string − 1) characters are held back from
a stream, so no part of a stop string is ever sent.

The engine's scheduler and the server each keep one `OutputText` per request and feed it the same tokens:
the engine to end the request in the step that completed the stop string (its KV blocks freed, no token
generated past it), the server to send the cut text.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference_engine.tokenizer import IncrementalDecoder

MAX_STOP_STRINGS = 32


class OutputText:
    def __init__(self, stop: Sequence[str] = (), *, include_stop: bool = False, min_tokens: int = 0) -> None:
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        self.stop = tuple(stop)
        self.include_stop = include_stop
        self.min_tokens = min_tokens
        self.stopped = False
        self.num_tokens = 0
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._decoder = IncrementalDecoder()
        self._pending = ""  # decoded text not yet released

    def push(self, token_id: int) -> str:
        """Feed one output token; returns the text that can be released now (possibly empty)."""
        if self.stopped:
            return ""
        self.num_tokens += 1
        checked = len(self._pending)
        self._pending += self._decoder.push((token_id,))
        if self.stop and self.num_tokens >= self.min_tokens:
            cut = self._find_stop(checked)
            if cut is not None:
                out, self._pending, self.stopped = self._pending[:cut], "", True
                return out
        keep = min(self._hold, len(self._pending))
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return out

    def __call__(self, token_id: int) -> bool:
        """The engine's check: feed the token, say whether a stop string has now ended the output."""
        self.push(token_id)
        return self.stopped

    def flush(self) -> str:
        """The text still held back, when the request ends for another reason (EOS, length)."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.flush()
        self._pending = ""
        return out

    def _find_stop(self, checked: int) -> int | None:
        """Where to cut `_pending` for the earliest stop string that ends in its new text (past `checked`)."""
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self._pending.find(s, max(0, checked - len(s) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        return i + len(s) if self.include_stop else i
