"""Per-session results of a run whose requests are a session's turns (records with `session_id`): how many
sessions, how many a failed turn ended, their turns and end-to-end time, the session SLO's attainment (a
session meets it when every turn it sent met the turn SLO and none failed) with a Wilson interval, and how
much later than the precomputed estimate the waiting mode's turns left (`sent_s - estimated_s`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from slobench.analysis.metrics import quantiles
from slobench.analysis.slo import wilson_ci
from slobench.run.columnar import Columns

__all__ = ["SessionColumns", "session_metrics", "session_results", "sessions_text"]

LATE_QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class SessionColumns:
    """The measured records' session columns, aligned with the summary's `RecordArrays`."""

    session_id: np.ndarray  # float, NaN where a record is no session's
    turn: np.ndarray
    scheduled_s: np.ndarray
    sent_s: np.ndarray
    done_s: np.ndarray
    estimated_s: np.ndarray
    is_ok: np.ndarray

    @classmethod
    def of(cls, c: Columns) -> SessionColumns | None:
        """`c`'s session columns, or None where no record belongs to a session (the summary has no section)."""
        v = c.values
        sid = v["session_id"]
        if not len(sid) or np.isnan(sid).all():
            return None
        order = np.lexsort((v["request_id"], v["scheduled_s"]))  # as `RecordArrays.from_columns` orders them
        return cls(*(x[order] for x in (sid, v["turn"], v["scheduled_s"], v["sent_s"], v["done_s"],
                                        v["estimated_s"], v["status"] == "ok")))


def session_results(s: SessionColumns, met: np.ndarray | None, max_session_s: float | None = None) -> dict[str, Any]:
    """summary.json's `sessions` section; `met`: each record met the turn SLO (None: no SLO);
    `max_session_s`: the session SLO's bound on session time (`--slo session=...`), if any."""
    inside = ~np.isnan(s.session_id)
    ids, where = np.unique(s.session_id[inside], return_inverse=True)
    n = len(ids)
    turns = np.bincount(where, minlength=n)
    failed = np.bincount(where, weights=~s.is_ok[inside], minlength=n) > 0
    start = np.full(n, np.inf)
    np.minimum.at(start, where, s.scheduled_s[inside])
    end = np.full(n, -np.inf)
    done = np.where(np.isnan(s.done_s[inside]), np.inf, s.done_s[inside])  # a turn with no end: no session time
    np.maximum.at(end, where, done)
    whole = ~failed & np.isfinite(end)
    out: dict[str, Any] = {
        "num_sessions": int(n), "num_failed": int(failed.sum()),
        "turns": {"mean": float(turns.mean()), "max": int(turns.max())},
        "duration_s": {**quantiles(end[whole] - start[whole]), "num": int(whole.sum())},
    }
    if met is not None:
        meets = (np.bincount(where, weights=~met[inside], minlength=n) == 0) & ~failed
        rule = "every turn met the turn SLO"
        if max_session_s is not None:  # (a session with no end, or a failed one, has already missed)
            meets &= np.isfinite(end) & (end - start <= max_session_s)
            rule += f" and the session ended within {max_session_s:g} s"
        k = int(meets.sum())
        lo, hi = wilson_ci(k, n)
        out["attainment"] = {"value": k / n, "ci_low": lo, "ci_high": hi, "num_met": k, "rule": rule}
    waited = ~np.isnan(s.estimated_s) & ~np.isnan(s.sent_s)
    if waited.any():
        late = s.sent_s[waited] - s.estimated_s[waited]
        out["late_vs_estimate_s"] = {"num": int(waited.sum()), **quantiles(late, LATE_QUANTILES),
                                     "max": float(late.max())}
    return out


def session_metrics(d: Any) -> dict[str, float]:
    """The gate's numbers of a `sessions` section, flat: `session_attainment` (the session SLO's), the end-to-end
    session time's `session_time.p50/p90/p99` and the share of sessions a failed turn ended
    (`session_failed`); none where the run had no sessions."""
    if not d or not d.get("num_sessions"):
        return {}
    out: dict[str, float] = {"session_failed": d["num_failed"] / d["num_sessions"]}
    if (att := d.get("attainment")) and math.isfinite(att["value"]):
        out["session_attainment"] = float(att["value"])
    for stat in ("p50", "p90", "p99"):
        v = (d.get("duration_s") or {}).get(stat)
        if v is not None and math.isfinite(v):
            out[f"session_time.{stat}"] = float(v)
    return out


def sessions_text(d: Any) -> list[str]:
    """The terminal's lines for a `sessions` section (none where the run had no sessions)."""
    if not d:
        return []
    dur = d.get("duration_s") or {}
    lines = [f"sessions {d['num_sessions']} (failed {d['num_failed']})  turns mean {d['turns']['mean']:.1f} "
             f"max {d['turns']['max']}  session time p50 {_s(dur.get('p50'))} s  p90 {_s(dur.get('p90'))} s"]
    if att := d.get("attainment"):
        lines.append(f"session SLO ({att['rule']}) attainment {att['value']:.1%} "
                     f"[{att['ci_low']:.1%}, {att['ci_high']:.1%}] of {d['num_sessions']} sessions")
    if late := d.get("late_vs_estimate_s"):
        lines.append(f"turns sent when the previous answer ended, against the precomputed estimate (+ later, "
                     f"- earlier): p50 {_signed(late.get('p50'))} s, p90 {_signed(late.get('p90'))} s "
                     f"({late['num']} turns)")
    return lines


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"
