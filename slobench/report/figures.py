"""The report's figures over offered rate (the cliff, latency percentiles, client health) and the CDFs.

Every series (sweep or single run) is drawn in its own colour, so two sweeps overlay on the same axes.
Latencies are in milliseconds on log axes: past the knee TTFT grows by orders of magnitude. Every log
axis gets its ticks written out (`plot.log_ticks`).
Figures are plotly figure dicts (see `plot.Fig`); any user-controlled text in them went through `esc`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from slobench.analysis.summary import from_send
from slobench.analysis.summary import ttft_on_slo_clock as ttft_s
from slobench.report.plot import Fig, log_ticks
from slobench.report.stats import Analyzed, cdf_points, pcts_ms
from slobench.report.style import MISS, TARGET, base_layout, esc, rgba


def _rate_axis(views: Sequence[Analyzed]) -> dict[str, Any]:
    rates = np.concatenate([v.rates for v in views]) if views else np.zeros(0)
    rates = rates[rates > 0]
    is_log = len(rates) > 1 and rates.max() / rates.min() >= 8
    return {"title": {"text": "offered rate (req/s)"}, **(log_ticks(rates) if is_log else {"type": "linear"})}


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _prefix(views: Sequence[Analyzed], v: Analyzed) -> str:
    return esc(v.series.label) + " " if len(views) > 1 else ""


def cliff_figure(views: Sequence[Analyzed]) -> dict[str, Any]:
    f = Fig()
    targets: set[float] = set()
    for i, v in enumerate(views):
        name = _prefix(views, v)
        x = v.rates
        if v.series.slo is not None:
            targets.add(v.series.slo.target)
            att = np.array([_nan(p.attainment.value) if p.attainment else np.nan for p in v.points])
            lo = np.array([_nan(p.attainment.ci_low) if p.attainment else np.nan for p in v.points])
            hi = np.array([_nan(p.attainment.ci_high) if p.attainment else np.nan for p in v.points])
            f.add({"x": np.concatenate([x, x[::-1]]), "y": np.concatenate([hi, lo[::-1]]), "fill": "toself",
                   "fillcolor": rgba(v.color, 0.18), "line": {"width": 0}, "hoverinfo": "skip", "mode": "lines",
                   "name": f"{name}attainment 95% CI"})
            f.add({"x": x, "y": att, "mode": "lines+markers", "line": {"color": v.color, "width": 3},
                   "name": f"{name}attainment", "hovertemplate": "%{x:g} req/s: %{y:.1%}<extra></extra>"})
        f.data.append({"type": "scatter", "x": x, "y": np.array([p.request_throughput_rps for p in v.points]),
                       "yaxis": "y2", "mode": "lines+markers", "line": {"color": v.color, "dash": "dash"},
                       "marker": {"symbol": "square"}, "name": f"{name}completed req/s"})
        f.data.append({"type": "scatter", "x": x, "y": np.array([p.output_token_throughput_tps for p in v.points]),
                       "yaxis": "y3", "mode": "lines+markers", "line": {"color": v.color, "dash": "dot"},
                       "marker": {"symbol": "diamond"}, "name": f"{name}output tok/s"})
        h = v.headline
        if h and h.get("max_rate_meeting_rps") is not None:
            knee = h["max_rate_meeting_rps"]
            bound = " (lower bound)" if h["is_lower_bound"] else ""
            f.vline(knee, color=v.color, dash="dashdot", width=2, label=f"{name}knee {knee:.3g} req/s{bound}",
                    label_y=1 - 0.05 * i)  # one line per series, so two knees' labels never overlap
    all_rates = np.array(sorted({r for v in views for r in v.rates.tolist()}))
    if len(all_rates):
        f.data.append({"type": "scatter", "x": all_rates, "y": all_rates, "yaxis": "y2", "mode": "lines",
                       "line": {"color": "#aaa", "width": 1}, "name": "completed = offered (ideal)", "hoverinfo": "skip"})
    for t in sorted(targets):
        f.hline(t, color=TARGET, width=2, label=f"target {t:.0%}")
    f.x_axis(1, **_rate_axis(views), domain=[0, 0.84])
    f.y_axis(1, title={"text": "attainment (met every SLO)"}, tickformat=".0%", range=[0, 1.1])
    f.layout["yaxis2"] = {"title": {"text": "completed req/s"}, "overlaying": "y", "side": "right", "anchor": "x",
                          "rangemode": "tozero", "showgrid": False}
    f.layout["yaxis3"] = {"title": {"text": "output tok/s"}, "overlaying": "y", "side": "right", "anchor": "free",
                          "position": 0.95, "rangemode": "tozero", "showgrid": False}
    f.layout.update(base_layout("The cliff: SLO attainment and throughput against offered load", height=520))
    return f.to_dict()


def percentile_figure(views: Sequence[Analyzed]) -> dict[str, Any]:
    slo = next((v.series.slo for v in views if v.series.slo is not None), None)
    panels = [("ttft", "TTFT", slo.ttft_s if slo else None), ("tpot", "TPOT", slo.tpot_s if slo else None)]
    if slo is not None and slo.e2e_s is not None:
        panels.append(("e2e", "E2E", slo.e2e_s))
    clock = "from sent" if from_send(slo) else "from scheduled arrival"
    titles = [f"{label} ms" + (f" ({clock})" if key != "tpot" else "") for key, label, _ in panels]
    dist = {"ttft": lambda p: p.ttft_on_clock(), "tpot": lambda p: p.tpot, "e2e": lambda p: p.e2e_on_clock()}
    f = Fig(1, len(panels), titles=titles)
    for k, (key, _, threshold) in enumerate(panels, 1):
        drawn: list[np.ndarray] = [np.array([np.nan if threshold is None else threshold * 1e3])]
        for v in views:
            name = _prefix(views, v)
            for q, dash in (("p50", "dot"), ("p90", "dash"), ("p99", "solid")):
                y = np.array([_nan(pcts_ms(dist[key](p))[q]) for p in v.points])
                drawn.append(y)
                f.add({"x": v.rates, "y": y, "mode": "lines+markers", "line": {"color": v.color, "dash": dash},
                       "name": f"{name}{q}", "legendgroup": f"{v.series.label}/{q}", "showlegend": k == 1,
                       "hovertemplate": "%{x:g} req/s: %{y:.1f} ms<extra>%{fullData.name}</extra>"}, k)
        if threshold is not None:
            f.hline(threshold * 1e3, k, color=MISS, label=f"SLO {threshold * 1e3:g} ms")
        f.y_axis(k, **log_ticks(np.concatenate(drawn)))
        f.x_axis(k, **_rate_axis(views))
    f.layout.update(base_layout("Latency percentiles (p50 dotted, p90 dashed, p99 solid) against offered load",
                                height=460))
    return f.to_dict()


def cdf_figure(view: Analyzed) -> dict[str, Any]:
    from plotly.colors import sample_colorscale  # plotly: imported when a report is drawn

    s = view.series
    slo = s.slo
    f = Fig(1, 3, titles=["TTFT ms", "TPOT ms", "ITL ms (every chunk gap)"], hspace=0.07)
    colors = sample_colorscale("Viridis", np.linspace(0, 0.9, max(len(s.runs), 2)).tolist())
    drawn: dict[int, list[np.ndarray]] = {1: [], 2: [], 3: []}
    for i, run in enumerate(s.runs):
        a = run.arrays
        for k, x in enumerate((ttft_s(a, slo), a.tpot_s, a.itl_s), 1):
            vals, probs = cdf_points(x * 1e3)
            keep = vals > 0  # log axis: a zero TPOT (one-token output) has no place on it
            drawn[k].append(vals[keep])
            f.add({"x": vals[keep], "y": probs[keep], "mode": "lines", "line": {"color": colors[i], "shape": "hv"},
                   "name": f"{run.rate_rps:g} req/s", "legendgroup": f"rate{i}", "showlegend": k == 1,
                   "hovertemplate": "%{x:.1f} ms: %{y:.3f}<extra>%{fullData.name}</extra>"}, k)
    for k, thr in ((1, slo.ttft_s if slo else None), (2, slo.tpot_s if slo else None)):
        if thr is not None:
            f.vline(thr * 1e3, k, color=MISS, label="SLO", label_y=0.02)
            drawn[k].append(np.array([thr * 1e3]))
    for k in (1, 2, 3):
        f.x_axis(k, **log_ticks(np.concatenate([*drawn[k], np.zeros(0)])))
        f.y_axis(k, range=[0, 1.02], tickformat=".0%")
    f.layout.update(base_layout(f"Latency distributions per offered rate: {esc(s.label)}", height=430))
    return f.to_dict()


def client_figure(views: Sequence[Analyzed]) -> dict[str, Any]:
    f = Fig(1, 2, titles=["client send lateness ms (sent - scheduled)", "sent req/s against scheduled"], hspace=0.1)
    limits: set[float] = set()
    for v in views:
        name = _prefix(views, v)
        for q, dash in (("p50", "dot"), ("p99", "solid"), ("max", "dash")):
            y = np.array([_nan(p.client.lateness_s.get(q)) * 1e3 for p in v.points])
            f.add({"x": v.rates, "y": y, "mode": "lines+markers", "line": {"color": v.color, "dash": dash},
                   "name": f"{name}lateness {q}"}, 1)
        limits.update(p.client.lateness_limit_s for p in v.points)
        f.add({"x": np.array([p.offered_rps for p in v.points]),
               "y": np.array([p.achieved_send_rps for p in v.points]),
               "mode": "lines+markers", "line": {"color": v.color}, "name": f"{name}sent req/s"}, 2)
        bad = [i for i, p in enumerate(v.points) if p.client.is_bottleneck]
        if bad:
            f.add({"x": v.rates[bad], "y": np.array([_nan(v.points[i].client.lateness_s.get("p99")) * 1e3 for i in bad]),
                   "mode": "markers", "marker": {"color": MISS, "size": 14, "symbol": "circle-open"},
                   "name": f"{name}client was the bottleneck"}, 1)
    for lim in sorted(limits):
        f.hline(lim * 1e3, 1, color=MISS, label=f"limit {lim * 1e3:g} ms")
    offered = [p.offered_rps for v in views for p in v.points if np.isfinite(p.offered_rps)]
    if offered:
        lo, hi = min(offered), max(offered)
        f.add({"x": [lo, hi], "y": [lo, hi], "mode": "lines", "line": {"color": "#aaa", "width": 1},
               "name": "sent = scheduled", "hoverinfo": "skip"}, 2)
    f.x_axis(1, **_rate_axis(views))
    f.x_axis(2, title={"text": "scheduled req/s (measured from the schedule)"})
    f.y_axis(1, title={"text": "ms"}, rangemode="tozero")
    f.y_axis(2, title={"text": "sent req/s"})
    f.layout.update(base_layout("Client health: did the load generator keep its schedule?", height=420))
    return f.to_dict()
