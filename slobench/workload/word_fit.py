"""How many tokens a server counts for slobench's text prompts, fitted from a few counts of probe texts.

A text prompt of w words reaches the server as `fixed + per_word * w` tokens: `fixed` is what the server adds
to every prompt of the API the run uses (a chat template's role markers and system preamble, a BOS token,
the first word's missing leading space) and `per_word` what it counts a word of `prompts.WORDS` (1 in
common BPE vocabularies, about 5 in a byte-level one). Both are fitted from the counts of probe texts that
are prefixes of one another (`probe_lengths`, `probe_text`): the difference between the longest and the
shortest gives `per_word`, the shortest less its words the fixed cost, and the groups of words between
successive probes how much single words differ (`sd_per_word`), from which a prompt's margin below a
server's context is derived (`margin_tokens`). Preflight fits it from the server's `usage.prompt_tokens`;
the simulator from its engine's own tokenizer and chat template, so both send and bound text the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from slobench.workload.prompts import WORDS

NUM_GROUPS = 4  # groups of words between successive probes: their spread is the words' spread
PROBE_SEED = 7  # the order of the probe's words (every word of WORDS once before any repeats)
MARGIN_SDS = 4.0  # a prompt's margin below the context, in standard deviations of its count


@dataclass(frozen=True, slots=True)
class WordFit:
    """A server's count of a text prompt of w words: `fixed_tokens + tokens_per_word * w`, give or take
    `sd_per_word * sqrt(w)` (words drawn at random from `WORDS`). `probe_words`: how many words the fit saw
    (every word of `WORDS` once when it is at least their number: `tokens_per_word` is then their mean)."""

    tokens_per_word: float = 1.0
    fixed_tokens: float = 0.0
    sd_per_word: float = 0.0
    probe_words: int = len(WORDS)  # (the words past the first probe's: the words whose mean it is)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tokens_per_word) and self.tokens_per_word > 0):
            raise ValueError(f"tokens_per_word must be a finite number > 0 (got {self.tokens_per_word!r})")
        if not math.isfinite(self.fixed_tokens):
            raise ValueError(f"fixed_tokens must be finite (got {self.fixed_tokens!r})")
        if not (math.isfinite(self.sd_per_word) and self.sd_per_word >= 0):
            raise ValueError(f"sd_per_word must be a finite number >= 0 (got {self.sd_per_word!r})")
        if self.probe_words < 1:
            raise ValueError(f"probe_words must be >= 1 (got {self.probe_words!r})")

    @property
    def overhead_tokens(self) -> int:
        """The fixed cost as the whole tokens a text prompt is shortened by (none below zero)."""
        return max(0, round(self.fixed_tokens))

    def num_words(self, num_tokens: int) -> int:
        """The words of a text prompt the server counts as about `num_tokens` tokens, fixed cost included."""
        return max(1, round((num_tokens - self.fixed_tokens) / self.tokens_per_word))

    def margin_tokens(self, num_tokens: int) -> int:
        """Tokens to keep free below a context for a prompt asked as `num_tokens`: MARGIN_SDS standard
        deviations of its count (the words drawn, and `tokens_per_word` itself where the probe saw fewer words
        than `WORDS` holds), plus one word for rounding the number of words."""
        words = self.num_words(num_tokens)
        unseen = max(0.0, 1.0 - self.probe_words / len(WORDS))  # the fit's own error: none once every word is seen
        var = self.sd_per_word ** 2 * (words + words * words * unseen / self.probe_words)
        return math.ceil(MARGIN_SDS * math.sqrt(var) + self.tokens_per_word)


def probe_order() -> list[str]:
    """WORDS in a fixed shuffled order: every probe's words, and each group between probes a fair sample."""
    order = np.random.default_rng(PROBE_SEED).permutation(len(WORDS))
    return [WORDS[i] for i in order.tolist()]


def probe_lengths(max_words: int) -> list[int]:
    """The word counts of the probe texts: 1, then NUM_GROUPS steps up to min(max_words, len(WORDS) + 1) (the
    words past the first then hold every word of WORDS once, the first again last)."""
    top = max(NUM_GROUPS + 1, min(max_words, len(WORDS) + 1))
    return [1, *(round(1 + k * (top - 1) / NUM_GROUPS) for k in range(1, NUM_GROUPS + 1))]


def probe_text(num_words: int) -> str:
    """The first `num_words` words of the probe order (cycled past its end), joined as prompts join them."""
    order = probe_order()
    return " ".join(order[i % len(order)] for i in range(num_words))


def fit_words(lengths: Sequence[int], counts: Sequence[int]) -> WordFit:
    """The fit of the counts a server gave the probe texts of `lengths` words (`probe_lengths`, ascending)."""
    if len(lengths) != len(counts) or len(lengths) < 2:
        raise ValueError(f"need the counts of at least two probes, one each (got {len(lengths)} and {len(counts)})")
    span = lengths[-1] - lengths[0]
    per_word = (counts[-1] - counts[0]) / span
    if not per_word > 0:
        raise ValueError(f"the count did not grow with the words ({list(counts)} for {list(lengths)} words)")
    fixed = counts[0] - per_word * lengths[0]
    steps = [(lengths[k] - lengths[k - 1], counts[k] - counts[k - 1]) for k in range(1, len(lengths))]
    var = (sum((c - per_word * w) ** 2 / w for w, c in steps if w > 0) / (len(steps) - 1)) if len(steps) > 1 else 0.0
    return WordFit(per_word, fixed, math.sqrt(var), span)


def fit_counter(count: Callable[[str], int], max_words: int = len(WORDS) + 1) -> WordFit:
    """The fit for a counter at hand (a tokenizer and chat template in process): the probes counted directly."""
    lengths = probe_lengths(max_words)
    return fit_words(lengths, [count(probe_text(n)) for n in lengths])
