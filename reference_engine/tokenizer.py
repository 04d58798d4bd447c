"""A byte-level tokenizer for dummy models: text prompts work with no download.

Ids 0..255 are bytes, 256 is BOS, 257 is EOS. A model with a larger vocabulary (a dummy model shaped like
Llama-3.2-1B) can emit ids past 257; they decode to a placeholder word so streamed text is never empty.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from reference_engine.errors import ConfigError

BOS_ID = 256
EOS_ID = 257
NUM_BYTE_IDS = 256
MIN_VOCAB_SIZE = 258


def placeholder(token_id: int) -> str:
    return f" t{token_id}"


class ByteTokenizer:
    def __init__(self, vocab_size: int = MIN_VOCAB_SIZE) -> None:
        if vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError("vocab_size", vocab_size, f"a byte tokenizer needs at least {MIN_VOCAB_SIZE} ids")
        self.vocab_size = vocab_size
        self.bos_token_id = BOS_ID
        self.eos_token_id = EOS_ID

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        decoder = IncrementalDecoder()
        return decoder.push(ids) + decoder.flush()


class IncrementalDecoder:
    """Streams text token by token without splitting a multi-byte UTF-8 character: bytes of an unfinished
    character wait until the character completes. Invalid bytes become U+FFFD, as in `decode`."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token_id in ids:
            if 0 <= token_id < NUM_BYTE_IDS:
                pending.append(token_id)
            elif token_id in (BOS_ID, EOS_ID):
                continue
            else:
                # A placeholder word ends any unfinished character: what waited is invalid now.
                parts.append(self._utf8.decode(bytes(pending), final=True))
                pending.clear()
                parts.append(placeholder(token_id))
        parts.append(self._utf8.decode(bytes(pending)))
        return "".join(parts)

    def flush(self) -> str:
        """Text for bytes still waiting at the end of the stream (U+FFFD for a truncated character)."""
        return self._utf8.decode(b"", final=True)
