"""Rate sweeps: one open-loop run per offered rate, one run directory each, and the attainment headline."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError
from slobench.run.records import write_sweep

if TYPE_CHECKING:  # a probe is only called here; its module imports the simulator
    from slobench.experiments.probe import Probe


def parse_rates(text: str) -> list[float]:
    """'1,2,4' -> [1, 2, 4];  '1:16:5' -> 5 rates geometrically spaced from 1 to 16."""
    text = text.strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise ValueError
            start, stop, num = float(parts[0]), float(parts[1]), int(parts[2])
            return geometric_rates(start, stop, num)
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError("rates", text, "expected a list like 1,2,4 or a geometric range START:STOP:COUNT") from None
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise SpecError("rates", text, "rates must be positive numbers")
    return rates


def geometric_rates(start: float, stop: float, num: int) -> list[float]:
    if not (start > 0 and stop >= start and num >= 1):
        raise SpecError("rates", f"{start}:{stop}:{num}", "need 0 < START <= STOP and COUNT >= 1")
    if num == 1:
        return [start]
    ratio = (stop / start) ** (1 / (num - 1))
    return [round(start * ratio**i, 6) for i in range(num)]


def rate_dir_name(rate_rps: float) -> str:
    return f"rate-{rate_rps:g}"


def crossing_rate(rates: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """The offered rate at which attainment falls through `target`, linearly interpolated between the
    last measured rate at or above target and the first below it (DistServe's goodput definition).
    None if even the lowest rate misses; the highest rate if none misses (a lower bound)."""
    pts = sorted(zip(rates, values, strict=True))
    if not pts or pts[0][1] < target:
        return None
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if v0 >= target > v1:
            return r0 + (v0 - target) / (v0 - v1) * (r1 - r0)
    return pts[-1][0]


def headline(points: Sequence[RunSummary], slo: SLO | None) -> dict[str, Any] | None:
    """Highest offered rate whose attainment stays >= the SLO's target, with the interval it came from.
    `points`: each rate's summary (its `rate_rps` set), all judged against `slo`."""
    points = [p for p in points if p.attainment is not None]
    if slo is None or not points:
        return None
    rates = [p.offered_rate_rps for p in points]
    att = [p.attainment.value for p in points]  # type: ignore[union-attr]
    lows = [_edge(p.attainment.ci_low, p.attainment.value) for p in points]  # type: ignore[union-attr]
    highs = [_edge(p.attainment.ci_high, p.attainment.value) for p in points]  # type: ignore[union-attr]
    est = crossing_rate(rates, att, slo.target)
    # The band's edges give a range for the crossing: where the lower / upper CI bound crosses. That range
    # trusts the straight line drawn between two rates; across a cliff the curve is no line, so the
    # interval is widened to the rates that bracket the crossing whatever the curve's shape between them.
    lo = crossing_rate(rates, lows, slo.target)
    hi = crossing_rate(rates, highs, slo.target)
    b_lo, b_hi = knee_bracket(rates, lows, highs, slo.target)
    if est is not None:
        lo = None if lo is None or b_lo is None else min(lo, b_lo)
        hi = None if hi is None or b_hi is None else max(hi, b_hi)
    meeting = [r for r, a in zip(rates, att, strict=True) if a >= slo.target]
    return {
        "target": slo.target,
        "max_rate_meeting_rps": est,
        "interval_rps": [lo, hi],
        "bracket_rps": [b_lo, b_hi],
        # measured inside the bracket, their intervals straddling the target: more requests would settle them
        "undecided_rps": [r for r, low, high in sorted(zip(rates, lows, highs, strict=True))
                          if (b_lo is None or r > b_lo) and (b_hi is None or r < b_hi) and low < slo.target <= high],
        "highest_measured_meeting_rps": max(meeting) if meeting else None,
        "is_lower_bound": bool(est is not None and est == max(rates)),
    }


def knee_bracket(rates: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                 target: float) -> tuple[float | None, float | None]:
    """The rates between which attainment surely crosses `target`, assuming only that it falls as the rate
    grows: the highest rate whose interval lies wholly at or above the target (None: none does) and the
    lowest rate above that one whose interval lies wholly below it (None: none does)."""
    pts = sorted(zip(rates, lows, highs, strict=True))
    passing = [r for r, low, _ in pts if low >= target]
    lo = max(passing) if passing else None
    failing = [r for r, _, high in pts if high < target and (lo is None or r > lo)]
    return lo, (min(failing) if failing else None)


def next_knee_rate(points: Sequence[tuple[float, float]], target: float, *, digits: int = 3) -> float | None:
    """Where to measure next to narrow the crossing: the geometric middle of the last rate meeting `target`
    and the first rate above it missing it, by point estimates, rounded to `digits` significant figures.
    None when nothing brackets the crossing (every rate meets it, or none does) or the two rates are too
    close for another rounded rate between them."""
    pts = sorted(points)
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if v0 >= target > v1:
            mid = float(f"{math.sqrt(r0 * r1):.{digits}g}")
            return mid if r0 < mid < r1 else None
    return None


def _edge(v: float | None, value: float) -> float:
    return value if v is None else v  # a summary without intervals: its band is the point


async def run_sweep(
    rates: Sequence[float],
    probe: Probe,
    *,
    out_dir: str | Path,
    slo: SLO | None,
    manifest: dict[str, Any],
    seed: int = 0,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    refine_knee: int = 0,
) -> dict[str, Any]:
    """Run `probe` at each rate into `out_dir/rate-R`, keeping sweep.json and its headline current. One
    seed for every rate: common random numbers, the same requests scaled in time. Then, `refine_knee`
    times, one more rate between the two that bracket the SLO's crossing (`next_knee_rate`); the rows are
    kept in rate order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"kind": "sweep", "manifest": manifest, "runs": rows}
    if refine_knee < 0:
        raise SpecError("refine_knee", str(refine_knee), "expected 0 or more extra rates")
    for rate in _sweep_rates(rates, rows, slo, refine_knee):
        run_dir = out / rate_dir_name(rate)
        res = await probe(rate, seed, run_dir, {**manifest, "rate_rps": rate})
        summary, interrupted = replace(res.summary, rate_rps=rate), res.interrupted
        row = {"rate_rps": rate, "run_dir": run_dir.name, "summary": summary}
        rows.append(row)
        rows.sort(key=lambda r: r["rate_rps"])
        doc["headline"] = headline([r["summary"] for r in rows], slo)
        write_sweep(out, doc)  # after every rate: an interrupted sweep keeps what it measured
        if on_run is not None:
            on_run(row)
        if interrupted:
            # a point cut short measured a few requests at best: it is kept, marked, and left out of the
            # headline (one request met the SLO says nothing of the rate)
            row["interrupted"] = True
            doc["interrupted"] = True
            doc["headline"] = headline([r["summary"] for r in rows if not r.get("interrupted")], slo)
            write_sweep(out, doc)
            break
    return doc


def _sweep_rates(rates: Sequence[float], rows: list[dict[str, Any]], slo: SLO | None,
                 refine_knee: int) -> Iterator[float]:
    """The grid's rates, then up to `refine_knee` rates chosen from the rows measured so far."""
    yield from rates
    for _ in range(refine_knee if slo is not None else 0):
        points = [(r["rate_rps"], r["summary"].attainment.value) for r in rows
                  if r["summary"].attainment is not None and not r.get("interrupted")]
        rate = next_knee_rate(points, slo.target)  # type: ignore[union-attr]
        if rate is None or any(r["rate_rps"] == rate for r in rows):
            return
        yield rate
