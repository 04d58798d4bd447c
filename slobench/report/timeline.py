"""One run over time: requests in flight, each request's TTFT (misses in red), and the server's own state.

Decimation keeps the file small without hiding what matters: in-flight is a step series binned to at
most MAX_BINS bins (the maximum of each bin, so a spike survives); met requests are thinned to
MAX_MET_POINTS evenly over arrival order; misses and failures are all kept up to their caps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slobench.analysis.slo import SLO
from slobench.analysis.summary import from_send
from slobench.analysis.summary import ttft_on_slo_clock as ttft_s
from slobench.report.load import RunData
from slobench.report.plot import Fig, log_ticks
from slobench.report.server_state import server_series
from slobench.report.style import FAIL, MISS, OK, base_layout, esc

MAX_BINS = 1000
MAX_MET_POINTS = 5000
MAX_MISS_POINTS = 5000
MAX_FAIL_POINTS = 1000


def even_subset(idx: np.ndarray, cap: int) -> np.ndarray:
    """At most `cap` of idx, evenly spread over its order (deterministic)."""
    if len(idx) <= cap:
        return idx
    return idx[np.linspace(0, len(idx) - 1, cap).round().astype(int)]


def in_flight(sent_s: np.ndarray, done_s: np.ndarray, *, max_bins: int = MAX_BINS) -> tuple[np.ndarray, np.ndarray, bool]:
    """Requests in flight over time as a step series (times, counts, was_binned). A request sent and never
    finished stays in flight to the end. Binned to the per-bin maximum past 2 x max_bins events."""
    sent = sent_s[np.isfinite(sent_s)]
    if len(sent) == 0:
        return np.zeros(0), np.zeros(0), False
    finished = np.isfinite(done_s) & np.isfinite(sent_s)
    done = done_s[finished]
    times = np.concatenate([sent, done])
    delta = np.concatenate([np.ones(len(sent)), -np.ones(len(done))])
    order = np.lexsort((delta, times))  # at a tie, the finish (-1) comes first
    times, level = times[order], np.cumsum(delta[order])
    if len(times) <= 2 * max_bins:
        return times, level, False
    edges = np.linspace(times[0], times[-1], max_bins + 1)
    first_in_bin = np.searchsorted(times, edges[:-1], side="left")
    # the level carried into a bin from before it, then the maximum reached inside it
    carry = np.where(first_in_bin > 0, level[np.maximum(first_in_bin - 1, 0)], 0.0)
    bin_of = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, max_bins - 1)
    peak = carry.copy()
    np.maximum.at(peak, bin_of, level)
    return edges[:-1], peak, True


@dataclass(frozen=True, slots=True)
class TimelineNote:
    num_met: int
    num_met_shown: int
    num_miss: int
    num_miss_shown: int
    num_fail: int
    num_fail_shown: int
    in_flight_binned: bool
    num_scrapes: int
    num_scrapes_shown: int


def timeline_figure(run: RunData, slo: SLO | None, title: str) -> tuple[dict[str, Any], TimelineNote]:
    """`title` must be escaped already."""
    a = run.arrays
    panels = server_series(run.server) if run.server is not None else {"requests": [], "cache": [], "preemptions": []}
    titles = ["requests in flight", "TTFT per request (s, by arrival time)"]
    if panels["cache"]:
        titles.append("server: KV cache and prefix cache (%)")
    if panels["preemptions"]:
        titles.append("server: preemptions per second")
    f = Fig(len(titles), 1, titles=titles, row_heights=[0.28, 0.42] + [0.15] * (len(titles) - 2), shared_x=True)

    t, level, binned = in_flight(a.sent_s, a.done_s)
    f.add({"x": t, "y": level, "mode": "lines", "line": {"shape": "hv", "color": "#444"}, "name": "in flight (client)"}, 1)
    for s in panels["requests"]:
        f.add({"x": s.t_s, "y": s.values, "mode": "lines", "line": {"color": s.color}, "name": s.label}, 1)

    y = ttft_s(a, slo)
    has_ttft = np.isfinite(y)
    met = slo.meets(a) if slo is not None else np.ones(len(a), bool)
    failed = ~has_ttft & np.isfinite(a.done_s)
    met_idx = even_subset(np.flatnonzero(has_ttft & met), MAX_MET_POINTS)
    miss_idx = even_subset(np.flatnonzero(has_ttft & ~met), MAX_MISS_POINTS)
    fail_idx = even_subset(np.flatnonzero(failed), MAX_FAIL_POINTS)
    hover = "request %{customdata}<br>arrival %{x:.2f} s<br>%{y:.3f} s<extra>%{fullData.name}</extra>"

    def points(idx: np.ndarray, yv: np.ndarray, name: str, marker: dict[str, Any]) -> None:
        f.add({"x": a.scheduled_s[idx], "y": yv, "customdata": a.request_id[idx], "mode": "markers",
               "marker": marker, "name": name, "hovertemplate": hover}, 2)

    points(met_idx, y[met_idx], "met SLO" if slo else "TTFT", {"size": 4, "color": OK, "opacity": 0.6})
    if slo is not None:
        points(miss_idx, y[miss_idx], "missed SLO", {"size": 4, "color": MISS})
    if len(fail_idx):
        origin = a.sent_s if from_send(slo) else a.scheduled_s
        points(fail_idx, (a.done_s - origin)[fail_idx], "failed (time to failure)",
               {"size": 7, "color": FAIL, "symbol": "x"})
    if slo is not None and slo.ttft_s is not None:
        f.hline(slo.ttft_s, 2, color=MISS, width=1, label=f"TTFT SLO {slo.ttft_s * 1e3:g} ms")
    drawn = [y[met_idx], y[miss_idx] if slo is not None else [], (a.done_s - a.scheduled_s)[fail_idx],
             [slo.ttft_s if slo is not None and slo.ttft_s is not None else np.nan]]
    f.y_axis(2, **log_ticks(np.concatenate([np.asarray(d, float) for d in drawn])))

    k = 3
    for key in ("cache", "preemptions"):
        if panels[key]:
            for s in panels[key]:
                f.add({"x": s.t_s, "y": s.values, "mode": "lines", "line": {"color": s.color}, "name": s.label}, k)
            k += 1

    for ph in run.phases:
        f.vline(ph.start_s, color="#888", dash="dot", width=1, label=esc(ph.name))
    f.x_axis(len(titles), title={"text": "seconds since run start"})
    f.layout.update(base_layout(title, height=260 + 170 * len(titles)))
    srv = run.server
    note = TimelineNote(
        num_met=int((has_ttft & met).sum()), num_met_shown=len(met_idx),
        num_miss=int((has_ttft & ~met).sum()) if slo is not None else 0, num_miss_shown=len(miss_idx) if slo else 0,
        num_fail=int(failed.sum()), num_fail_shown=len(fail_idx), in_flight_binned=binned,
        num_scrapes=srv.num_scrapes if srv else 0, num_scrapes_shown=len(srv.t_s) if srv else 0,
    )
    return f.to_dict(), note
