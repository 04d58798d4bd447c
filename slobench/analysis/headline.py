"""A sweep's headline: the highest offered rate whose SLO attainment stays at or above the target, where the
attainment curve crosses it, with the interval its confidence band gives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary


def crossing_rate(rates: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """The offered rate at which attainment falls through `target`, linearly interpolated between the
    last measured rate at or above target and the first below it (DistServe's goodput definition).
    None if even the lowest rate misses; the highest rate if none misses (a lower bound)."""
    pts = sorted(zip(rates, values, strict=True))
    if not pts or pts[0][1] < target:
        return None
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if v0 >= target > v1:
            return r0 + (v0 - target) / (v0 - v1) * (r1 - r0)
    return pts[-1][0]


def headline(points: Sequence[RunSummary], slo: SLO | None) -> dict[str, Any] | None:
    """Highest offered rate whose attainment stays >= the SLO's target, with the interval it came from.
    `points`: each rate's summary (its `rate_rps` set), all judged against `slo`."""
    points = [p for p in points if p.attainment is not None]
    if slo is None or not points:
        return None
    rates = [p.offered_rate_rps for p in points]
    past = sorted(p.offered_rate_rps for p in points if p.overloaded)
    # A rate past capacity that still met the target met it only because its run ended first: its queue
    # grows for as long as the traffic lasts. For the crossing it counts as a miss, its interval with it.
    overstated = [p.overloaded and p.attainment.value >= slo.target for p in points]  # type: ignore[union-attr]
    att = [_missed(p.attainment.value, o) for p, o in zip(points, overstated, strict=True)]  # type: ignore[union-attr]
    lows = [_missed(_edge(p.attainment.ci_low, p.attainment.value), o)  # type: ignore[union-attr]
            for p, o in zip(points, overstated, strict=True)]
    highs = [_missed(_edge(p.attainment.ci_high, p.attainment.value), o)  # type: ignore[union-attr]
             for p, o in zip(points, overstated, strict=True)]
    est = crossing_rate(rates, att, slo.target)
    above = [o for r, o in sorted(zip(rates, overstated, strict=True)) if est is not None and r > est]
    if above and above[0]:
        # no straight line joins a measured level to a run-length artefact: the crossing is known only to
        # lie between the highest rate kept up with and the first one past capacity
        est = max(r for r, a in zip(rates, att, strict=True) if a >= slo.target and r <= est)  # type: ignore[operator]
    # The band's edges give a range for the crossing: where the lower / upper CI bound crosses. That range
    # trusts the straight line drawn between two rates; across a cliff the curve is no line, so the
    # interval is widened to the rates that bracket the crossing whatever the curve's shape between them.
    lo = crossing_rate(rates, lows, slo.target)
    hi = crossing_rate(rates, highs, slo.target)
    b_lo, b_hi = knee_bracket(rates, lows, highs, slo.target)
    if est is not None:
        lo = None if lo is None or b_lo is None else min(lo, b_lo)
        hi = None if hi is None or b_hi is None else max(hi, b_hi)
    meeting = [r for r, a in zip(rates, att, strict=True) if a >= slo.target]
    return {
        "target": slo.target,
        "max_rate_meeting_rps": est,
        "interval_rps": [lo, hi],
        "bracket_rps": [b_lo, b_hi],
        # measured inside the bracket, their intervals straddling the target: more requests would settle them
        "undecided_rps": [r for r, low, high in sorted(zip(rates, lows, highs, strict=True))
                          if (b_lo is None or r > b_lo) and (b_hi is None or r < b_hi) and low < slo.target <= high],
        "highest_measured_meeting_rps": max(meeting) if meeting else None,
        "is_lower_bound": bool(est is not None and est == max(rates)),
        # marked past capacity (completions fell behind arrivals, or the queue grew all run): the rates
        # among them that met the target would miss it in a longer run
        "past_capacity_rps": past,
        "past_capacity_meeting_rps": [r for r, o in zip(rates, overstated, strict=True) if o],
    }


def knee_bracket(rates: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                 target: float) -> tuple[float | None, float | None]:
    """The rates between which attainment surely crosses `target`, assuming only that it falls as the rate
    grows: the highest rate whose interval lies wholly at or above the target (None: none does) and the
    lowest rate above that one whose interval lies wholly below it (None: none does)."""
    pts = sorted(zip(rates, lows, highs, strict=True))
    passing = [r for r, low, _ in pts if low >= target]
    lo = max(passing) if passing else None
    failing = [r for r, _, high in pts if high < target and (lo is None or r > lo)]
    return lo, (min(failing) if failing else None)


def _missed(value: float, overstated: bool) -> float:
    """An attainment as the crossing reads it: a level that met the target past capacity reads as none."""
    return 0.0 if overstated else value


def _edge(v: float | None, value: float) -> float:
    return value if v is None else v  # a summary without intervals: its band is the point
