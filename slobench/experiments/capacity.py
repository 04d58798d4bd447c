"""Capacity search: the largest offered rate whose SLO attainment stays at or above the target.

Each probe is one full open-loop run (`measure(rate_rps, seed)` returns its summary). The search probes
upward geometrically from a start rate until attainment breaks (downward if the start rate already
misses), then bisects the bracket until it is narrower than a relative tolerance. Then every seed, the
search's and each replicate's, locates its own crossing starting from that bracket (`crossing.locate_seed`:
widened until that seed crosses, narrowed to the tolerance, within --seed-probes), and the answer's
interval is taken over the seeds (`crossing.seeds_interval`), never over the requests of one run: near
saturation those requests share a queue and are strongly correlated (NOTES-statistics: variance inflated
3-50x), so seeds are the honest unit.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import t_interval
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError
from slobench.experiments.crossing import SeedCrossing, locate_seed, seeds_interval
from slobench.experiments.probe import LiveProbe, ProbeMeasure
from slobench.gate import workload_identity
from slobench.run.rundir import load_run

SEED_PROBES = 8  # new probes each seed may run to locate its crossing: widening covers ~30x the bracket
SHORT_PROBE_S = 30.0  # probes near capacity shorter than this get a note (see short_probe_note)

Measure = Callable[[float, int], Awaitable[RunSummary]]
Phase = Literal["up", "down", "bisect", "replicate", "locate"]  # replicate: a seed at the bracket's edges


@dataclass(frozen=True, slots=True)
class SearchOptions:
    target: float = 0.9  # attainment target (DistServe: 90% of all requests meet every SLO)
    start_rps: float = 1.0
    factor: float = 2.0  # geometric step while looking for the bracket
    rel_tol: float = 0.05  # stop bisecting when (hi - lo) / lo is below this
    max_probes: int = 12  # search probes (replicates not counted)
    max_rate_rps: float | None = None  # never offer more than this; reaching it meeting the SLO = lower bound
    min_rate_rps: float | None = None  # going down: give up below this (default start / factor**4)
    replicates: int = 5
    seed_probes: int = SEED_PROBES  # new probes each seed may run to bracket and narrow its own crossing
    level: float = 0.95  # two-sided confidence level of the replicate interval
    seed: int = 0  # seed of the search probes; replicates use seed+1 .. seed+replicates

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise SpecError("target", self.target, "must be in (0, 1]")
        if not (self.start_rps > 0 and math.isfinite(self.start_rps)):
            raise SpecError("start_rate", self.start_rps, "must be a positive number of req/s")
        if not self.factor > 1:
            raise SpecError("factor", self.factor, "must be > 1")
        if not 0 < self.rel_tol < 1:
            raise SpecError("tolerance", self.rel_tol, "must be in (0, 1)")
        if self.max_probes < 2:
            raise SpecError("max_probes", self.max_probes, "must be >= 2")
        if self.max_rate_rps is not None and not self.max_rate_rps >= self.start_rps:
            raise SpecError("max_rate", self.max_rate_rps, f"must be >= the start rate {self.start_rps}")
        if self.replicates < 0 or self.replicates == 1:
            raise SpecError("replicates", self.replicates, "must be 0 (none) or >= 2 (an interval needs two)")
        if self.seed_probes < 2:
            raise SpecError("seed_probes", self.seed_probes, "must be >= 2 (the bracket's two edges)")
        if not 0 < self.level < 1:
            raise SpecError("level", self.level, "must be in (0, 1)")
        if self.seed < 0:
            raise SpecError("seed", self.seed, "must be >= 0")

    @property
    def floor_rps(self) -> float:
        return self.min_rate_rps if self.min_rate_rps is not None else self.start_rps / self.factor**4


@dataclass(slots=True)
class Probe:
    rate_rps: float
    seed: int
    phase: Phase
    attainment: float
    ci: tuple[float, float] | None
    run_dir: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    client_bottleneck: bool = False
    duration_s: float | None = None  # first arrival to last completion: how long the probe's traffic lasted
    # the probe stopped once its fail was decided (summary.json's `stopped_early`): `attainment` is the share
    # met among the requests decided, `ci` its bounds (slobench.run.early_stop)
    stopped_early: dict[str, Any] | None = None

    def meets(self, target: float) -> bool:
        return self.attainment >= target  # NaN (no requests) never meets

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci is not None else None
        if self.stopped_early is None:  # written only when set: a whole probe's record reads as before
            del d["stopped_early"]
        return d


@dataclass(slots=True)
class CapacityResult:
    target: float
    capacity_rps: float | None  # None: even the lowest rate tried missed the target
    interval_rps: tuple[float, float] | None
    bracket_rps: tuple[float, float] | None  # (highest rate meeting, lowest rate missing) on the search seed
    replicate_edges_rps: tuple[float, float] | None
    is_lower_bound: bool  # no rate tried missed: the capacity is at least this
    probes: list[Probe]
    replicates: list[dict[str, Any]]  # per seed: crossing and the two edge probes
    slope_per_rps: float | None  # attainment lost per extra req/s at the boundary (pooled)
    level: float
    notes: list[str] = field(default_factory=list)
    inconclusive: str | None = None  # why the replicates give no capacity (capacity_rps is None then)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "capacity",
            "attainment_target": self.target,
            "capacity_rps": self.capacity_rps,
            "inconclusive": self.inconclusive,
            "interval_rps": list(self.interval_rps) if self.interval_rps else None,
            "level": self.level,
            "bracket_rps": list(self.bracket_rps) if self.bracket_rps else None,
            "replicate_edges_rps": list(self.replicate_edges_rps) if self.replicate_edges_rps else None,
            "is_lower_bound": self.is_lower_bound,
            "slope_per_rps": self.slope_per_rps,
            "probes": [p.to_dict() for p in self.probes],
            "replicates": self.replicates,
            "notes": self.notes,
        }


@dataclass(frozen=True, slots=True)
class FixedRates:
    """Fixed-rate mode's result: every rate with every seed, for gating at the same offered load."""

    rates_rps: Sequence[float]
    target: float
    probes: tuple[Probe, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "capacity", "mode": "fixed-rates", "attainment_target": self.target, "capacity_rps": None,
                "interval_rps": None, "rates_rps": list(self.rates_rps), "probes": [p.to_dict() for p in self.probes],
                "replicates": [], "notes": []}


