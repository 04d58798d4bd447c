"""Rate sweeps: one open-loop run per offered rate, one run directory each, and the attainment headline."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slobench.analysis.headline import headline
from slobench.analysis.slo import SLO
from slobench.errors import SpecError
from slobench.run.rundir import rate_dir_name, write_sweep

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
    on_start: Callable[[float, int, int], None] | None = None,
    doc_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `probe` at each rate into `out_dir/rate-R`, keeping sweep.json and its headline current. One
    seed for every rate: common random numbers, the same requests scaled in time. Then, `refine_knee`
    times, one more rate between the two that bracket the SLO's crossing (`next_knee_rate`); the rows are
    kept in rate order. `on_start(rate, index, most)` hears of each rate before it runs (index from 1;
    `most`: the rates planned, refinements included, fewer if a refinement finds nothing to narrow);
    `doc_extra`: more keys for sweep.json (how `--rates auto` chose the rates)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"kind": "sweep", "manifest": manifest, "runs": rows, **(doc_extra or {})}
    if refine_knee < 0:
        raise SpecError("refine_knee", str(refine_knee), "expected 0 or more extra rates")
    most = len(rates) + (refine_knee if slo is not None else 0)
    for index, rate in enumerate(_sweep_rates(rates, rows, slo, refine_knee), start=1):
        if on_start is not None:
            on_start(rate, index, most)
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
