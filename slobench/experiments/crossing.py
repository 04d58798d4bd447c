"""Each seed's own crossing of the attainment target, and the capacity interval over seeds.

Why per-seed brackets rather than one pooled curve: near the cliff a seed's attainment falls from ~100%
to well under the target within a few percent of rate, and seeds cross at different rates (on the
simulator, `tiny` with 10 s probes: seed 0 at 95.2% / 71.5% at 44 / 46 req/s while five other seeds held
100% at both). A straight line pooled over two rates cannot place a seed whose curve is flat there: it
reported a zero-width interval, or an estimate past a rate measured to miss. So every seed is run from the
search's bracket, *widened* (steps doubling) until that seed's attainment crosses the target, then
*narrowed* (bisection) to the tolerance, within a per-seed probe budget. Its crossing is interpolated
inside its own bracket: never above a rate it missed, never below one it met.

The capacity is the mean of the seeds' crossings. Its interval has to carry two uncertainties:
- the spread between seeds (the queueing correlation, the noise of short probes near the cliff): the
  standard error of the mean crossing, with Student-t's k - 1 degrees of freedom;
- where each crossing lies inside its own bracket. A seed's crossing is only known to lie in
  [met, missed]; the straight line between them misplaces it in the same direction for every seed whose
  curve has the same shape there (near a 90% target the curve is a cliff: flat, then falling faster and
  faster), so this error does not average out over seeds. It is taken as uniform over the mean bracket
  width w: standard uncertainty w / sqrt(12), added to the standard error in quadrature.
The interval is t(level, k - 1) times that combined uncertainty either side of the mean, and never
narrower than the mean of the seeds' brackets (what the probes resolved).

Why this rule and not the others (docs/measurements/capacity_coverage.md, 207 default searches on 9
simulated variants, each seed's bracket ~3.7% of the capacity): the t-interval over seeds alone covered
the true capacity in 91.3% of searches. Its misses were not one-sided (8 with the estimate above the
truth, 9 below; 10 of 17 within one standard error of the truth's own noise), so it was too narrow
rather than shifted: the within-bracket error is in every seed's crossing but not in their spread when
it is common to them. With it added the coverage is 95.7%, the median width 13.1% (was 11.9%). The
outer bound (a t bound over the seeds' met rates below, over their missed rates above: true whatever
the curve's shape) covered 96.6% at a median width of 16.8%, wider than a 95% interval needs. A
tighter tolerance for each seed's bracket shrinks the interpolation error but costs a probe a seed for
each halving, and the interval would still leave it out.

A seed whose crossing is not bracketed within its budget is censored: reported as a bound, never
imputed, and the search is inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Attain = Callable[[float], Awaitable[float]]  # one probe of this seed at a rate -> its attainment


@dataclass(frozen=True, slots=True)
class SeedCrossing:
    """Where one seed's attainment crosses the target: `met` (highest rate it met, below `missed`) and
    `missed`; `capacity_rps` interpolated between them. Censored (`capacity_rps` None): `met` or `missed` is
    None and `censored` says which bound the probes give."""

    seed: int
    met: tuple[float, float] | None  # (rate, attainment)
    missed: tuple[float, float] | None
    capacity_rps: float | None
    probes: int
    censored: str | None = None

    @property
    def slope_per_rps(self) -> float:
        """Attainment lost per extra req/s across this seed's bracket (nan when censored)."""
        if self.met is None or self.missed is None:
            return math.nan
        return (self.met[1] - self.missed[1]) / (self.missed[0] - self.met[0])

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "capacity_rps": self.capacity_rps,
                "bracket_rps": [self.met[0], self.missed[0]] if self.met and self.missed else None,
                "met": list(self.met) if self.met else None, "missed": list(self.missed) if self.missed else None,
                "probes": self.probes, "censored": self.censored}