def capacity_document(result: CapacityResult | FixedRates, *, slo: Any, manifest: dict[str, Any],
                      gpus: int | None = None, slo_scale_dir: Path | None = None) -> dict[str, Any]:
    """What capacity.json holds (written by `records.write_capacity`): the result, the SLO, the workload's
    identity (what the gate pairs baselines by), the target and manifest; goodput per GPU when `gpus` is
    known; with `slo_scale_dir` (the search's directory), DistServe's tightest SLO scale per edge rate."""
    doc: dict[str, Any] = result.to_dict() if isinstance(result, FixedRates) else {"mode": "search", **result.to_dict()}
    doc |= {"slo": slo.to_dict(), "workload": workload_identity(manifest),
            "target": manifest["target"], "manifest": manifest}
    if gpus and doc.get("capacity_rps") is not None:
        doc["gpus"] = gpus
        doc["goodput_per_gpu_rps"] = doc["capacity_rps"] / gpus
        if doc.get("interval_rps"):
            doc["goodput_per_gpu_interval_rps"] = [x / gpus for x in doc["interval_rps"]]
    if slo_scale_dir is not None:
        doc["slo_scale"] = slo_scales(slo_scale_dir, doc, slo)
    return doc


def slo_scales(out: Path, doc: dict[str, Any], slo: Any) -> list[dict[str, Any]]:
    """Per rate: the tightest SLO scale each replicate run still meets the target at (DistServe's view)."""
    reps = [p for p in doc["probes"] if p["phase"] == "replicate" and p.get("run_dir")]
    if doc.get("replicate_edges_rps") or doc.get("bracket_rps"):
        reps = [p for p in reps if p["rate_rps"] == (doc.get("replicate_edges_rps") or doc["bracket_rps"])[0]]
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for p in reps:
        scale = tightest_slo_scale(load_run(out / p["run_dir"]).records, slo)
        by_rate.setdefault(p["rate_rps"], []).append({"seed": p["seed"], "scale": scale})
    rows = []
    for rate, per in sorted(by_rate.items()):
        vals = [r["scale"] for r in per]
        finite = all(v < float("inf") for v in vals)
        rows.append({
            "rate_rps": rate, "replicates": per, "scale": sum(vals) / len(vals),
            "interval": list(t_interval(vals, doc.get("level", 0.95))) if finite and len(vals) > 1 else None,
        })
    return rows


