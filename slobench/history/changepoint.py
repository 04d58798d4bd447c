"""Change points in one metric's history: a shift the per-commit gate missed because each step was small.

The per-commit gate compares a candidate with the commit before it: ten merges that each cost 2% pass it
one by one (inside a 5% threshold) and together cost 18%. This looks at the whole series of commit means:
binary segmentation with a likelihood-ratio (CUSUM) statistic (`shift_test`), a simulated null
(`null_statistics`), a robust noise scale (`noise_scale`) and a practical-size floor (`find_change_points`).
It assumes commit means independent under no change: noise correlated over commits (a runner pool that
slowly degrades) is a change too, and is reported as one. The false-alarm rate on noise-only histories is
measured in benchmarks/history_changepoint.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np

MIN_SEGMENT = 2  # commits on each side of a change: one odd commit is the per-commit gate's business
MIN_COMMITS = 2 * MIN_SEGMENT + 1
NUM_NULL = 19_999


@dataclass(frozen=True, slots=True)
class ChangePoint:
    index: int  # the first commit of the new segment
    before_mean: float
    after_mean: float
    shift: float  # after - before, relative to before when `is_relative`, else absolute
    is_relative: bool
    p_value: float
    statistic: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def noise_scale(x: np.ndarray) -> np.ndarray:
    """Robust per-row noise sd from first differences (rows are series); works on (n,) or (B, n): their MAD
    about their median, / sqrt(2). First differences remove a slow drift (their median is its rate) and
    the MAD ignores the one big difference a step makes, so s is the noise's scale with or without a change.
    Not the replicates' own intervals: replicates of one CI job share its runner, so the job-to-job scatter
    (another machine, another neighbour) is wider than they say, and every runner change would alarm."""
    d = np.diff(x, axis=-1)
    med = np.median(d, axis=-1, keepdims=True)
    return 1.4826 * np.median(np.abs(d - med), axis=-1) / math.sqrt(2)


def _statistics(x: np.ndarray, min_segment: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the largest standardised mean shift and where it is. x has shape (B, n).
    T = max over splits k of |mean(x[k:]) - mean(x[:k])| / (s * sqrt(1/k + 1/(n-k))), the likelihood-ratio
    statistic for one shift in the mean of Gaussian noise of scale s, each side >= `min_segment` long."""
    n = x.shape[-1]
    k = np.arange(min_segment, n - min_segment + 1)
    csum = np.cumsum(x, axis=-1)
    total = csum[:, -1:]
    before = csum[:, k - 1] / k
    after = (total - csum[:, k - 1]) / (n - k)
    s = noise_scale(x)
    # a series of identical values (a deterministic simulation) has s = 0: any shift is then real, and the
    # floor keeps the ratio finite and still ordered by the size of the shift
    floor = 1e-9 * np.maximum(np.abs(np.median(x, axis=-1)), 1e-12)
    z = np.abs(after - before) / (np.maximum(s, floor)[:, None] * np.sqrt(1 / k + 1 / (n - k)))
    best = np.argmax(z, axis=-1)
    return z[np.arange(len(z)), best], k[best]


@functools.lru_cache(maxsize=256)
def null_statistics(n: int, min_segment: int = MIN_SEGMENT, num_null: int = NUM_NULL) -> np.ndarray:
    """T of `num_null` noise-only series of length n, sorted: with s estimated from the series, T depends
    only on n, so one simulation per n (seeded and cached: a page is the same every time) gives p-values as
    fine as 1/num_null. A permutation test would need no Gaussian assumption, but a step halfway through ten
    commits would be undetectable below alpha 2/C(10,5) = 0.8% (shuffles that keep the halves apart are as
    extreme as the truth), and a page of 11 metrics tests each at alpha/11. Heavy-tailed noise (an odd
    commit) is tempered by the robust s and by segments of at least two commits."""
    rng = np.random.default_rng(1_000_003 * n + min_segment)
    chunks = []
    for start in range(0, num_null, 4096):
        x = rng.standard_normal((min(4096, num_null - start), n))
        chunks.append(_statistics(x, min_segment)[0])
    out = np.sort(np.concatenate(chunks))
    out.setflags(write=False)
    return out


def shift_test(x: np.ndarray, *, min_segment: int = MIN_SEGMENT, num_null: int = NUM_NULL) -> tuple[int, float, float]:
    """(split, p-value, statistic) of the single most likely shift in `x`."""
    x = np.asarray(x, dtype=float)
    stat, split = _statistics(x[None, :], min_segment)
    null = null_statistics(len(x), min_segment, num_null)
    extreme = len(null) - int(np.searchsorted(null, stat[0], side="left"))
    return int(split[0]), (extreme + 1) / (len(null) + 1), float(stat[0])


def find_change_points(
    values: list[float] | np.ndarray, *, alpha: float = 0.01, min_shift: float = 0.05, is_relative: bool = True,
    min_segment: int = MIN_SEGMENT,
) -> list[ChangePoint]:
    """Change points of one metric's commit means, in commit order. A change is reported only when the
    shift between the segments' means is also beyond `min_shift` (the history page passes the gate's own
    defaults: capacity 5%, attainment 2 points, latencies 10%). After a change at k each side is searched
    again, so a drift shows as one or more change points; the first test decides whether anything is
    reported, so a series' false-alarm rate is that test's alpha."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    x = np.asarray(values, dtype=float)
    if np.any(~np.isfinite(x)):
        raise ValueError("values must be finite (leave out commits without the metric)")
    # enough null draws that the smallest p-value possible is well below alpha
    num_null = max(NUM_NULL, int(math.ceil(20 / alpha)))
    found: list[ChangePoint] = []

    def search(lo: int, hi: int) -> None:
        seg = x[lo:hi]
        if len(seg) < 2 * min_segment + 1:
            return
        split, p, stat = shift_test(seg, min_segment=min_segment, num_null=num_null)
        if p >= alpha:
            return
        before, after = float(seg[:split].mean()), float(seg[split:].mean())
        if is_relative:
            shift = (after - before) / abs(before) if before != 0 else math.inf
        else:
            shift = after - before
        if abs(shift) < min_shift:
            return
        found.append(ChangePoint(lo + split, before, after, shift, is_relative, p, stat))
        search(lo, lo + split)
        search(lo + split, hi)

    search(0, len(x))
    return sorted(found, key=lambda c: c.index)
