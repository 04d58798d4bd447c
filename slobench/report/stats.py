"""The numbers behind the report: one `RunSummary` per run, the headline per series, CDF curves.

Attainment and its interval are slobench.analysis.slo's (the same moving-block bootstrap, the same seed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slobench.analysis.headline import headline
from slobench.analysis.slo import SLO
from slobench.analysis.summary import Dist, RunSummary, summarize
from slobench.report.load import RunData, Series
from slobench.run.early_stop import partial_attainment

MAX_CDF_POINTS = 500


def run_point(run: RunData, slo: SLO | None) -> RunSummary:
    """One report point: the run's `RunSummary` recomputed from its records against the series' SLO (the
    same function that wrote summary.json, with the attainment interval but not the quantiles'), with the
    client's GC note of its summary.json."""
    seed = int(run.manifest.get("seed", 0) or 0)
    point = summarize(run.columns, slo, seed=seed, intervals="attainment")
    # what the records cannot tell (the client's GC pauses during the load) comes from the saved summary
    if run.saved is not None and run.saved.client.gc is not None:
        point = replace(point, client=replace(point.client, gc=run.saved.client.gc))
    if run.saved is not None and run.saved.stopped_early is not None:
        point = stopped_point(point, run.saved)
    return replace(point, rate_rps=run.rate_rps)


def stopped_point(point: RunSummary, saved: RunSummary) -> RunSummary:
    """A run that stopped early (slobench.run.early_stop): its records are part of the requests it scheduled.
    Against the SLO it stopped on, the attainment it saved (what was known when it stopped); against
    another, what its records say: those met and those finished missing, of all it scheduled (a request
    cancelled by the stop is neither)."""
    stopped = saved.stopped_early or {}
    n = int(saved.num_scheduled or stopped.get("num_scheduled") or 0)
    att = point.attainment
    if saved.slo == point.slo or att is None or n < att.num_requests:
        att = saved.attainment
    else:
        missed = att.num_requests - att.num_met - int(point.status_counts.get("cancelled", 0))
        att = partial_attainment(n, att.num_met, missed, point.duration_s)
    return replace(point, attainment=att, stopped_early=stopped, num_scheduled=n)


def pcts_ms(d: Dist) -> dict[str, float | None]:
    """p50/p90/p99 of a distribution in milliseconds, for tables."""
    return {k: None if (v := getattr(d, k)) is None else v * 1e3 for k in ("p50", "p90", "p99")}


def series_headline(points: list[RunSummary], slo: SLO | None) -> dict[str, Any] | None:
    """slobench.analysis.headline.headline over the recomputed summaries (same crossing rule, same interval)."""
    rows = [p for p in points if p.attainment is not None and p.attainment.num_requests > 0]
    return headline(rows, slo) if rows else None


def cdf_points(x: np.ndarray, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the finite values of x at <= max_points probabilities, denser in the tail,
    where the SLO is decided. Returns (values, probabilities)."""
    if not np.isfinite(x.sum()):  # a finite sum: no NaN or infinity to drop, and no copy of millions of ITLs
        x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    if n <= max_points:
        return np.sort(x), np.arange(1, n + 1) / n
    body = np.linspace(0, 0.99, max_points * 4 // 5, endpoint=False)
    tail = 1 - np.logspace(-2, np.log10(1 / n), max_points - len(body) - 1)
    p = np.concatenate([body, tail, [1.0]])
    idx = np.unique(np.clip(np.ceil(p * n).astype(int) - 1, 0, n - 1))
    return np.partition(x, idx)[idx], (idx + 1) / n  # those order statistics only: no sort of millions of ITLs


@dataclass(frozen=True, slots=True)
class Analyzed:
    """A series with its numbers: what every figure and table of the report reads."""

    series: Series
    points: tuple[RunSummary, ...]
    headline: dict[str, Any] | None
    color: str

    @property
    def rates(self) -> np.ndarray:
        return np.array([p.rate_rps for p in self.points], dtype=float)


def analyze(series: Series, color: str) -> Analyzed:
    """A capacity search that located no capacity has no headline: a crossing read off its probes would be
    the capacity figure its replicates refused to give."""
    points = tuple(run_point(r, series.slo) for r in series.runs)
    inconclusive = series.capacity is not None and series.capacity.get("inconclusive")
    return Analyzed(series, points, None if inconclusive else series_headline(list(points), series.slo), color)
