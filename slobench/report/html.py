"""The self-contained HTML attainment report: one file, plotly.js inline once, no network, no console noise.

Page order is the order a reader asks: what was measured and the headline; the cliff; latency against
load; distributions; each run over time (the cause of a spike); whether the client kept up; and, given
two or more inputs, how they differ. Every user- or server-controlled string is escaped here (HTML) or
by `style.esc` (text plotly draws); figure data reaches the page only as plotly's own JSON, which
escapes `<`, `>` and `/`, so no string can close the script it sits in.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO, samples_beyond
from slobench.analysis.summary import Breakdown, Dist
from slobench.errors import UsageError
from slobench.printable import printable
from slobench.report.client_actors import ray_section
from slobench.report.compare import Comparison, compare
from slobench.report.figures import cdf_figure, client_figure, cliff_figure, percentile_figure
from slobench.report.load import RunData, load_series, unique_labels
from slobench.report.sessions import sessions_section
from slobench.report.stats import MAX_CDF_POINTS, Analyzed, analyze
from slobench.report.style import PLOTLY_CONFIG, series_color
from slobench.report.style import esc as plot_esc
from slobench.report.terminal import (
    MIN_BEYOND,
    OVERLOAD_MARK,
    OVERLOAD_NOTE,
    STOPPED_EARLY_NOTE,
    THIN_MARK,
    THIN_NOTE,
    attainment_text,
    capacity_text,
    gc_text,
    headline_text,
    lengths_text,
    sweep_errors,
    trace_rows_text,
)
from slobench.report.timeline import MAX_BINS, MAX_MISS_POINTS, TimelineNote, timeline_figure
from slobench.version import __version__

SECTIONS = ("header", "cliff", "latency", "cdf", "timeline", "client", "compare")
# Only inline code and styles may run; nothing may be fetched. A stray network request fails loudly
# (a console error) instead of silently depending on a host. 'unsafe-eval' because plotly.js's regular
# bundle compiles some code paths with Function() (its WebGL traces; the report draws none today).
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")


def build_report(inputs: Sequence[str | Path], out: str | Path, *, title: str | None = None,
                 slo: SLO | None = None) -> Path:
    """Write the HTML report for sweep and/or run directories to `out`; returns its path.

    `slo` re-judges every input against another SLO than the one its manifest recorded."""
    if not inputs:
        raise UsageError("report: give at least one sweep or run directory")
    if Path(out).is_dir():  # checked before the slow part
        raise UsageError(f"report -o {out}: is a directory; give a file name such as {Path(out) / 'report.html'}")
    series = unique_labels([load_series(p, slo=slo) for p in inputs])
    views = [analyze(s, series_color(i)) for i, s in enumerate(series)]
    page = render(views, title=title)
    return write_page(Path(out), page, "report -o")


def write_page(out: Path, page: str, flag: str) -> Path:
    """Write an HTML page atomically (a .tmp, then a rename); a place that cannot be written is a UsageError
    naming `flag`. The run report and the history page both write through it."""
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        raise UsageError(f"{flag} {out}: cannot write there ({e.strerror or e})") from None
    return out


def esc(text: object) -> str:
    """For the page's own HTML (text and attribute values); control characters shown as escapes."""
    return html.escape(printable(text), quote=True)


