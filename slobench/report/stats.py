"""The numbers behind the report: one `RunPoint` per run, the headline per series, CDF curves.

Attainment and its interval are slobench.slo's (the same moving-block bootstrap, the same seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slobench.metrics import RecordArrays, Throughput, achieved_send_rps, throughput
from slobench.report.load import RunData, Series
from slobench.slo import SLO, Attainment, attainment
from slobench.summary import client_health, per_replica, per_tag, prefix_cache, queue_drift, ttft_on_slo_clock
from slobench.sweep import headline

MAX_CDF_POINTS = 500


@dataclass(frozen=True, slots=True)
class RunPoint:
    rate_rps: float
    num_requests: int
    num_ok: int
    attainment: Attainment | None
    throughput: Throughput
    achieved_send_rps: float
    ttft_ms: dict[str, float | None]  # p50/p90/p99 on the SLO's clock
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    client: dict[str, Any]
    ttft_count: int = 0  # finite values behind ttft_ms / tpot_ms (how many lie beyond a quantile: slo.samples_beyond)
    tpot_count: int = 0
    prefix_cache: dict[str, Any] | None = None  # summary.prefix_cache: None when the server reported no hits
    per_replica: tuple[dict[str, Any], ...] = ()  # a routed fleet: summary.breakdown per replica (SLO clock)
    per_tag: tuple[dict[str, Any], ...] = ()  # two or more request classes or phases: the same per tag
    overloaded: bool = False  # summary.queue_drift: the queue grew all run (past capacity at this rate)


ttft_s = ttft_on_slo_clock  # one rule for the terminal and the report (slobench.summary)


def e2e_s(a: RecordArrays, slo: SLO | None) -> np.ndarray:
    return a.e2e_s if slo is not None and slo.clock == "sent" else a.e2e_from_scheduled_s


def _pcts_ms(x: np.ndarray) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return {"p50": None, "p90": None, "p99": None}
    q = np.quantile(x, [0.5, 0.9, 0.99]) * 1e3
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def run_point(run: RunData, slo: SLO | None) -> RunPoint:
    a = run.arrays
    tp = throughput(a)
    seed = int(run.manifest.get("seed", 0) or 0)
    return RunPoint(
        rate_rps=run.rate_rps,
        num_requests=len(a),
        num_ok=int(a.is_ok.sum()),
        attainment=attainment(a, slo, duration_s=tp.duration_s, seed=seed) if slo is not None else None,
        throughput=tp,
        achieved_send_rps=achieved_send_rps(a),
        ttft_ms=_pcts_ms(ttft_s(a, slo)),
        tpot_ms=_pcts_ms(a.tpot_s),
        e2e_ms=_pcts_ms(e2e_s(a, slo)),
        client=client_health(a, slo),
        ttft_count=int(np.isfinite(ttft_s(a, slo)).sum()),
        tpot_count=int(np.isfinite(a.tpot_s).sum()),
        prefix_cache=prefix_cache(a),
        per_replica=tuple(per_replica(a, slo)),  # the same rows as the terminal's (slobench.summary)
        per_tag=tuple(per_tag(a, slo)),
        overloaded=bool((queue_drift(a) or {}).get("overloaded")),
    )


def series_headline(points: list[RunPoint], slo: SLO | None) -> dict[str, Any] | None:
    """slobench.sweep.headline over the recomputed attainments (same crossing rule, same interval)."""
    rows = [
        {"rate_rps": p.rate_rps, "summary": {"attainment": p.attainment.to_dict()}}
        for p in points
        if p.attainment is not None and p.attainment.num_requests > 0
    ]
    return headline(rows, slo) if rows else None


def cdf_points(x: np.ndarray, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the finite values of x at <= max_points probabilities, denser in the tail,
    where the SLO is decided. Returns (values, probabilities)."""
    x = np.sort(x[np.isfinite(x)])
    n = len(x)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    if n <= max_points:
        return x, np.arange(1, n + 1) / n
    body = np.linspace(0, 0.99, max_points * 4 // 5, endpoint=False)
    tail = 1 - np.logspace(-2, np.log10(1 / n), max_points - len(body) - 1)
    p = np.concatenate([body, tail, [1.0]])
    idx = np.unique(np.clip(np.ceil(p * n).astype(int) - 1, 0, n - 1))
    return x[idx], (idx + 1) / n


@dataclass(frozen=True, slots=True)
class Analyzed:
    """A series with its numbers: what every figure and table of the report reads."""

    series: Series
    points: tuple[RunPoint, ...]
    headline: dict[str, Any] | None
    color: str

    @property
    def rates(self) -> np.ndarray:
        return np.array([p.rate_rps for p in self.points])


def analyze(series: Series, color: str) -> Analyzed:
    points = tuple(run_point(r, series.slo) for r in series.runs)
    return Analyzed(series, points, series_headline(list(points), series.slo), color)