def _probe(rate: float, seed: int, phase: Phase, summary: RunSummary) -> Probe:
    att = summary.attainment
    value = None if att is None else att.value
    lo, hi = (None, None) if att is None else (att.ci_low, att.ci_high)
    return Probe(
        rate_rps=float(rate),
        seed=seed,
        phase=phase,
        attainment=float("nan") if value is None else float(value),
        ci=(float(lo), float(hi)) if lo is not None and hi is not None else None,
        run_dir=summary.run_dir,
        metrics=summary.flat_metrics(),
        client_bottleneck=summary.client.is_bottleneck,
        duration_s=summary.duration_s if math.isfinite(summary.duration_s) else None,
        stopped_early=dict(summary.stopped_early) if summary.stopped_early is not None else None,
    )


async def search_capacity(measure: Measure, opts: SearchOptions) -> CapacityResult:
    """Bracket, bisect, then replicate at the bracket edges. `measure` is called one probe at a time."""
    target = opts.target
    probes: list[Probe] = []
    notes: list[str] = []

    async def probe(rate: float, seed: int, phase: Phase) -> Probe:
        p = _probe(rate, seed, phase, await measure(rate, seed))
        probes.append(p)
        if p.client_bottleneck:
            notes.append(f"rate {rate:g} seed {seed}: the client was the bottleneck; that probe measured it")
        return p

    def searched() -> int:
        return sum(1 for p in probes if p.phase != "replicate")

    # 1. bracket: lo meets the target, hi misses it
    first = await probe(opts.start_rps, opts.seed, "up")
    lo: Probe | None = first if first.meets(target) else None
    hi: Probe | None = None if first.meets(target) else first
    if lo is not None:
        while hi is None and searched() < opts.max_probes:
            rate = lo.rate_rps * opts.factor
            if opts.max_rate_rps is not None:
                if lo.rate_rps >= opts.max_rate_rps:
                    break
                rate = min(rate, opts.max_rate_rps)
            p = await probe(rate, opts.seed, "up")
            lo, hi = (p, None) if p.meets(target) else (lo, p)
    else:
        while lo is None and searched() < opts.max_probes:
            rate = hi.rate_rps / opts.factor  # type: ignore[union-attr]
            if rate < opts.floor_rps:
                break
            p = await probe(rate, opts.seed, "down")
            lo, hi = (p, hi) if p.meets(target) else (None, p)
    if lo is None:
        notes.append(f"attainment is below {target:.0%} at every rate tried (lowest {hi.rate_rps:g} req/s)")  # type: ignore[union-attr]
        return CapacityResult(target, None, None, None, None, False, probes, [], None, opts.level, notes)
    if hi is None:
        notes.append(f"no rate tried missed the target: capacity is at least {lo.rate_rps:g} req/s")
        return CapacityResult(target, lo.rate_rps, None, None, None, True, probes, [], None, opts.level, notes)

    # 2. bisect the bracket
    while (hi.rate_rps - lo.rate_rps) / lo.rate_rps > opts.rel_tol and searched() < opts.max_probes:
        p = await probe((lo.rate_rps + hi.rate_rps) / 2, opts.seed, "bisect")
        lo, hi = (p, hi) if p.meets(target) else (lo, p)
    if (hi.rate_rps - lo.rate_rps) / lo.rate_rps > opts.rel_tol:
        notes.append(f"stopped after {opts.max_probes} probes with the bracket still wider than {opts.rel_tol:.0%}")
    bracket = (lo.rate_rps, hi.rate_rps)
    search_slope = (lo.attainment - hi.attainment) / (hi.rate_rps - lo.rate_rps)

    # 3. every seed (the search's and each replicate's) locates its own crossing from the bracket
    if opts.replicates == 0:
        est = interpolate(bracket, lo.attainment, hi.attainment, target)
        notes.append("no replicates: the capacity has no interval")
        return CapacityResult(target, est, None, bracket, None, False, probes, [], search_slope, opts.level, notes)
    located = []
    for seed in range(opts.seed, opts.seed + 1 + opts.replicates):
        known = [(p.rate_rps, p.attainment) for p in probes if p.seed == seed]

        async def attain(rate: float, seed: int = seed) -> float:
            return (await probe(rate, seed, "replicate" if rate in bracket else "locate")).attainment

        located.append(await locate_seed(seed, attain, target, known=known, edges=bracket, rel_tol=opts.rel_tol,
                                         budget=opts.seed_probes, max_rate_rps=opts.max_rate_rps))
    reps = [s.to_dict() for s in located]
    found = [s for s in located if s.capacity_rps is not None]
    slope = float(np.mean([s.slope_per_rps for s in found])) if found else None
    # a probe stopped early is short because its fail was decided, not for its size
    short = short_probe_note([p for p in probes if p.phase not in ("up", "down") and p.stopped_early is None])
    if short:
        notes.append(short)
    longer = longer_probes([p for p in probes if p.phase in ("replicate", "locate")])
    why = inconclusive_reason(located, opts, longer)
    if why is None:
        est, interval = seeds_interval(found, opts.level)
        if not interval[0] > 0:
            why = (f"the capacity's interval [{interval[0]:.3g}, {interval[1]:.3g}] reaches 0 req/s or below "
                   f"(seeds crossing at {listed(found)} req/s): run more --replicates (now {opts.replicates}) "
                   f"or {longer}")
    if why is not None:
        return CapacityResult(target, None, None, bracket, bracket, False, probes, reps, slope, opts.level, notes,
                              inconclusive=why)
    return CapacityResult(target, est, interval, bracket, bracket, False, probes, reps, slope, opts.level, notes)


