"""A tune's page (`slobench report TUNE_DIR`): one self-contained file made by the run report's page shell.

From top to bottom: the winner and its command; every configuration's capacity per GPU with its interval,
best first, beside its simulated capacity where both exist (table and figure); the Pareto front of output
tokens/s per GPU against output tokens/s per user at the SLO, each configuration's point read from its
own search at or just under its capacity; the attainment against offered rate of the three leaders,
overlaid; the configurations that failed, with their reasons and logs. Every string from a file (names,
parameters, reasons, log lines) is escaped.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from slobench.errors import SlobenchError, UsageError
from slobench.report.html import esc, page, write_page
from slobench.report.plot import Fig
from slobench.report.style import OK, PLOTLY_CONFIG, TARGET, base_layout, rgba, series_color
from slobench.report.style import esc as plot_esc
from slobench.run.rundir import read_capacity
from slobench.tune.pareto import OperatingPoint, operating_point, pareto_front
from slobench.tune.result import TuneRow, is_tune_dir, ranked, read_tune_doc, tune_rows
from slobench.tune.table import fmt_rps, interval_text, params_text, ranking_line

NUM_LEADERS = 3
SIMULATED = "#ff7f0e"


def build_tune_page(tune_dir: str | Path, out: str | Path, *, title: str | None = None) -> Path:
    tune_dir = Path(tune_dir)
    doc = read_tune_doc(tune_dir)
    rows = ranked(tune_rows(doc, tune_dir))
    return write_page(Path(out), render_tune(tune_dir, rows, doc, title=title), "report -o")


def render_tune(tune_dir: Path, rows: list[TuneRow], doc: dict[str, Any], *, title: str | None = None) -> str:
    import plotly.io as pio  # plotly: imported when the page is drawn

    points = {r.name: p for r in rows if (p := operating_point(tune_dir, r)) is not None}
    leaders = [r for r in rows if r.per_gpu_rps is not None][:NUM_LEADERS]
    figs = [capacity_figure(rows), pareto_figure(rows, points), leaders_figure(tune_dir, leaders)]
    divs = [pio.to_html(f, config=PLOTLY_CONFIG, include_plotlyjs=False, full_html=False, div_id=f"fig-{i + 1}",
                        default_height=f"{f['layout'].get('height', 450)}px", validate=False)
            for i, f in enumerate(figs)]
    page_title = title or f"slobench tune: {len(rows)} configurations"
    body = [f'<section id="header"><h1>{esc(page_title)}</h1>', header(tune_dir, rows, doc), "</section>",
            '<section id="capacity"><h2>Capacity per GPU at the SLO</h2><p class="lead">Best first. Each '
            "configuration's capacity is its <code>slobench capacity</code> search at the SLO, divided by its GPUs; "
            "the bars are its interval. Where the simulator ranked it too (<code>--simulate-first</code>), its "
            "simulated capacity is drawn beside.</p>" + table(rows) + divs[0] + "</section>",
            '<section id="pareto"><h2>Throughput per GPU against speed per user</h2><p class="lead">Each '
            "configuration at the highest offered rate its search measured within the SLO: output tokens/s per "
            "GPU against output tokens/s per user (1 / mean TPOT). The line joins the configurations no other "
            "beats on both.</p>" + pareto_note(rows, points) + divs[1] + "</section>",
            '<section id="leaders"><h2>Attainment of the leaders</h2><p class="lead">The probes of the '
            f"{len(leaders)} best configurations' searches (every seed, with its 95% interval), the line through "
            "each rate's mean, the capacity dash-dotted.</p>" + divs[2] + "</section>",
            failures(rows)]
    return page(page_title, "\n".join(body), len(divs), footer="")


def search_facts(tune_dir: Path, rows: list[TuneRow]) -> dict[str, Any]:
    """The workload and SLO, read from the first capacity search that has them."""
    for r in rows:
        if r.capacity_dir is None:
            continue
        try:
            cap = read_capacity(tune_dir / r.capacity_dir)
        except (SlobenchError, OSError):
            continue
        return cap
    return {}


def header(tune_dir: Path, rows: list[TuneRow], doc: dict[str, Any]) -> str:
    cap = search_facts(tune_dir, rows)
    workload = cap.get("workload")
    slo: dict[str, Any] = cap["slo"] if isinstance(cap.get("slo"), dict) else {}
    slo_text = ", ".join(f"{k[:-2]} &le; {v * 1e3:g} ms" for k, v in slo.items()
                         if k.endswith("_s") and isinstance(v, int | float) and v)
    target = cap.get("attainment_target")
    settings = doc.get("settings") or {}
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    facts = [("tune", str(tune_dir)),
             ("configurations", ", ".join(f"{n} {s}" for s, n in counts.items())),
             ("workload", str(workload.get("name") if isinstance(workload, dict) else workload or "-")),
             ("capacity flags", shlex.join(settings.get("capacity_args") or []) or "-")]
    best = rows[0] if rows and rows[0].per_gpu_rps is not None else None
    lines = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    slo_row = (f"<tr><th>SLO</th><td>{slo_text} for {float(target):.0%} of requests</td></tr>"
               if slo_text and target is not None else "")
    if best is None:
        headline = '<p class="headline bad">No configuration could be measured.</p>'
    else:
        headline = (f'<p class="headline">Best: {esc(params_text(best))}, {esc(fmt_rps(best.per_gpu_rps))} req/s '
                    f"per GPU</p><p>command: <code>{esc(shlex.join(best.command))}</code></p>")
    guided = doc.get("guided")
    guided_line = f'<p class="{"ok" if guided["ranking_held"] else "warning"}">{esc(ranking_line(guided))}</p>' \
        if isinstance(guided, dict) else ""
    return f'<div class="card">{headline}<table class="facts">{lines}{slo_row}</table></div>{guided_line}'


def table(rows: list[TuneRow]) -> str:
    has_sim = any(r.simulated_capacity is not None and r.capacity is not None for r in rows)
    head = ["#", "configuration", "status", "capacity req/s", "interval", "GPUs", "req/s per GPU"]
    head += ["simulated req/s", "simulated / measured"] if has_sim else []
    body = []
    for i, r in enumerate(rows):
        cap = r.ranked_capacity or {}
        bound = "&ge;" if cap.get("is_lower_bound") else ""
        cells = [str(i + 1), esc(params_text(r)), esc(r.status), bound + fmt_rps(cap.get("capacity_rps")),
                 interval_text(r), str(r.gpus), bound + fmt_rps(r.per_gpu_rps)]
        if has_sim:
            sim = (r.simulated_capacity or {}).get("capacity_rps")
            measured = (r.capacity or {}).get("capacity_rps")
            cells += [fmt_rps(sim), f"{sim / measured:.2f}" if sim is not None and measured else "-"]
        miss = ' class="miss"' if r.status in ("failed", "interrupted") else ""
        body.append(f"<tr{miss}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f'<table class="data"><thead><tr>{"".join(f"<th>{esc(h)}</th>" for h in head)}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def per_gpu_interval(cap: dict[str, Any] | None, gpus: int) -> tuple[float, float, float] | None:
    """(value, minus, plus) per GPU, for error bars; None without a capacity."""
    value = (cap or {}).get("capacity_rps")
    if value is None:
        return None
    low, high = ((cap or {}).get("interval_rps") or [None, None])[:2]
    v = float(value) / gpus
    return v, v - (float(low) / gpus if low is not None else v), (float(high) / gpus if high is not None else v) - v


def capacity_figure(rows: list[TuneRow]) -> dict[str, Any]:
    fig = Fig()
    names = [plot_esc(params_text(r)) for r in rows]
    for label, color, symbol, cap_of in (("measured", OK, "circle", lambda r: r.ranked_capacity),
                                         ("simulated", SIMULATED, "diamond-open", lambda r: r.simulated_capacity)):
        if label == "simulated" and not any(r.simulated_capacity is not None and r.capacity is not None for r in rows):
            continue  # a --simulate tune: its simulated capacity is the one already drawn
        xs, ys, minus, plus = [], [], [], []
        for name, r in zip(names, rows, strict=True):
            bar = per_gpu_interval(cap_of(r), r.gpus)
            if bar is not None:
                xs.append(name)
                ys.append(bar[0])
                minus.append(bar[1])
                plus.append(bar[2])
        fig.add({"x": xs, "y": ys, "mode": "markers", "name": f"{label} capacity per GPU",
                 "marker": {"color": color, "size": 10, "symbol": symbol},
                 "error_y": {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus,
                             "color": rgba(color, 0.8)},
                 "hovertemplate": "%{x}: %{y:.3g} req/s per GPU<extra>" + label + "</extra>"})
    fig.x_axis(title={"text": "configuration (best first)"}, type="category", categoryorder="array",
               categoryarray=names)
    fig.y_axis(title={"text": "capacity per GPU (req/s)"}, rangemode="tozero")
    d = fig.to_dict()
    d["layout"] |= base_layout("Capacity per GPU with its interval", height=460)
    return d


def pareto_figure(rows: list[TuneRow], points: dict[str, OperatingPoint]) -> dict[str, Any]:
    fig = Fig()
    by_name = {r.name: r for r in rows}
    pts = list(points.values())
    front = pareto_front(pts)
    fig.add({"x": [p.output_tps_per_gpu for p in pts], "y": [p.output_tps_per_user for p in pts],
             "mode": "markers", "name": "configuration at the SLO", "marker": {"color": OK, "size": 9},
             "text": [plot_esc(f"{params_text(by_name[p.name])} at {p.rate_rps:.3g} req/s") for p in pts],
             "hovertemplate": "%{text}<br>%{x:.4g} tok/s per GPU, %{y:.4g} tok/s per user<extra></extra>"})
    fig.add({"x": [p.output_tps_per_gpu for p in front], "y": [p.output_tps_per_user for p in front],
             "mode": "lines+markers", "name": "Pareto front", "line": {"color": TARGET, "width": 2, "shape": "hv"},
             "marker": {"color": TARGET, "size": 11, "symbol": "circle-open"}, "hoverinfo": "skip"})
    fig.x_axis(title={"text": "output tokens/s per GPU"}, rangemode="tozero")
    fig.y_axis(title={"text": "output tokens/s per user"}, rangemode="tozero")
    d = fig.to_dict()
    d["layout"] |= base_layout("Pareto front at the SLO", height=480)
    return d


def pareto_note(rows: list[TuneRow], points: dict[str, OperatingPoint]) -> str:
    missing = [params_text(r) for r in rows if r.name not in points]
    return (f'<p class="note">Without a point (no probe met the SLO, or not measured): {esc("; ".join(missing))}</p>'
            if missing else "")


def leaders_figure(tune_dir: Path, leaders: list[TuneRow]) -> dict[str, Any]:
    fig = Fig()
    target = None
    for i, r in enumerate(leaders):
        color = series_color(i)
        name = plot_esc(params_text(r))
        try:
            cap = read_capacity(tune_dir / str(r.capacity_dir))
        except (SlobenchError, OSError):
            continue
        target = cap.get("attainment_target", target)
        probes = [p for p in cap.get("probes") or [] if p.get("attainment") is not None]
        probes.sort(key=lambda p: float(p["rate_rps"]))
        ci = [p.get("ci") or [p["attainment"], p["attainment"]] for p in probes]
        fig.add({"x": [p["rate_rps"] for p in probes], "y": [p["attainment"] for p in probes], "mode": "markers",
                 "name": f"{name}: probes", "marker": {"color": color, "size": 7, "opacity": 0.6},
                 "error_y": {"type": "data", "symmetric": False,
                             "array": [c[1] - p["attainment"] for c, p in zip(ci, probes, strict=True)],
                             "arrayminus": [p["attainment"] - c[0] for c, p in zip(ci, probes, strict=True)],
                             "color": rgba(color, 0.4)},
                 "hovertemplate": "%{x:.3g} req/s: %{y:.1%}<extra>" + name + "</extra>"})
        rates = sorted({float(p["rate_rps"]) for p in probes})
        means = [sum(p["attainment"] for p in probes if float(p["rate_rps"]) == x)
                 / sum(1 for p in probes if float(p["rate_rps"]) == x) for x in rates]
        fig.add({"x": rates, "y": means, "mode": "lines", "name": f"{name}: mean", "line": {"color": color, "width": 2},
                 "hoverinfo": "skip"})
        value = (r.ranked_capacity or {}).get("capacity_rps")
        if value is not None:
            fig.vline(float(value), color=color, dash="dashdot", width=2, label=f"{value:.3g} req/s",
                      label_y=1 - 0.06 * i)
    if target is not None:
        fig.hline(float(target), color=TARGET, width=2, label=f"target {float(target):.0%}")
    fig.x_axis(title={"text": "offered rate (req/s)"})
    fig.y_axis(title={"text": "attainment (met every SLO)"}, tickformat=".0%", range=[0, 1.1])
    d = fig.to_dict()
    d["layout"] |= base_layout("Attainment against offered rate: the leaders", height=480)
    return d


def failures(rows: list[TuneRow]) -> str:
    failed = [r for r in rows if r.reason and r.per_gpu_rps is None]  # failed, inconclusive, interrupted
    if not failed:
        return ""
    items = "".join(f"<details class=\"errors\"><summary>{esc(params_text(r))}: {esc(r.status)}: {esc(r.reason)}"
                    f"</summary><code>{esc(chr(10).join(r.log_tail[-20:]))}</code></details>" for r in failed)
    return f'<section id="failed"><h2>Configurations without a capacity</h2>{items}</section>'


def check_tune_inputs(inputs: list[str | Path]) -> Path | None:
    """The tune directory when the report was given one (alone); exit 2 when it is mixed with other inputs."""
    tunes = [Path(p) for p in inputs if is_tune_dir(p)]
    if not tunes:
        return None
    if len(inputs) > 1:
        raise UsageError(f"report: {tunes[0]} is a tune directory: its page is drawn alone (give it by itself, "
                         f"or give its configurations' capacity directories)")
    return tunes[0]


__all__ = ["build_tune_page", "check_tune_inputs", "is_tune_dir", "render_tune"]