def cross_at(met: tuple[float, float], missed: tuple[float, float], target: float) -> float:
    """Linear interpolation of the target's crossing between a met and a missed probe (DistServe's goodput),
    kept inside the bracket.

    A missed probe that stopped early (`slobench.run.early_stop`) brings the share met among its decided
    requests, not its whole attainment, which it never measured. Of the three values it knows that one is
    the least biased where the crossing is read: replaying whole probes through the decider
    (docs/measurements/probe_early_stop.md), at the seeds' missed edges it read +3.7 points from the whole
    probe's attainment on average, the upper bound +24 and the lower bound -26, and the capacity moved
    0.7% (mean absolute) against 3.7% and 1.1%; the bracket's midpoint moved it 1.6%."""
    (r0, a0), (r1, a1) = met, missed
    if not a0 > a1:
        return (r0 + r1) / 2
    frac = min(max((a0 - target) / (a0 - a1), 0.0), 1.0)
    return r0 + frac * (r1 - r0)


async def locate_seed(
    seed: int, attain: Attain, target: float, *, known: Sequence[tuple[float, float]], edges: tuple[float, float],
    rel_tol: float, budget: int, max_rate_rps: float | None = None,
) -> SeedCrossing:
    """Bracket and narrow one seed's crossing. `known`: (rate, attainment) probes already run with this seed
    (the search seed's); the bracket `edges` are probed first where not known. `budget`: this seed's new
    probes at most."""
    seen = dict(known)
    used = 0

    async def run(rate: float) -> float:
        nonlocal used
        used += 1
        seen[rate] = value = await attain(rate)
        return value

    for rate in edges:
        if rate not in seen and used < budget:
            await run(rate)

    def bracket() -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        """The lowest rate missed, and the highest rate met below it."""
        misses = [r for r, a in seen.items() if not a >= target]
        low_miss = min(misses) if misses else None
        met = [r for r, a in seen.items() if a >= target and (low_miss is None or r < low_miss)]
        hi_met = max(met) if met else None
        return ((hi_met, seen[hi_met]) if hi_met is not None else None,
                (low_miss, seen[low_miss]) if low_miss is not None else None)

    step = max(edges[1] - edges[0], rel_tol * edges[0])
    met, missed = bracket()
    while used < budget and (met is None or missed is None):  # widen, doubling the step
        if missed is None:
            assert met is not None
            if max_rate_rps is not None and met[0] >= max_rate_rps:
                break
            rate = met[0] + step if max_rate_rps is None else min(met[0] + step, max_rate_rps)
        else:
            rate = missed[0] - step
            if rate <= missed[0] * 1e-3:
                break
        await run(round(rate, 6))
        step *= 2
        met, missed = bracket()
    while used < budget and met is not None and missed is not None and (missed[0] - met[0]) / met[0] > rel_tol:
        await run(round((met[0] + missed[0]) / 2, 6))
        met, missed = bracket()
    total = used + len(known)
    if met is None or missed is None:
        why = (f"met the target at every rate up to {met[0]:g} req/s" if met is not None
               else f"missed it at every rate down to {missed[0]:g} req/s" if missed is not None else "no probe ran")
        return SeedCrossing(seed, met, missed, None, total, censored=why)
    return SeedCrossing(seed, met, missed, cross_at(met, missed, target), total)


def seeds_interval(located: Sequence[SeedCrossing], level: float) -> tuple[float, tuple[float, float]]:
    """The mean crossing and its interval: a Student-t interval on the combined standard uncertainty of
    the between-seed spread (the standard error of the mean) and of where the crossing lies inside the
    seeds' brackets (the mean bracket width over sqrt(12), an error common to the seeds); never narrower
    than the mean of the seeds' brackets (what the probes resolved). The module docstring says why."""
    from scipy import stats

    c = np.array([s.capacity_rps for s in located], dtype=float)
    est = float(c.mean())
    k = len(c)
    met = np.array([s.met[0] for s in located if s.met], dtype=float)
    missed = np.array([s.missed[0] for s in located if s.missed], dtype=float)
    within_sd = float((missed - met).mean()) / math.sqrt(12)  # uniform over a bracket of that width
    u = math.sqrt(float(c.var(ddof=1)) / k + within_sd**2) if k > 1 else math.inf
    half = float(stats.t.ppf((1 + level) / 2, k - 1)) * u if k > 1 else math.inf
    return est, (min(est - half, float(met.mean())), max(est + half, float(missed.mean())))
