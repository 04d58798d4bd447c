"""Deltas between a baseline series (the first input) and each other one.

Compared only where both measured: the headline capacity, and attainment and p99 latencies at the
offered rates the two have in common (same load, so the difference is the server's, not the schedule's).
These are point differences for reading; the statistical verdict belongs to `slobench gate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slobench.analysis.summary import RunSummary
from slobench.report.stats import Analyzed


@dataclass(frozen=True, slots=True)
class RateDelta:
    rate_rps: float
    attainment_base: float | None
    attainment_cand: float | None
    ttft_p99_base_ms: float | None
    ttft_p99_cand_ms: float | None
    tpot_p99_base_ms: float | None
    tpot_p99_cand_ms: float | None

    @property
    def attainment_delta_points(self) -> float | None:
        if self.attainment_base is None or self.attainment_cand is None:
            return None
        return 100 * (self.attainment_cand - self.attainment_base)

    @property
    def ttft_p99_change(self) -> float | None:
        return relative_change(self.ttft_p99_base_ms, self.ttft_p99_cand_ms)

    @property
    def tpot_p99_change(self) -> float | None:
        return relative_change(self.tpot_p99_base_ms, self.tpot_p99_cand_ms)


@dataclass(frozen=True, slots=True)
class Comparison:
    base_label: str
    cand_label: str
    capacity_base_rps: float | None
    capacity_cand_rps: float | None
    rates: tuple[RateDelta, ...]

    @property
    def capacity_change(self) -> float | None:
        return relative_change(self.capacity_base_rps, self.capacity_cand_rps)


def relative_change(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base == 0:
        return None
    return cand / base - 1


def _key(rate: float) -> float:
    return float(f"{rate:.6g}")  # rates written as 2 and 2.0000001 are the same offered load


def _att(p: RunSummary) -> float | None:
    return p.attainment_value


def _p99_ms(d: Any) -> float | None:
    return None if d.p99 is None else d.p99 * 1e3


def compare(base: Analyzed, cand: Analyzed) -> Comparison:
    by_rate = {_key(p.offered_rate_rps): p for p in base.points}
    deltas = []
    for c in cand.points:
        b = by_rate.get(_key(c.offered_rate_rps))
        if b is None:
            continue
        deltas.append(RateDelta(
            rate_rps=b.offered_rate_rps,
            attainment_base=_att(b), attainment_cand=_att(c),
            ttft_p99_base_ms=_p99_ms(b.ttft_on_clock()), ttft_p99_cand_ms=_p99_ms(c.ttft_on_clock()),
            tpot_p99_base_ms=_p99_ms(b.tpot), tpot_p99_cand_ms=_p99_ms(c.tpot),
        ))
    return Comparison(
        base_label=base.series.label,
        cand_label=cand.series.label,
        capacity_base_rps=headline_capacity(base),
        capacity_cand_rps=headline_capacity(cand),
        rates=tuple(sorted(deltas, key=lambda d: d.rate_rps)),
    )


def headline_capacity(v: Analyzed) -> float | None:
    """The capacity a series states: a capacity search's own (None when it located none), else the rate
    where its headline's attainment crosses the target."""
    cap = v.series.capacity
    if cap is not None and cap.get("mode", "search") == "search":
        rate = cap.get("capacity_rps")
        return None if cap.get("inconclusive") or rate is None else float(rate)
    return (v.headline or {}).get("max_rate_meeting_rps")
