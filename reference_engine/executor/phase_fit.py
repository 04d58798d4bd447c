"""Step times fitted per phase, as DistServe's profiler gives them (OSDI 2024, `simdistserve/estimators`):

    prefill step = a + b * T + c * S        T: the step's prompt tokens, S: the sum of their squared lengths
    decode step  = a + b * C + c * B        C: the batch's context tokens, B: its decoding requests

with one (a, b, c) for decode batches below `large_batch_from` requests and another at or above it. S is
read from the step's attention pairs (a chunk of n tokens after `start` cached ones has n*start +
n*(n+1)/2): S = 2 * pairs - T, exact for whole prompts, the same quadratic work for a later chunk. A step
that mixes prompts and decodes (the chunked scheduler) costs the prefill formula plus the decode formula's
terms in B and C; the fits were made on steps of one phase, so such a step is an extrapolation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_engine.errors import ConfigError


def _triple(name: str, value: Any) -> tuple[float, float, float]:
    if (not isinstance(value, list | tuple) or len(value) != 3
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
        raise ConfigError(name, value, "must be three numbers [a, b, c]")
    return float(value[0]), float(value[1]), float(value[2])


@dataclass(frozen=True, slots=True)
class PhaseFit:
    """Seconds: `prefill` (a, b per prompt token, c per squared prompt token), `decode_small` and
    `decode_large` (a, b per context token, c per decoding request)."""

    prefill: tuple[float, float, float]
    decode_small: tuple[float, float, float]
    decode_large: tuple[float, float, float]
    large_batch_from: int

    def __post_init__(self) -> None:
        for name in ("prefill", "decode_small", "decode_large"):
            _triple(name, getattr(self, name))
        b = self.large_batch_from
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError("large_batch_from", b, "must be an integer >= 1")

    def step_s(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
               num_attention_pairs: int | None) -> float:
        t = 0.0
        decode_context = num_context_tokens
        if num_prefill_tokens:
            a, b, c = self.prefill
            # the decodes' context (each decode token attends to its whole context), read as if the prompts'
            # chunks started at 0; what is left of the pairs is the prompts'
            decode_context = max(num_context_tokens - num_prefill_tokens, 0) if num_decode_seqs else 0
            pairs = num_attention_pairs if num_attention_pairs is not None else num_context_tokens
            t = a + b * num_prefill_tokens + c * max(2 * (pairs - decode_context) - num_prefill_tokens, 0)
        if num_decode_seqs:
            a, b, c = self.decode_small if num_decode_seqs < self.large_batch_from else self.decode_large
            t += b * decode_context + c * num_decode_seqs + (0.0 if num_prefill_tokens else a)
        return t

    def scaled(self, factor: float) -> PhaseFit:
        def times(x: tuple[float, float, float]) -> tuple[float, float, float]:
            return x[0] * factor, x[1] * factor, x[2] * factor
        return PhaseFit(times(self.prefill), times(self.decode_small), times(self.decode_large),
                        self.large_batch_from)

    def with_step_overhead(self, extra_s: float) -> PhaseFit:
        """Every step `extra_s` longer (host work the fits of the forward pass leave out)."""
        return PhaseFit((self.prefill[0] + extra_s, *self.prefill[1:]),
                        (self.decode_small[0] + extra_s, *self.decode_small[1:]),
                        (self.decode_large[0] + extra_s, *self.decode_large[1:]), self.large_batch_from)

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": list(self.prefill), "decode_small": list(self.decode_small),
                "decode_large": list(self.decode_large), "large_batch_from": self.large_batch_from}

    @classmethod
    def from_dict(cls, raw: Any) -> PhaseFit:
        if not isinstance(raw, dict):
            raise ConfigError("phases", raw, "must be an object with prefill, decode_small, decode_large, "
                                             "large_batch_from")
        missing = sorted({"prefill", "decode_small", "decode_large", "large_batch_from"} - set(raw))
        if missing:
            raise ConfigError("phases", sorted(raw), f"lacks {missing}")
        return cls(_triple("prefill", raw["prefill"]), _triple("decode_small", raw["decode_small"]),
                   _triple("decode_large", raw["decode_large"]), raw["large_batch_from"])


def read_distserve(path: str | Path, model: str, tp: int) -> PhaseFit:
    """The fit for `model` at tensor-parallel degree `tp` from a DistServe profiler file
    (`{model: {tp: {"prefill": [a, b, c], "decoding_smallbs": ..., "decoding_largebs": ...,
    "decoding_large_small_bs_threshold": n}}}`, milliseconds), in seconds."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("profile", str(p), f"cannot read a DistServe profiler file: {e}") from None
    if not isinstance(raw, dict) or model not in raw or not isinstance(raw[model], dict):
        known = sorted(raw) if isinstance(raw, dict) else []
        raise ConfigError("profile", f"{p}@{model}", f"no such model in the file; it has {known}")
    entry = raw[model].get(str(tp))
    if not isinstance(entry, dict):
        raise ConfigError("profile", f"{p}@{model}/tp{tp}", f"no fit at that TP degree; it has {sorted(raw[model])}")
    try:
        ms = {k: _triple(k, entry[k]) for k in ("prefill", "decoding_smallbs", "decoding_largebs")}
        threshold = entry["decoding_large_small_bs_threshold"]
    except KeyError as e:
        raise ConfigError("profile", f"{p}@{model}/tp{tp}", f"lacks {e}") from None

    def s(x: tuple[float, float, float]) -> tuple[float, float, float]:
        return x[0] / 1e3, x[1] / 1e3, x[2] / 1e3
    return PhaseFit(s(ms["prefill"]), s(ms["decoding_smallbs"]), s(ms["decoding_largebs"]), threshold)