def listed(found: Sequence[SeedCrossing]) -> str:
    return ", ".join(f"{s.capacity_rps:.3g}" for s in found)


def longer_probes(seeds_probes: Sequence[Probe]) -> str:
    """What to ask for when the seeds' probes were too short to decide, with how long they lasted."""
    durations = [p.duration_s for p in seeds_probes if p.duration_s is not None]
    seen = f": these lasted {float(np.median(durations)):.0f} s of traffic" if durations else ""
    return f"longer probes (--duration{seen})"


def inconclusive_reason(located: Sequence[SeedCrossing], opts: SearchOptions, longer: str) -> str | None:
    """Why the seeds locate no capacity, or None when they do: a seed whose crossing its probe budget did
    not bracket is censored (its bound said, never imputed), and one censored seed leaves the mean unknown.
    `longer`: what `longer_probes` says about the seeds' probes."""
    censored = [s for s in located if s.capacity_rps is None]
    if not censored:
        return None
    found = [s for s in located if s.capacity_rps is not None]
    said = "; ".join(f"seed {s.seed} {s.censored}" for s in censored)
    rest = f"; the other seeds cross at {listed(found)} req/s" if found else ""
    return (f"{len(censored)} of {len(located)} seeds not bracketed within {opts.seed_probes} probes each: {said}"
            f"{rest}: raise --seed-probes (now {opts.seed_probes}) or run {longer}")


