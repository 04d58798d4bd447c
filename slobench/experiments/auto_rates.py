"""`sweep --rates auto`: rates chosen from the server in front of the sweep, straddling its cliff.

A fixed grid shows a cliff only on the machine it was chosen for: on a faster one every rate meets the
SLO, on a slower one every rate misses. So the sweep first measures the server:

1. a service probe, a few requests at a low rate: the median end-to-end time of one request (`service_s`,
   lowered afterwards to the least median of any bracket probe that met the SLO: a cold engine's first
   requests run slow);
2. a quick bracket, as `capacity`'s: from one request per service time, doubling the rate until a probe
   misses the SLO or falls past capacity (slobench.analysis.past_capacity), each probe a few service
   times long;
3. the sweep's rates around the crossing the bracket read: a few comfortably below, the crossing, and a
   couple past it, each run for `POINT_SERVICE_TIMES` service times of arrivals, so that a rate past
   capacity runs long enough for its queue to show (a fixed request count shrinks as the rate rises).

Short probes overstate what a server carries (its queue has no time to grow), so the bracket only places
the sweep; the sweep's own longer points measure the crossing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slobench.analysis.headline import crossing_rate
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError

if TYPE_CHECKING:
    from slobench.experiments.probe import Probe, ProbeResult

SERVICE_REQUESTS = 8  # the service probe: this many requests ...
SERVICE_RATE_RPS = 4.0  # ... at this rate (two seconds: a slow server's queue barely forms)
BRACKET_SERVICE_TIMES = 15.0  # a bracket probe's arrivals last this many service times ...
BRACKET_MIN_REQUESTS = 20  # ... and hold at least this many requests
MAX_BRACKET_PROBES = 10
MAX_HALVINGS = 3  # a first rate that misses is halved at most this often: an SLO no low rate meets is the news
POINT_SERVICE_TIMES = 50.0  # a sweep point's arrivals last this many service times ...
POINT_MIN_REQUESTS = 40  # ... and hold at least this many requests
# the sweep's rates, as multiples of the bracket's crossing: three below, the crossing, two past it
POINT_FACTORS = (0.35, 0.6, 0.8, 1.0, 1.3, 2.0)


@dataclass(frozen=True, slots=True)
class RunSize:
    """How much one probe sends: `num_requests`, or arrivals for `duration_s` seconds."""

    num_requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if (self.num_requests is None) == (self.duration_s is None):
            raise SpecError("run size", (self.num_requests, self.duration_s), "give a request count or a duration")
        if self.duration_s is not None and not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise SpecError("duration", self.duration_s, "must be a positive number of seconds")


# measure(rate_rps, size, name) -> the run's summary; `name` is its run directory under the sweep's
Measure = Callable[[float, RunSize, str], Awaitable[RunSummary]]


@dataclass(frozen=True, slots=True)
class AutoPlan:
    service_s: float  # median end-to-end time of one request at a low rate
    bracket_rps: tuple[float | None, float | None]  # (highest rate meeting, lowest missing) of the quick probes
    crossing_rps: float  # where the quick probes cross the target: the sweep's middle
    rates_rps: tuple[float, ...]
    point_duration_s: float  # seconds of arrivals at every rate
    probes: tuple[dict[str, Any], ...]  # the bracket's probes, as sweep.json keeps them

    def size(self, rate_rps: float) -> RunSize:
        """A point's size: `point_duration_s`, lengthened at low rates to POINT_MIN_REQUESTS requests."""
        return RunSize(duration_s=max(self.point_duration_s, POINT_MIN_REQUESTS / rate_rps))

    def to_dict(self) -> dict[str, Any]:
        return {"service_s": self.service_s, "bracket_rps": list(self.bracket_rps),
                "crossing_rps": self.crossing_rps, "rates_rps": list(self.rates_rps),
                "point_duration_s": self.point_duration_s, "probes": list(self.probes)}


def misses(s: RunSummary, target: float) -> bool:
    """A bracket probe misses when its attainment is below the target or it ran past capacity."""
    a = s.attainment_value
    return a is None or math.isnan(a) or a < target or s.overloaded


def service_time_s(s: RunSummary) -> float:
    """A request's end-to-end time at low load: the service probe's median, from the send."""
    v = s.e2e.p50
    if v is None or not (v > 0 and math.isfinite(v)):
        raise SpecError("service probe", v, "no request of the service probe completed: is the server answering?")
    return float(v)


def straddling_rates(crossing_rps: float, hi_rps: float | None) -> tuple[float, ...]:
    """POINT_FACTORS times the crossing, 3 significant figures; the top reaches the bracket's missing rate."""
    rates = [crossing_rps * f for f in POINT_FACTORS]
    if hi_rps is not None:
        rates[-1] = max(rates[-1], hi_rps)
    return tuple(sorted({float(f"{r:.3g}") for r in rates}))


