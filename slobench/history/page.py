"""The history page: each headline metric over commits with its interval, gate verdicts, change points.

One self-contained file like the run report (plotly.js inline once, the same Content-Security-Policy, no
network). Commit ids, dates and names are user strings: escaped for HTML here and by `style.esc` for text
plotly draws. The family-wise false-alarm rate of a page is `alpha`: each metric is tested at alpha / the
number of metrics (Bonferroni; metrics at two rates are correlated, so this is conservative).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slobench.errors import UsageError
from slobench.gate import HIGHER_IS_BETTER
from slobench.history.changepoint import MIN_COMMITS, ChangePoint, find_change_points
from slobench.history.record import identity_mismatch, read_history
from slobench.printable import printable
from slobench.report.html import page, write_page
from slobench.report.style import PLOTLY_CONFIG, base_layout
from slobench.report.style import esc as plot_esc

# The gate's default thresholds (gate.default_thresholds): a cumulative change this large is one the gate
# would have failed had it come in one commit.
DEFAULT_MIN_SHIFT: dict[str, tuple[float, bool]] = {
    "capacity": (0.05, True), "attainment": (0.02, False), "ttft": (0.10, True), "tpot": (0.10, True),
}
VERDICT_COLORS = {"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e", None: "#7f7f7f"}
MAX_TABLE_ROWS = 200


@dataclass(slots=True)
class MetricHistory:
    key: str
    index: list[int] = field(default_factory=list)  # positions in the history (commits without it skipped)
    mean: list[float] = field(default_factory=list)
    low: list[float | None] = field(default_factory=list)
    high: list[float | None] = field(default_factory=list)
    changes: list[ChangePoint] = field(default_factory=list)
    min_shift: tuple[float, bool] = (0.05, True)


def min_shift_for(key: str, overrides: dict[str, tuple[float, bool]] | None = None) -> tuple[float, bool]:
    name = key.split("@", 1)[0]
    for table in (overrides or {}, DEFAULT_MIN_SHIFT):
        for k in (key, name, name.split(".", 1)[0]):
            if k in table:
                return table[k]
    return (0.10, True)


def analyze(entries: Sequence[dict[str, Any]], *, alpha: float = 0.01,
            min_shift: dict[str, tuple[float, bool]] | None = None) -> list[MetricHistory]:
    """Per metric: its series and its change points, each metric tested at alpha / number of metrics."""
    keys: list[str] = []
    for e in entries:
        keys += [k for k in e["metrics"] if k not in keys]
    keys.sort(key=_order)
    out = []
    for key in keys:
        h = MetricHistory(key, min_shift=min_shift_for(key, min_shift))
        for i, e in enumerate(entries):
            m = e["metrics"].get(key)
            if m is None or m[0] is None or not math.isfinite(m[0]):
                continue
            h.index.append(i)
            h.mean.append(float(m[0]))
            h.low.append(m[1])
            h.high.append(m[2])
        if len(h.mean) >= MIN_COMMITS:
            amount, rel = h.min_shift
            found = find_change_points(h.mean, alpha=alpha / len(keys), min_shift=amount, is_relative=rel)
            h.changes = [ChangePoint(h.index[c.index], c.before_mean, c.after_mean, c.shift, c.is_relative,
                                     c.p_value, c.statistic) for c in found]
        out.append(h)
    return out


def _order(key: str) -> tuple[float, int, str]:
    name, _, rate = key.partition("@")
    families = ("capacity", "attainment", "ttft", "tpot")
    fam = name.split(".", 1)[0]
    return (float(rate) if rate else -1.0, families.index(fam) if fam in families else 9, name)


def build_history_page(history: str | Path, out: str | Path, *, alpha: float = 0.01, title: str | None = None,
                       min_shift: dict[str, tuple[float, bool]] | None = None) -> tuple[Path, list[MetricHistory]]:
    entries = read_history(history)
    if not entries:
        raise UsageError(f"{history}: the history is empty")
    for a, b in zip(entries, entries[1:], strict=False):
        if diff := identity_mismatch(a, b):
            raise UsageError(f"{history}: commits {a['commit']} and {b['commit']} measured different things ({diff})")
    if Path(out).is_dir():
        raise UsageError(f"-o {out}: is a directory; give a file name such as {Path(out) / 'history.html'}")
    metrics = analyze(entries, alpha=alpha, min_shift=min_shift)
    page = render(entries, metrics, alpha=alpha, title=title or f"slobench history: {Path(history).name}")
    return write_page(Path(out), page, "-o"), metrics


def esc(text: object) -> str:
    return html.escape(printable(text), quote=True)


def _short(commit: str) -> str:
    return commit[:10]


def _fmt(key: str, x: float | None) -> str:
    if x is None:
        return "-"
    name = key.split("@", 1)[0]
    if name == "attainment":
        return f"{x:.1%}"
    if name.startswith(("ttft", "tpot")):
        return f"{x * 1e3:.4g} ms"
    return f"{x:.4g}"


def _shift_text(c: ChangePoint) -> str:
    return f"{c.shift:+.1%}" if c.is_relative else f"{c.shift * 100:+.1f}pt"


def is_worse(key: str, c: ChangePoint) -> bool:
    higher_better = key.split("@", 1)[0].split(".", 1)[0] in HIGHER_IS_BETTER
    return (c.after_mean < c.before_mean) == higher_better


def figure(h: MetricHistory, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ticks = [plot_esc(_short(str(e["commit"]))) for e in entries]
    hover = []
    for i, m, lo, hi in zip(h.index, h.mean, h.low, h.high, strict=True):
        e = entries[i]
        iv = f" [{_fmt(h.key, lo)}, {_fmt(h.key, hi)}]" if lo is not None and hi is not None else ""
        parts = (e["commit"], e.get("date") or "", f"{_fmt(h.key, m)}{iv}", f"gate: {e.get('verdict') or 'not gated'}")
        hover.append("<br>".join(plot_esc(p) for p in parts))
    up = [(hi - m) if hi is not None else 0.0 for m, hi in zip(h.mean, h.high, strict=True)]
    down = [(m - lo) if lo is not None else 0.0 for m, lo in zip(h.mean, h.low, strict=True)]
    data: list[dict[str, Any]] = [{
        "type": "scatter", "mode": "lines", "x": h.index, "y": h.mean, "name": "commit mean",
        "line": {"color": "#9aa5b1", "width": 1}, "hoverinfo": "skip", "showlegend": False,
    }]
    for verdict, color in VERDICT_COLORS.items():
        sel = [j for j, i in enumerate(h.index) if entries[i].get("verdict") == verdict]
        if not sel:
            continue
        data.append({
            "type": "scatter", "mode": "markers", "name": f"gate: {verdict or 'not gated'}",
            "x": [h.index[j] for j in sel], "y": [h.mean[j] for j in sel],
            "error_y": {"type": "data", "symmetric": False, "array": [up[j] for j in sel],
                        "arrayminus": [down[j] for j in sel], "color": color, "thickness": 1.2},
            "marker": {"color": color, "size": 8, "symbol": "x" if verdict == "fail" else "circle"},
            "text": [hover[j] for j in sel], "hovertemplate": "%{text}<extra></extra>",
        })
    bounds = [h.index[0]] + [c.index for c in h.changes] + [h.index[-1] + 1]
    for a, b in zip(bounds, bounds[1:], strict=False):
        ys = [m for i, m in zip(h.index, h.mean, strict=True) if a <= i < b]
        if ys and h.changes:
            mean = sum(ys) / len(ys)
            data.append({"type": "scatter", "mode": "lines", "x": [a - 0.3, b - 0.7], "y": [mean, mean],
                         "line": {"color": "#444", "dash": "dash", "width": 1.5}, "name": "segment mean",
                         "showlegend": a == bounds[0], "hoverinfo": "skip"})
    shapes, notes = [], []
    for c in h.changes:
        color = VERDICT_COLORS["fail"] if is_worse(h.key, c) else VERDICT_COLORS["pass"]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": c.index - 0.5, "x1": c.index - 0.5,
                       "y0": 0, "y1": 1, "line": {"color": color, "width": 2, "dash": "dot"}})
        notes.append({"x": c.index - 0.5, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom",
                      "showarrow": False, "font": {"color": color},
                      "text": plot_esc(f"{_shift_text(c)} (p={c.p_value:.2g})")})
    return {
        "data": data,
        "layout": {
            **base_layout(plot_esc(h.key), height=380),
            "xaxis": {"tickmode": "array", "tickvals": list(range(len(entries))), "ticktext": ticks,
                      "tickangle": -45, "title": {"text": "commit"}, "gridcolor": "#eee",
                      "zeroline": False},
            "yaxis": {"title": {"text": plot_esc(_unit(h.key))}, "gridcolor": "#eee",
                      **({"tickformat": ".1%"} if _is_att(h.key) else {})},
            "shapes": shapes, "annotations": notes,
        },
    }


def _is_att(key: str) -> bool:
    return key.startswith("attainment")


def _unit(key: str) -> str:
    if key == "capacity":
        return "req/s"
    if _is_att(key):
        return "attainment"
    return "seconds"


def render(entries: Sequence[dict[str, Any]], metrics: Sequence[MetricHistory], *, alpha: float,
           title: str) -> str:
    import plotly.io as pio  # plotly: imported when the page is drawn

    divs = []
    for n, h in enumerate(metrics, 1):
        divs.append(pio.to_html(figure(h, entries), config=PLOTLY_CONFIG, include_plotlyjs=False, full_html=False,
                                div_id=f"fig-{n}", default_height="380px", validate=False))
    first, last = entries[0], entries[-1]
    w = last.get("workload") or {}
    facts = [("commits", f"{len(entries)}: {first['commit']} ({first.get('date')}) to {last['commit']} "
                         f"({last.get('date')})"),
             ("workload", f"{w.get('name')} (hash {w.get('hash')})"), ("SLO", _slo_text(last.get("slo"))),
             ("change points", f"binary segmentation, a likelihood-ratio test against a simulated null at "
                               f"family-wise α={alpha:g} over {len(metrics)} metric{'s' if len(metrics) != 1 else ''}"
                               ", reported when the shift is as large as the gate's threshold")]
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    body = [f'<section id="header"><h1>{esc(title)}</h1><div class="card"><table class="facts">{rows}</table></div>',
            _changes(entries, metrics), "</section>", '<section id="metrics"><h2>Metrics over commits</h2>',
            '<p class="lead">Each point is one commit: the mean over its replicates with its interval; colour '
            "and shape give the gate's verdict. Dotted lines mark change points, dashed lines the mean of each "
            "segment between them.</p>", *divs, "</section>", _commit_table(entries)]
    return page(title, "\n".join(body), len(divs), footer="")


def _slo_text(slo: dict[str, Any] | None) -> str:
    if not slo:
        return "none"
    parts = [f"{k[:-2]} {v * 1e3:g} ms" for k, v in slo.items() if k.endswith("_s") and v is not None]
    if slo.get("target") is not None:
        parts.append(f"target {slo['target']:.0%}")
    return ", ".join(parts) + (f", latency from {slo['clock']}" if slo.get("clock") else "")


def _changes(entries: Sequence[dict[str, Any]], metrics: Sequence[MetricHistory]) -> str:
    rows = []
    for h in metrics:
        for c in h.changes:
            lo = max((x.index for x in h.changes if x.index < c.index), default=h.index[0])
            stretch = [e.get("verdict") for e in entries[lo:c.index + 1]]
            missed = bool(stretch) and all(v == "pass" for v in stretch)
            worse = is_worse(h.key, c)
            rows.append(
                f'<tr class="{"miss" if worse else ""}"><td>{esc(h.key)}</td>'
                f"<td>{esc(_short(str(entries[c.index]['commit'])))}</td><td>{esc(_fmt(h.key, c.before_mean))}</td>"
                f"<td>{esc(_fmt(h.key, c.after_mean))}</td><td>{esc(_shift_text(c))} {'worse' if worse else 'better'}"
                f"</td><td>{c.p_value:.2g}</td><td>{'every commit passed the gate' if missed else ''}</td></tr>")
    if not rows:
        return '<p class="ok">No change point: every metric is consistent with noise around one level.</p>'
    head = ("<tr><th>metric</th><th>from commit</th><th>before</th><th>after</th><th>shift</th><th>p</th>"
            "<th></th></tr>")
    return (f'<div class="warning">{len(rows)} change point{"s" if len(rows) != 1 else ""} found.</div>'
            f'<table class="data" id="changes">{head}{"".join(rows)}</table>')


def _commit_table(entries: Sequence[dict[str, Any]]) -> str:
    shown = list(entries)[-MAX_TABLE_ROWS:]
    rows = "".join(f"<tr><td>{esc(e['commit'])}</td><td>{esc(e.get('date') or '-')}</td>"
                   f"<td>{esc(e.get('verdict') or 'not gated')}</td></tr>" for e in reversed(shown))
    note = (f'<p class="note">The last {MAX_TABLE_ROWS} of {len(entries)} commits.</p>'
            if len(entries) > MAX_TABLE_ROWS else "")
    return (f'<section id="commits"><h2>Commits</h2>{note}<table class="data"><tr><th>commit</th><th>date</th>'
            f"<th>gate</th></tr>{rows}</table></section>")
