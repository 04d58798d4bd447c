"""Where does the warm-up end? The MSER-5 rule (White 1997; Hoad, Robinson & Davies 2008).

A run starts from an empty server, so its first requests see no queue and no full KV cache: counted, they
flatter attainment near capacity. MSER-5 picks the truncation point that minimises the standard error of
the mean of what remains: average the series in batches of 5, and for each candidate cut d (in batches,
up to half the series) compute  sum((Y_i - mean(Y_d..))^2) / (m - d)^2  over the remaining batch means;
keep the d with the smallest value. A transient makes early batches far from the steady mean, so cutting
them lowers the statistic more than the shrinking sample raises it.
"""

from __future__ import annotations

import numpy as np

BATCH = 5


def mser5_cut(x: np.ndarray) -> int:
    """How many leading observations of `x` (in arrival order) to drop; 0 when there are too few."""
    x = np.asarray(x, dtype=float)
    m = len(x) // BATCH
    if m < 4:
        return 0
    y = x[: m * BATCH].reshape(m, BATCH).mean(axis=1)
    # sums over each suffix y[d:], vectorised: for every d the SSE about the suffix mean
    rev_sum = np.cumsum(y[::-1])[::-1]
    rev_sq = np.cumsum((y * y)[::-1])[::-1]
    n = np.arange(m, 0, -1, dtype=float)  # m - d
    sse = rev_sq - rev_sum * rev_sum / n
    stat = sse / (n * n)
    d = int(np.argmin(stat[: m // 2 + 1]))
    return d * BATCH


def latency_series(ttft_from_scheduled_s: np.ndarray) -> np.ndarray:
    """The series MSER-5 is run on: TTFT from the scheduled arrival (queueing shows there first), with
    failed requests at the worst latency seen, so a burst of failures reads as the transient it is."""
    x = np.asarray(ttft_from_scheduled_s, dtype=float).copy()
    finite = np.isfinite(x)
    if not finite.any():
        return np.zeros_like(x)
    x[~finite] = x[finite].max()
    return x