async def plan_rates(measure: Measure, target: float, *,
                     on_probe: Callable[[float, RunSize], None] | None = None) -> AutoPlan:
    """Measure the service time, bracket the crossing by doubling (halving when the first rate misses), and
    return the sweep's rates and point length. `measure` runs one probe; `on_probe` hears of each first."""
    if not 0 < target <= 1:
        raise SpecError("target", target, "must be in (0, 1]")
    probes: list[dict[str, Any]] = []

    async def probe(rate: float, size: RunSize) -> RunSummary:
        if on_probe is not None:
            on_probe(rate, size)
        s = await measure(rate, size, f"bracket/probe-{len(probes):02d}-rate-{rate:.4g}")
        probes.append({"rate_rps": rate, "attainment": s.attainment_value, "past_capacity": s.overloaded,
                       "meets": not misses(s, target)})
        return s

    service_s = service_time_s(await probe(SERVICE_RATE_RPS, RunSize(num_requests=SERVICE_REQUESTS)))

    met_service_s: list[float] = []  # the median end-to-end time of each probe that met the SLO

    def least_service_s() -> float:
        # a cold engine's first requests run slow (a torch model's first steps): probes are sized by the
        # least service time any probe meeting the SLO measured
        return min([service_s, *(t for t in met_service_s if t > 0)])

    def size(rate: float) -> RunSize:
        return RunSize(duration_s=max(BRACKET_SERVICE_TIMES * least_service_s(), BRACKET_MIN_REQUESTS / rate))

    start = float(f"{1.0 / service_s:.3g}")
    points: list[tuple[float, float]] = []  # (rate, attainment as the crossing reads it)
    rate, step = start, 2.0
    lo: float | None = None
    hi: float | None = None
    for _ in range(MAX_BRACKET_PROBES):
        s = await probe(rate, size(rate))
        missed = misses(s, target)
        if not missed and s.e2e.p50 is not None and math.isfinite(s.e2e.p50):
            met_service_s.append(float(s.e2e.p50))
        points.append((rate, 0.0 if missed else float(s.attainment_value or 0.0)))
        if missed:
            hi = rate if hi is None else min(hi, rate)
        else:
            lo = rate if lo is None else max(lo, rate)
        if lo is not None and hi is not None:
            break
        if lo is None and rate < start / 2**MAX_HALVINGS * 1.01:
            break
        step = 2.0 if lo is not None else 0.5
        rate = float(f"{rate * step:.3g}")
    crossing = crossing_rate([r for r, _ in points], [v for _, v in points], target) if lo is not None else None
    middle = crossing if crossing is not None else (lo if lo is not None else min(r for r, _ in points))
    service_s = least_service_s()
    point_s = POINT_SERVICE_TIMES * service_s
    return AutoPlan(service_s, (lo, hi), float(middle), straddling_rates(float(middle), hi), point_s, tuple(probes))


class Interrupted(Exception):
    """Ctrl-C during the bracket: nothing of the sweep itself was measured."""


async def plan_with_probe(probe: Probe, *, target: float, seed: int, out: Path, manifest: dict[str, Any],
                          resize: Callable[[RunSize], None],
                          on_probe: Callable[[float, RunSize], None] | None = None,
                          on_measured: Callable[[float, RunSummary, bool], None] | None = None) -> AutoPlan:
    """`plan_rates` through a sweep's probe: each probe in `out`/bracket/, sized by `resize` (which sets
    how many requests the probe makes next) first. `on_measured(rate, summary, is_service_probe)` hears of
    each probe after it ran; Ctrl-C in one raises `Interrupted`."""

    async def measure(rate: float, size: RunSize, name: str) -> RunSummary:
        resize(size)
        res = await probe(rate, seed, out / name, {**manifest, "rate_rps": rate})
        if res.interrupted:
            raise Interrupted
        if on_measured is not None:
            on_measured(rate, res.summary, name.startswith("bracket/probe-00"))
        return res.summary

    return await plan_rates(measure, target, on_probe=on_probe)


def sized_probe(probe: Probe, resize: Callable[[RunSize], None], size_of: Callable[[float], RunSize]) -> Probe:
    """`probe`, each run sized by `resize(size_of(rate))` first."""

    async def sized(rate_rps: float | None, seed: int, run_dir: Path | None, manifest: dict[str, Any]) -> ProbeResult:
        resize(size_of(float(rate_rps or 0.0)))
        return await probe(rate_rps, seed, run_dir, manifest)

    return sized


def probe_text(rate: float, s: RunSummary, is_service: bool) -> str:
    """One line per bracket probe: `bracket 23.2 req/s: attainment 100%`."""
    att = "-" if s.attainment_value is None else f"{s.attainment_value:.0%}"
    return (f"{'service probe' if is_service else 'bracket'} {rate:g} req/s: attainment {att}"
            + (" (past capacity)" if s.overloaded else ""))


def plan_text(plan: AutoPlan) -> str:
    """What the bracket found and what the sweep will run, in one line."""
    lo, hi = plan.bracket_rps
    return (f"service time {plan.service_s * 1e3:.0f} ms; the quick probes cross between "
            f"{'-' if lo is None else f'{lo:g}'} and {'-' if hi is None else f'{hi:g}'} req/s; sweeping "
            f"{', '.join(f'{r:g}' for r in plan.rates_rps)} req/s, {plan.point_duration_s:.1f} s of arrivals each")