def short_probe_note(near: Sequence[Probe]) -> str | None:
    """Past capacity the queue grows for as long as the traffic lasts, so attainment there depends on run
    length: a probe of a few seconds barely sees the overload and overstates capacity. With a fixed number
    of requests a probe gets shorter as the rate rises (a fleet's probes most of all). On the simulated
    `chat` fleet (benchmarks/fleet_routing.py) 400-request probes put two replicas at 243 req/s, 30-second
    probes at 77.5."""
    durations = [p.duration_s for p in near if p.duration_s is not None and math.isfinite(p.duration_s)]
    if not durations or min(durations) >= SHORT_PROBE_S:
        return None
    return (f"probes near capacity lasted only {min(durations):.0f} s of traffic: past capacity the queue grows "
            f"with run length, so short probes overstate capacity; fix their length with --duration "
            f"(>= {SHORT_PROBE_S:g} s) instead of --num-requests")


def interpolate(bracket: tuple[float, float], a_lo: float, a_hi: float, target: float) -> float:
    lo, hi = bracket
    if a_lo == a_hi:
        return (lo + hi) / 2
    return lo + (a_lo - target) / (a_lo - a_hi) * (hi - lo)


async def replicate_at_rates(
    measure: Measure, rates: Sequence[float], seeds: Sequence[int], *, target: float
) -> list[Probe]:
    """Fixed-rate mode: every rate with every seed (for gating at the same offered load)."""
    out = []
    for seed in seeds:
        for rate in rates:
            p = _probe(rate, seed, "replicate", await measure(rate, seed))
            out.append(p)
    return out


class RunMeasure(ProbeMeasure):
    """The live `measure`: a `ProbeMeasure` over a `LiveProbe` (one open-loop run through
    `slobench.run.runner.run`), each probe in its own run directory."""

    def __init__(
        self,
        make_specs: Callable[[float, int], Any],
        target: Any,
        *,
        out_dir: str | Path,
        slo: Any,
        opts: Any,
        manifest: dict[str, Any],
        clock: Any = None,
        on_probe: Callable[[float, int, RunSummary], None] | None = None,
        after_run: Callable[[Path, RunSummary], Awaitable[RunSummary]] | None = None,
    ) -> None:
        probe = LiveProbe(make_specs, target, slo=slo, opts=opts, clock=clock, after_run=after_run)
        super().__init__(probe, out_dir=out_dir, manifest=manifest, on_probe=on_probe)


def tightest_slo_scale(records: Sequence[Any], slo: Any) -> float:
    """DistServe's "SLO scale" view of one run: the smallest k such that the SLO with every latency bound
    multiplied by k is still met by `slo.target` of the requests. inf when too many requests failed.

    Exact rather than bisected: each request needs the scale max(latency / bound) over the SLO's bounds
    (inf if it failed), attainment at scale k is the share of requests needing <= k, so the answer is the
    ceil(target * n)-th smallest need.
    """
    a = RecordArrays.from_records(records)
    n = len(a)
    if n == 0:
        return float("nan")
    sched = slo.clock == "scheduled"
    need = np.where(a.is_ok, 0.0, np.inf)
    for bound, values in (
        (slo.ttft_s, a.ttft_from_scheduled_s if sched else a.ttft_s),
        (slo.tpot_s, a.tpot_s),
        (slo.e2e_s, a.e2e_from_scheduled_s if sched else a.e2e_s),
    ):
        if bound is not None:
            need = np.maximum(need, np.nan_to_num(values, nan=np.inf) / bound)
    k = math.ceil(slo.target * n - 1e-9)
    return float(np.sort(need)[k - 1])
