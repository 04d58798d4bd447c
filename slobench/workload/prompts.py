"""Prompts of an exact (token-id) or near-exact (text) length.

Token-id prompts go to /v1/completions as a list of ints, which vLLM and SGLang take verbatim, so the
prompt has exactly the asked number of tokens. Ids come from a middle range of the vocabulary
(default [1000, 30000)) to stay clear of special and control tokens at the low end, and of ids past the
end of a small vocabulary; a server's smaller one is found at preflight and the ids mapped below its end
(slobench.workload.limits). Text prompts (chat) are random common short English words, chosen so that
each, with its leading space, is one BPE token in common tokenizers (GPT-2, cl100k, Llama): n words are
about n tokens, and the chat template adds a few more. For text, the server's `usage` is the source of truth.

Prompts are random, not repeated text: two prompts share a prefix only when asked to (`prefix=`), so a
server's prefix cache gets no accidental hits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TOKEN_ID_RANGE",
    "WORDS",
    "random_text",
    "random_token_ids",
    "TokenPromptDraws",
    "text_prompts",
    "token_prompts",
]

DEFAULT_TOKEN_ID_RANGE: tuple[int, int] = (1000, 30000)  # half-open: 1000 <= id < 30000

# Very common short words (at most 6 letters). Order matters: changing it changes every text prompt
# for a given seed.
WORDS: tuple[str, ...] = tuple(
    w
    for w in """the of and to in is it you that he was for on are as with his they at be this have from or one
    had by but not what all were we when your can said there use an each which she do how their if will
    up other about out many then them these so some her would make like him into time has look two more
    write go see number no way could people my than first water been call who its now find long down day
    did get come made may part over new sound take only little work know place year live me back give
    most very after thing our just name good man think say great where help through much before line
    right too mean old any same tell boy follow came want show also around form three small set put end
    does another well large must big even such because turn here why ask went men read need land
    different home us move try kind hand picture again change off play spell air away animal house point
    page letter mother answer found study still learn should world high every near add food between own
    below country plant last school father keep tree never start city earth eye light thought head under
    story saw left few while along might close something seem next hard open example begin life always
    those both paper together got group often run important until children side feet car mile night
    walk white sea began grow took river four carry state once book hear stop without second late miss
    idea enough eat face watch far real almost let above girl sometimes""".split()
    if len(w) <= 6 and w not in {"oil", "spell", "mile"}
)

# Requests per batch when building prompts: bounds the temporary arrays, and fixes the draw boundaries so
# the first k prompts are the same whatever the total number of requests.
_BATCH = 4096


@lru_cache(maxsize=4)
def _id_objects(lo: int, hi: int) -> np.ndarray:
    # One Python int object per id, shared by every prompt: 100k chat prompts hold ~115M ids, and
    # per-element ints from `tolist()` would cost 36 bytes each instead of one 8-byte pointer.
    return np.array(range(lo, hi), dtype=object)


def _check_id_range(id_range: tuple[int, int]) -> tuple[int, int]:
    lo, hi = int(id_range[0]), int(id_range[1])
    if not 0 <= lo < hi:
        raise ValueError(f"id_range must satisfy 0 <= lo < hi (got {id_range!r})")
    return lo, hi


def random_token_ids(
    n: int, rng: np.random.Generator, id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
) -> tuple[int, ...]:
    """n random token ids, e.g. a shared system-prompt prefix for `token_prompts(prefix=...)`."""
    lo, hi = _check_id_range(id_range)
    return tuple(_id_objects(lo, hi)[rng.integers(0, hi - lo, size=n, dtype=np.int32)].tolist())


def _suffix_lengths(lengths: Sequence[int] | np.ndarray, num_prefix: int) -> np.ndarray:
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional (got shape {lens.shape})")
    if lens.size and lens.min() < max(num_prefix, 1):
        raise ValueError(
            f"every length must be >= max(1, prefix length {num_prefix}) (got min {int(lens.min())})"
        )
    return lens - num_prefix


def token_prompts(
    lengths: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    *,
    id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
    prefix: Sequence[int] = (),
) -> list[tuple[int, ...]]:
    """One token-id prompt per length. `lengths` are totals, prefix included: prompt i has exactly
    lengths[i] ids, the first len(prefix) of which are `prefix`."""
    return [p for batch in token_prompt_batches(lengths, rng, id_range=id_range, prefix=prefix) for p in batch]


def token_prompt_batches(
    lengths: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    *,
    id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
    prefix: Sequence[int] = (),
) -> Iterator[list[tuple[int, ...]]]:
    """`token_prompts` a batch at a time, each drawn when it is taken: the same prompts, without holding
    them all (100k chat prompts as tuples are ~0.9 GB)."""
    lo, hi = _check_id_range(id_range)
    head = tuple(int(x) for x in prefix)
    suffix = _suffix_lengths(lengths, len(head))
    objs = _id_objects(lo, hi)
    for b in range(0, len(suffix), _BATCH):
        lens = suffix[b : b + _BATCH]
        ids = objs[rng.integers(0, hi - lo, size=int(lens.sum()), dtype=np.int32)]
        start = 0
        out: list[tuple[int, ...]] = []
        for n in lens.tolist():
            # tolist() of an object array hands back the shared ints; no per-element allocation.
            out.append(head + tuple(ids[start : start + n].tolist()))
            start += n
        yield out


def token_prompt_heads(
    lengths: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    num_tokens: int,
    *,
    id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
    prefix: Sequence[int] = (),
) -> Iterator[bytes | None]:
    """The first `num_tokens` ids of each prompt `token_prompts` would draw from the same `rng` state, as
    int64 bytes (None for a prompt shorter than that), without building the prompts: a tenth of their cost."""
    return iter(TokenPromptDraws(lengths, rng, id_range=id_range, prefix=prefix).heads(num_tokens))


class TokenPromptDraws:
    """The prompts `token_prompt_batches` draws from `rng`, kept as where each batch's draw starts (the
    generator's state) instead of as tuples: `heads` reads every prompt's first ids in one pass, and
    `prompt(i)` draws prompt i again when something needs its ids (its batch, re-drawn; the last one
    kept). For a simulator, which needs a prompt's ids only where another prompt could share them."""

    def __init__(self, lengths: Sequence[int] | np.ndarray, rng: np.random.Generator, *,
                 id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE, prefix: Sequence[int] = ()) -> None:
        self.lo, self.hi = _check_id_range(id_range)
        self.prefix = tuple(int(x) for x in prefix)
        self.suffix = _suffix_lengths(lengths, len(self.prefix))
        self._rng = rng
        self._states: list[Any] = []  # the generator's state before each batch's draw
        self._batch: tuple[int, np.ndarray] | None = None  # (batch index, its ids), the last drawn

    def __len__(self) -> int:
        return len(self.suffix)

    def lengths(self) -> np.ndarray:
        """Each prompt's length, prefix included."""
        return self.suffix + len(self.prefix)

    def _draw(self, b: int) -> np.ndarray:
        """Batch b's ids (offsets from lo, int32), as token_prompt_batches draws them."""
        lens = self.suffix[b * _BATCH : (b + 1) * _BATCH]
        if b < len(self._states):
            bits = type(self._rng.bit_generator)()
            bits.state = self._states[b]
            rng = np.random.Generator(bits)
        else:  # the first pass: every batch before b has been drawn from self._rng
            assert b == len(self._states), "batches are first drawn in order"
            self._states.append(self._rng.bit_generator.state)
            rng = self._rng
        ids = rng.integers(0, self.hi - self.lo, size=int(lens.sum()), dtype=np.int32)
        self._batch = (b, ids)
        return ids

    def _ids_of(self, b: int) -> np.ndarray:
        if self._batch is not None and self._batch[0] == b:
            return self._batch[1]
        while len(self._states) < b:  # (a prompt asked for before the pass reached it)
            self._draw(len(self._states))
        return self._draw(b)

    def heads(self, num_tokens: int) -> list[bytes | None]:
        """The first `num_tokens` ids of each prompt as int64 bytes; None for a prompt shorter than that."""
        head = np.array(self.prefix, dtype=np.int64)
        k = max(num_tokens - len(head), 0)  # ids each head takes from the draw
        out: list[bytes | None] = []
        for b in range(-(-len(self.suffix) // _BATCH)):
            lens = self.suffix[b * _BATCH : (b + 1) * _BATCH]
            ids = self._ids_of(b)
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            full = lens + len(head) >= num_tokens
            rows = ids[starts[full][:, None] + np.arange(k)].astype(np.int64) + self.lo
            rows = np.concatenate([np.broadcast_to(head, (len(rows), len(head))), rows], axis=1)[:, :num_tokens]
            data, width, at = np.ascontiguousarray(rows).tobytes(), num_tokens * 8, 0
            for f in full.tolist():
                if f:
                    out.append(data[at : at + width])
                    at += width
                else:
                    out.append(None)
        return out

    def prompt(self, i: int) -> tuple[int, ...]:
        """Prompt i, as token_prompts draws it."""
        b = i // _BATCH
        ids = self._ids_of(b)
        lens = self.suffix[b * _BATCH : i + 1]
        start = int(lens[:-1].sum())
        objs = _id_objects(self.lo, self.hi)
        return self.prefix + tuple(objs[ids[start : start + int(lens[-1])]].tolist())


def random_text(n: int, rng: np.random.Generator) -> str:
    """n random words joined by spaces (about n tokens), e.g. a shared system prompt."""
    words = np.asarray(WORDS, dtype=object)
    return " ".join(words[rng.integers(0, len(WORDS), size=n)].tolist())


def text_prompts(
    lengths: Sequence[int] | np.ndarray, rng: np.random.Generator, *, prefix: str = ""
) -> list[str]:
    """One text prompt of lengths[i] words per length (about that many tokens). `lengths` include the
    prefix, whose length is counted in words."""
    head = prefix.split()
    suffix = _suffix_lengths(lengths, len(head))
    words = np.asarray(WORDS, dtype=object)
    head_text = " ".join(head)
    out: list[str] = []
    for b in range(0, len(suffix), _BATCH):
        lens = suffix[b : b + _BATCH]
        chosen = words[rng.integers(0, len(WORDS), size=int(lens.sum()), dtype=np.int32)].tolist()
        start = 0
        for n in lens.tolist():
            body = " ".join(chosen[start : start + n])
            out.append(f"{head_text} {body}" if head and n else (head_text or body))
            start += n
    return out
