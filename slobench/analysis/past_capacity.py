"""Past capacity by throughput: did the server complete requests as fast as they arrived?

A run past capacity may end before its queue grows into SLO misses (a few seconds of arrivals at a rate a
little above what the server carries), so attainment alone can read "met" at a rate the server cannot
sustain. What such a run cannot hide is that completions fall behind arrivals. Over the second half of the
arrival window (the first half lets the pipeline fill: a server that keeps up then completes, on average,
as many requests as arrive) the count of completed requests is set against the count of arrivals in the
same window. A server that keeps up completes as many as arrived, less the change in
what is in flight: C = A + L(start) - L(end). Arrival counts are Poisson, and what a server that keeps up
holds in flight is roughly Poisson too (an M/G/inf queue's), so the run is marked past capacity when the
completions fall below the arrivals by more than z(`ALPHA`) standard deviations of A + 2 L(start): a
margin that grows as the square root of the counts, not a fixed percentage. Past capacity, the queue
grows with the run and so does the shortfall, linearly, while the margin grows as its square root. No
verdict for windows of fewer than `MIN_ARRIVALS` arrivals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slobench.analysis.metrics import RecordArrays

ALPHA = 0.005  # one-sided: z = 2.58
MIN_ARRIVALS = 20  # fewer arrivals in the window: no verdict


def completion_counts(a: RecordArrays) -> dict[str, Any] | None:
    """Arrivals and successful completions over the second half of the arrival window (scheduled times),
    with the window's length; None when the window holds fewer than MIN_ARRIVALS arrivals."""
    sched = a.scheduled_s
    if len(sched) < 2:
        return None
    start, end = float(sched.min()), float(sched.max())
    mid = (start + end) / 2
    arrivals = int(np.count_nonzero((sched > mid) & (sched <= end)))
    if arrivals < MIN_ARRIVALS or not end > mid:
        return None
    done = a.done_s
    finished = a.is_ok & ~np.isnan(done)
    completed = int(np.count_nonzero(finished & (done > mid) & (done <= end)))
    in_flight = int(np.count_nonzero((sched <= mid) & ~(finished & (done <= mid))))
    return {"window_s": end - mid, "window_arrivals": arrivals, "window_completed": completed,
            "in_flight_at_start": in_flight}


def falls_short(arrivals: int, completed: int, in_flight: int, alpha: float = ALPHA) -> bool:
    """Whether `completed` lies below `arrivals` by more than the one-sided `alpha` margin of a server that
    keeps up: z(alpha) * sqrt(arrivals + 2 * in_flight), `in_flight` held when the window opened."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha}: must be in (0, 1)")
    if arrivals < MIN_ARRIVALS or completed >= arrivals:
        return False
    from scipy.stats import norm  # imported when needed, as slobench.analysis.slo does

    margin = float(norm.isf(alpha)) * math.sqrt(arrivals + 2 * max(in_flight, 0))
    return arrivals - completed > margin


def shortfall(counts: dict[str, Any] | None) -> dict[str, Any]:
    """The counts with their verdict (`completions_short`), as a summary's queue_drift holds them."""
    if counts is None:
        return {}
    short = falls_short(counts["window_arrivals"], counts["window_completed"], counts["in_flight_at_start"])
    return {**counts, "completions_short": short}