class _Figures:
    """Turns figures into divs, numbered so the page is deterministic and its figures can be counted."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, fig: dict[str, Any]) -> str:
        import plotly.io as pio  # plotly (with narwhals) is a quarter second of import: only a report needs it

        self.count += 1
        height = fig["layout"].get("height", 450)
        # validate=False: the dicts come from plot.Fig, checked against plotly's schema in the tests
        return pio.to_html(fig, config=PLOTLY_CONFIG, include_plotlyjs=False, full_html=False,
                           div_id=f"fig-{self.count}", default_height=f"{height}px", validate=False)


def render(views: Sequence[Analyzed], *, title: str | None = None) -> str:
    figs = _Figures()
    page_title = title or _default_title(views)
    # one rate a series: a chart over offered rate would be a point, its knee and target labels on it
    is_one_rate = all(len(v.rates) <= 1 for v in views)
    body = [
        _header(views, page_title),
        _one_rate(views) if is_one_rate else _cliff(views, figs),
        *filter(None, [sessions_section(views)]),  # only where some run had sessions
        "" if is_one_rate else _latency(views, figs),
        _cdfs(views, figs),
        _timelines(views, figs),
        _client(views, figs, over_rate=not is_one_rate),
    ]
    if len(views) > 1:
        body.append(_comparison(views))
    return page(page_title, "\n".join(body), figs.count, footer=_FOOTER)


def page(title: str, body: str, num_figures: int, *, footer: str) -> str:
    """A self-contained HTML page: plotly inlined, the network forbidden by its CSP, the report's styles.
    The run report and the history page (slobench.history) are both made by it; `footer` is HTML."""
    from plotly.offline import get_plotlyjs

    return _PAGE.format(title=esc(title), csp=CSP, css=_CSS, num_figures=num_figures, plotlyjs=get_plotlyjs(),
                        body=body, version=esc(__version__), footer=footer)


# --- header -----------------------------------------------------------------------------------------


def _target(m: dict[str, Any]) -> dict[str, Any]:
    t = m.get("target")
    return t if isinstance(t, dict) else {}


def _target_text(t: dict[str, Any]) -> str:
    """Where the load went: a URL (and the client's worker processes), or the simulated engine and fleet."""
    if t.get("kind") == "simulated":
        knobs = t.get("knobs")
        profile = knobs.get("profile", "-") if isinstance(knobs, dict) else "-"
        text = f"simulated engine (virtual clock, profile {profile})"
        fleet = t.get("fleet")
        if isinstance(fleet, dict):
            text += f", {fleet.get('replicas')} replicas behind {fleet.get('router')}"
        return text
    text = str(t.get("url") or t.get("base_url") or "-")
    if isinstance(t.get("client_workers"), int) and t["client_workers"] > 1:
        text += f" (sent from {t['client_workers']} client processes)"
    return text


def _default_title(views: Sequence[Analyzed]) -> str:
    m = views[0].series.manifest
    model = _target(m).get("model") or _target(m).get("served") or "target"
    return f"slobench report: {model} · {_workload(m)}"


def _workload(m: dict[str, Any]) -> str:
    w = m.get("workload")
    return str(m.get("workload_name") or (w.get("name") if isinstance(w, dict) else None) or "-")


def _api(m: dict[str, Any]) -> str:
    """chat or completions: what the target was sent (--api), else what the workload asks for."""
    w = m.get("workload")
    return str(_target(m).get("api") or (w.get("api") if isinstance(w, dict) else None) or "-")


def _dates(v: Analyzed) -> str:
    stamps = []
    for r in v.series.runs:
        clock = r.manifest.get("clock")
        if isinstance(clock, dict) and isinstance(clock.get("wall_anchor_unix_s"), (int, float)):
            stamps.append(float(clock["wall_anchor_unix_s"]))
    if not stamps:
        return "-"
    fmt = "%Y-%m-%d %H:%M UTC"
    first, last = (time.strftime(fmt, time.gmtime(s)) for s in (min(stamps), max(stamps)))
    return first if first == last else f"{first} to {last}"


def _header(views: Sequence[Analyzed], title: str) -> str:
    parts = [f'<section id="header"><h1>{esc(title)}</h1>']
    for v in views:
        m, s = v.series.manifest, v.series
        t = _target(m)
        n_req = sum(p.num_requests for p in v.points)
        facts = [
            ("input", f"{s.label} ({s.kind}, {len(s.runs)} run{'s' if len(s.runs) != 1 else ''}, {n_req:,} requests)"),
            ("target", _target_text(t)),
            ("model", t.get("model") or t.get("served") or "-"),
            ("workload", _workload(m)),
            ("API", _api(m)),
            ("SLO", str(s.slo) + (f", latency from {s.slo.clock}" if s.slo else "") if s.slo else "none"),
            ("date", _dates(v)),
            ("slobench version", m.get("slobench_version") or (s.runs[0].manifest.get("slobench_version") if s.runs else None) or "-"),
        ]
        caps = t.get("capabilities")
        if isinstance(caps, dict):  # what preflight settled with the server: each fallback, said
            facts.append(("server profile", f"{caps.get('profile', '-')}"
                          + ("" if caps.get("enforces_output_length", True) else
                             " (output lengths not enforced: the server may stop early)")))
            facts += [("fallback", str(n)) for n in caps.get("notes") or []]
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>" for k, val in facts)
        cap = s.capacity if s.capacity is not None and s.capacity.get("mode", "search") == "search" else None
        if cap is not None:  # a capacity search: its own result, not a crossing read off its probes
            text, miss = capacity_text(cap), cap.get("capacity_rps") is None
        else:
            text = headline_text(v.headline)
            miss = v.headline is not None and v.headline.get("max_rate_meeting_rps") is None
        why = ('<p class="warning">The replicates located no capacity, so this report gives no capacity figure; '
               "the probes below are the search's own path (one seed each), drawn without a knee.</p>"
               if cap is not None and cap.get("inconclusive") else "")
        parts.append(
            f'<div class="card" style="border-left-color:{v.color}">'
            f'<p class="headline{" bad" if miss else ""}">{esc(s.label) + ": " if len(views) > 1 else ""}'
            f"{esc(text)}</p>{why}<table class=\"facts\">{rows}</table></div>"
        )
    parts.append("</section>")
    return "\n".join(parts)


# --- over offered rate --------------------------------------------------------------------------------


def _ms3(d: Dist) -> str:
    """p50 / p90 / p99 in ms, the tail ones marked † when fewer than 100 values lie beyond (NOTES-statistics)."""
    tail = {"p90": 0.9, "p99": 0.99}
    count = d.count or 0

    def cell(k: str) -> str:
        v = None if (s := d.get(k)) is None else s * 1e3
        if v is None:
            return "-"
        thin = k in tail and samples_beyond(count, tail[k]) < MIN_BEYOND
        return f"{v:.1f}" + (THIN_MARK if thin else "")

    return " / ".join(cell(k) for k in ("p50", "p90", "p99"))


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.1%}"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, fmt)


