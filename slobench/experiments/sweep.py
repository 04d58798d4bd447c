"""Rate sweeps: one open-loop run per offered rate, one run directory each, and the attainment headline."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError
from slobench.experiments.probe import Probe
from slobench.run.records import write_sweep


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
    # The band's edges give a range for the crossing: where the lower / upper CI bound crosses.
    lo = crossing_rate(rates, lows, slo.target)
    hi = crossing_rate(rates, highs, slo.target)
    meeting = [r for r, a in zip(rates, att, strict=True) if a >= slo.target]
    return {
        "target": slo.target,
        "max_rate_meeting_rps": est,
        "interval_rps": [lo, hi],
        "highest_measured_meeting_rps": max(meeting) if meeting else None,
        "is_lower_bound": bool(est is not None and est == max(rates)),
    }


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
) -> dict[str, Any]:
    """Run `probe` at each rate into `out_dir/rate-R`, keeping sweep.json and its headline current. One
    seed for every rate: common random numbers, the same requests scaled in time."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"kind": "sweep", "manifest": manifest, "runs": rows}
    for rate in rates:
        run_dir = out / rate_dir_name(rate)
        res = await probe(rate, seed, run_dir, {**manifest, "rate_rps": rate})
        summary, interrupted = replace(res.summary, rate_rps=rate), res.interrupted
        row = {"rate_rps": rate, "run_dir": run_dir.name, "summary": summary}
        rows.append(row)
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
