"""The run report's sessions section: for runs whose requests are a session's turns, one row per run with
the sessions, how many a failed turn ended, their turns and end-to-end time, the session SLO's attainment
with its interval beside the per-request attainment with its own, and how much later than the precomputed
estimate the waiting mode's turns left. The numbers are the summary's (`slobench.analysis.sessions`);
a report of runs without sessions has no such section."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from slobench.analysis.summary import RunSummary
from slobench.printable import printable
from slobench.report.stats import Analyzed

__all__ = ["SESSIONS_LEAD", "sessions_section"]

SESSIONS_LEAD = (
    "Each arrival of a session workload (or each session of a trace) starts a conversation of several turns. A "
    "session meets the session SLO when none of its turns failed and every turn met the request SLO, so its "
    "attainment is never above the per-request one; both come with a 95% interval (Wilson's over sessions, the "
    "moving-block bootstrap over requests). Session time runs from the first turn's scheduled send to the last "
    "turn's end, over the sessions no failed turn ended. In the waiting mode a turn leaves when its previous "
    "answer has ended plus the think or tool time: 'against the estimate' is how much later (+) or earlier (-) "
    "than the precomputed schedule (a trace's own time, for a trace) it left.")
_HEAD = ("offered req/s", "sessions", "failed", "turns mean / max", "session time p50 / p90 / p99 s",
         "session SLO attainment [95% CI]", "per-request attainment [95% CI]",
         "turns sent against the estimate p50 / p90 s (+ later)")


def sessions_section(views: Sequence[Analyzed]) -> str:
    """The section's HTML, or "" where no run of any input had sessions."""
    tables = [_table(v) for v in views if any(p.sessions for p in v.points)]
    if not tables:
        return ""
    return (f'<section id="sessions"><h2>Sessions</h2><p class="lead">{_esc(SESSIONS_LEAD)}</p>'
            + "".join(tables) + "</section>")


def _table(v: Analyzed) -> str:
    rows = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in _cells(p)) + "</tr>"
                   for p in v.points if p.sessions)
    return (f'<table class="data"><caption>{_esc(v.series.label)}</caption><thead><tr>'
            + "".join(f"<th>{_esc(h)}</th>" for h in _HEAD) + f"</tr></thead><tbody>{rows}</tbody></table>")


def _cells(p: RunSummary) -> tuple[str, ...]:
    d: Mapping[str, Any] = p.sessions or {}
    dur = d.get("duration_s") or {}
    late = d.get("late_vs_estimate_s") or {}
    att = d.get("attainment")
    per_request = p.attainment
    return (
        f"{p.offered_rate_rps:g}", str(d.get("num_sessions", "-")), str(d.get("num_failed", "-")),
        f"{_num((d.get('turns') or {}).get('mean'), '.1f')} / {(d.get('turns') or {}).get('max', '-')}",
        " / ".join(_num(dur.get(k), ".3f") for k in ("p50", "p90", "p99")),
        "-" if not att else _interval(att.get("value"), att.get("ci_low"), att.get("ci_high")),
        "-" if per_request is None else _interval(per_request.value, per_request.ci_low, per_request.ci_high),
        " / ".join(_num(late.get(k), "+.3f") for k in ("p50", "p90")) if late else "-",
    )


def _interval(value: float | None, lo: float | None, hi: float | None) -> str:
    return f"{_pct(value)} [{_pct(lo)}, {_pct(hi)}]"


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.1%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None or x != x else format(x, fmt)


def _esc(text: object) -> str:
    return html.escape(printable(text), quote=True)