def _rate_table(v: Analyzed) -> str:
    head: tuple[str, ...] = ("offered req/s", "sent req/s", "completed req/s", "output tok/s", "attainment [95% CI]",
            "goodput req/s", "TTFT p50 / p90 / p99 ms", "TPOT p50 / p90 / p99 ms", "failed", "lateness p99 ms")
    cache = any(p.prefix_cache for p in v.points)
    if cache:
        head = (*head, "prompt tokens cached · TTFT p50 hit / miss ms")
    fleet = any(len(p.per_replica) > 1 for p in v.points)
    if fleet:
        head = (*head, "per replica: requests · TTFT p99 ms · attainment")
    classes = any(p.per_tag for p in v.points)
    if classes:
        head = (*head, "per class: requests · TTFT p99 ms · attainment")
    answers = any(p.ttfa is not None for p in v.points)  # some answer carried reasoning
    if answers:
        head = (*head, "TTFA p50 / p90 / p99 ms (first answer token)", "answer TPOT p50 / p90 / p99 ms",
                "reasoning share of output · no answer")
    rows = []
    for p in v.points:
        att = p.attainment
        att_s = attainment_text(p)
        if p.overloaded:
            att_s += OVERLOAD_MARK
        late = p.client.lateness_s.get("p99")
        cells: tuple[str, ...] = (
            f"{p.rate_rps:g}", _num(p.achieved_send_rps), _num(p.request_throughput_rps),
            _num(p.output_token_throughput_tps, ".0f"), att_s,
            _num(att.good_throughput_rps) if att else "-", _ms3(p.ttft_on_clock()), _ms3(p.tpot),
            str(p.num_requests - p.num_ok), ("-" if late is None else f"{late * 1e3:.1f}")
            + (" (client!)" if p.client.is_bottleneck else ""),
        )
        if cache:
            cells = (*cells, _cache_cell(p.prefix_cache))
        if fleet:
            cells = (*cells, _group_cell(p.per_replica, "replica", "#"))
        if classes:
            cells = (*cells, _group_cell(p.per_tag, "tag", ""))
        if answers:
            ttfa, r = p.ttfa_on_clock(), p.reasoning or {}
            cells = (*cells, "-" if ttfa is None else _ms3(ttfa), "-" if p.answer_tpot is None else _ms3(p.answer_tpot),
                     f"{_pct(r.get('reasoning_share'))} · {r.get('num_no_answer', 0)}")
        cls = ' class="miss"' if att is not None and v.series.slo and att.value < v.series.slo.target else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    thin = any(THIN_MARK in r for r in rows)
    note = f'<p class="note">{esc(THIN_NOTE)}</p>' if thin else ""
    if any(p.overloaded for p in v.points):
        note += f'<p class="note">{esc(OVERLOAD_NOTE)}</p>'
    if any(p.stopped_early is not None for p in v.points):
        note += f'<p class="note">{esc(STOPPED_EARLY_NOTE)}</p>'
    if answers:
        note += f'<p class="note">{esc(ANSWER_NOTE)}</p>'
    if v.series.kind == "sweep":
        note += _sweep_errors(v)

    return (f'<table class="data"><caption>{esc(v.series.label)}</caption><thead><tr>'
            + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            + note)


def _group_cell(rows: Sequence[Breakdown], label: str, prefix: str) -> str:
    parts = []
    for r in rows:
        p99 = "-" if r.ttft_p99_s is None else f"{r.ttft_p99_s * 1e3:.0f}"
        att = "" if r.attainment is None else f" · {_pct(r.attainment)}"
        parts.append(f"{prefix}{r.key} {r.num_requests} · {p99}{att}")
    return "; ".join(parts) or "-"


def _cache_cell(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "-"
    ms = ["-" if c.get(k) is None else f"{c[k] * 1e3:.1f}" for k in ("ttft_p50_hit_s", "ttft_p50_miss_s")]
    return f"{c['cached_token_share']:.0%} · {ms[0]} / {ms[1]}"


def _cliff(views: Sequence[Analyzed], figs: _Figures) -> str:
    return (
        '<section id="cliff"><h2>The cliff</h2><p class="lead">Attainment is the share of <em>all</em> requests '
        "issued (failures count as misses) that met every SLO at once; its band is a 95% moving-block bootstrap "
        "interval over requests in arrival order, widened to Wilson's interval where that is wider. Throughput keeps rising after attainment falls off: the knee "
        "(dash-dot) is where attainment crosses the target, linearly interpolated between measured rates.</p>"
        + figs.div(cliff_figure(views)) + "".join(_rate_table(v) for v in views) + "</section>"
    )


def _one_rate(views: Sequence[Analyzed]) -> str:
    return (
        '<section id="cliff"><h2>At one offered rate</h2><p class="lead">Attainment is the share of <em>all</em> '
        "requests issued (failures count as misses) that met every SLO at once, with a 95% interval. One rate "
        "shows no cliff: <code>slobench sweep</code> or <code>slobench capacity</code> measure how attainment "
        "falls as the rate rises.</p>" + "".join(_rate_table(v) for v in views) + "</section>"
    )


def _latency(views: Sequence[Analyzed], figs: _Figures) -> str:
    return ('<section id="latency"><h2>Latency against load</h2>' + figs.div(percentile_figure(views)) + "</section>")


def _cdfs(views: Sequence[Analyzed], figs: _Figures) -> str:
    parts = ['<section id="cdf"><h2>Latency distributions</h2>']
    for v in views:
        parts.append(figs.div(cdf_figure(v)))
    parts.append(f'<p class="note">Decimated: each CDF is drawn at most at {MAX_CDF_POINTS} quantile points '
                 "(evenly spaced to p99, then log-spaced into the tail), computed from every value.</p></section>")
    return "\n".join(parts)


# --- per run over time --------------------------------------------------------------------------------


def _timeline_note(n: TimelineNote) -> str:
    bits = []
    if n.num_met_shown < n.num_met:
        bits.append(f"{n.num_met_shown:,} of {n.num_met:,} met requests shown (evenly over arrival order)")
    if n.num_miss_shown < n.num_miss:
        bits.append(f"{n.num_miss_shown:,} of {n.num_miss:,} misses shown (cap {MAX_MISS_POINTS:,})")
    if n.num_fail_shown < n.num_fail:
        bits.append(f"{n.num_fail_shown:,} of {n.num_fail:,} failures shown")
    if n.in_flight_binned:
        bits.append(f"in-flight binned to {MAX_BINS} bins (the peak of each)")
    if n.num_scrapes_shown < n.num_scrapes:
        bits.append(f"{n.num_scrapes_shown:,} of {n.num_scrapes:,} server scrapes shown")
    text = "Decimated: " + "; ".join(bits) + "." if bits else "Every request is shown."
    if n.num_miss:
        text += f" {n.num_miss:,} requests missed the SLO; every miss is kept up to {MAX_MISS_POINTS:,} per run."
    return f'<p class="note">{esc(text)}</p>'


def _errors(run: RunData) -> str:
    errors = run.columns.error_counts  # grouped by summary.error_kind, as the terminal groups them
    if not errors:
        return ""
    examples = run.columns.error_examples  # the first message of each kind: a server's words, escaped
    items = "".join(f"<li><code>{esc(e)}</code> × {n:,}"
                    + (f": <code>&quot;{esc(examples[e])}&quot;</code>" if e in examples else "") + "</li>"
                    for e, n in errors.items())
    return f'<details class="errors"><summary>errors in this run</summary><ul>{items}</ul></details>'


def _sweep_errors(v: Analyzed) -> str:
    """Each error kind of a sweep once, with its count over every rate and the first message at the lowest
    rate it was seen (each run's own list is under its timeline)."""
    errors = sweep_errors([(p.rate_rps if p.rate_rps is not None else p.offered_rps, p) for p in v.points])
    if not errors:
        return ""
    items = "".join(f"<li><code>{esc(e.kind)}</code> × {e.count:,}, first at {e.first_rate_rps:g} req/s"
                    + (f": <code>&quot;{esc(e.example)}&quot;</code>" if e.example else "") + "</li>"
                    for e in errors)
    return f'<details class="errors" open><summary>errors across the rates</summary><ul>{items}</ul></details>'


def _timelines(views: Sequence[Analyzed], figs: _Figures) -> str:
    parts = ['<section id="timeline"><h2>Each run over time</h2><p class="lead">Requests in flight, each '
             "request's TTFT by its arrival time (misses in red, failures as crosses) and, where the target "
             "exposes Prometheus metrics, its own queue, KV-cache use, prefix-cache hits and preemptions: a "
             "latency spike lines up with its cause. Dotted verticals mark workload phases.</p>"]
    for v in views:
        for run in v.series.runs:
            label = f"{v.series.label} · {run.label} · {run.rate_rps:g} req/s"
            fig, note = timeline_figure(run, v.series.slo, plot_esc(label))
            server = "" if run.server else '<p class="note">No server metrics for this run (no /metrics endpoint).</p>'
            lengths = "".join(f'<p class="note">{esc(line)}</p>' for line in lengths_text(run.columns.lengths)
                              + trace_rows_text(run.manifest.get("trace_rows")))
            parts.append(f'<div class="run"><h3>{esc(label)}</h3>{figs.div(fig)}{_timeline_note(note)}'
                         f"{server}{lengths}{_errors(run)}</div>")
    parts.append("</section>")
    return "\n".join(parts)


# --- client health ------------------------------------------------------------------------------------


def _client(views: Sequence[Analyzed], figs: _Figures, *, over_rate: bool = True) -> str:
    warnings = [
        f'<p class="warning"><strong>{esc(v.series.label)} at {p.rate_rps:g} req/s:</strong> '
        f"{esc(p.client.warning)}</p>"
        for v in views for p in v.points if p.client.warning
    ] + [
        f'<p class="warning"><strong>{esc(v.series.label)} at {p.rate_rps:g} req/s:</strong> {esc(note)}</p>'
        for v in views for p in v.points if (note := gc_text(p.client.gc))
    ]
    # runs sent from Ray load actors: a table per run, and the clock flag (slobench.report.client_actors)
    actors, is_clock_flagged = ray_section([(f"{v.series.label} at {run.rate_rps:g} req/s", run, v.series.slo)
                                            for v in views for run in v.series.runs])
    # runs too short for a verdict either way (ClientHealth.note): said, and no "kept its schedule" claim
    unjudged = [f'<p class="note">{esc(v.series.label)} at {p.rate_rps:g} req/s: {esc(p.client.note)}</p>'
                for v in views for p in v.points if p.client.note and not p.client.warning]
    ok = '<p class="ok">The client kept its schedule at every rate: the numbers above describe the server.</p>'
    return ('<section id="client"><h2>Client health</h2>'
            + ("".join(warnings + unjudged) or ("" if is_clock_flagged else ok))
            + actors + (figs.div(client_figure(views)) if over_rate else "") + "</section>")


# --- comparison -----------------------------------------------------------------------------------------


def _signed(x: float | None, fmt: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:+{fmt}}{unit}"


def _comparison_table(c: Comparison) -> str:
    cap = (f"<p>Headline capacity: {esc(_num(c.capacity_base_rps, '.3g'))} → {esc(_num(c.capacity_cand_rps, '.3g'))} "
           f"req/s (<strong>{esc(_signed(None if c.capacity_change is None else 100 * c.capacity_change, '.1f', '%'))}"
           "</strong>)</p>")
    if not c.rates:
        return cap + '<p class="note">No offered rate in common: nothing to compare at equal load.</p>'
    head = ("offered req/s", "attainment", "Δ points", "TTFT p99 ms", "Δ", "TPOT p99 ms", "Δ")
    rows = []
    for d in c.rates:
        cells = (
            f"{d.rate_rps:g}",
            f"{_pct(d.attainment_base)} → {_pct(d.attainment_cand)}",
            _signed(d.attainment_delta_points, ".1f"),
            f"{_num(d.ttft_p99_base_ms, '.1f')} → {_num(d.ttft_p99_cand_ms, '.1f')}",
            _signed(None if d.ttft_p99_change is None else 100 * d.ttft_p99_change, ".1f", "%"),
            f"{_num(d.tpot_p99_base_ms, '.1f')} → {_num(d.tpot_p99_cand_ms, '.1f')}",
            _signed(None if d.tpot_p99_change is None else 100 * d.tpot_p99_change, ".1f", "%"),
        )
        rows.append("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in cells) + "</tr>")
    return (cap + '<table class="data delta"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _comparison(views: Sequence[Analyzed]) -> str:
    base = views[0]
    parts = ['<section id="compare"><h2>Comparison</h2><p class="lead">The curves of every input are overlaid in '
             f"the figures above. Deltas against the baseline, <strong>{esc(base.series.label)}</strong>, at the "
             "offered rates both measured (point differences; <code>slobench gate</code> gives the statistical "
             "verdict).</p>"]
    for v in views[1:]:
        parts.append(f"<h3>{esc(base.series.label)} → {esc(v.series.label)}</h3>{_comparison_table(compare(base, v))}")
    parts.append("</section>")
    return "\n".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1280px;padding:0 24px 48px;color:#222}
h1{font-size:1.6em;margin:24px 0 8px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:40px}
.card{border-left:6px solid #1f77b4;background:#f7f8fa;padding:10px 16px;margin:12px 0}
.headline{font-size:1.25em;font-weight:600;margin:4px 0 8px}.headline.bad{color:#b00}
table{border-collapse:collapse;font-size:.9em}th,td{padding:3px 10px;text-align:left;vertical-align:top}
table.facts th{color:#555;font-weight:normal;padding-left:0}
table.data{margin:16px 0}table.data td,table.data th{border-bottom:1px solid #e5e5e5;text-align:right}
table.data caption{text-align:left;font-weight:600;padding:4px 0}
tr.miss td{color:#b00}.note{color:#666;font-size:.85em}.lead{color:#444;max-width:70em}
.warning{background:#fdecea;border-left:6px solid #d62728;padding:8px 12px}
.ok{background:#edf7ed;border-left:6px solid #2ca02c;padding:8px 12px}
details.errors code{white-space:pre-wrap;word-break:break-all}
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="slobench {version}">
<meta name="slobench-figures" content="{num_figures}">
<title>{title}</title>
<style>{css}</style>
<script type="text/javascript">{plotlyjs}</script>
</head>
<body>
{body}
<footer class="note"><p>Made by slobench {version}. {footer} Self-contained: works offline.</p></footer>
</body>
</html>
"""

ANSWER_NOTE = ("TTFA = first answer token − request, on TTFT's clock: the first token after a reasoning model's "
               "reasoning (TTFT counts the reasoning's first token); answer TPOT = (last − first answer token) / "
               "(answer tokens − 1); no answer: completed requests that reasoned and never answered (no TTFA).")

_FOOTER = ("TTFT = first content token − request (from the scheduled arrival unless the SLO says otherwise, so a "
           "lagging client cannot hide queueing); TPOT = (last − first token) / (output tokens − 1); ITL = every "
           "gap between content chunks.")
