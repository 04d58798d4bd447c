"""Capacity search: the largest offered rate whose SLO attainment stays at or above the target.

Each probe is one full open-loop run (`measure(rate_rps, seed)` returns its summary). The search probes
upward geometrically from a start rate until attainment breaks (downward if the start rate already
misses), then bisects the bracket until it is narrower than a relative tolerance. The answer's error bar
comes from *replicate runs at the bracket edges*, never from intervals over the requests of one run: near
saturation those requests share a queue and are strongly correlated (NOTES-statistics: variance
inflated 3-50x), so replicates with different seeds are the honest unit (`replicate_crossings`).
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
from slobench.experiments.probe import LiveProbe, ProbeMeasure
from slobench.gate import workload_identity
from slobench.run.rundir import load_run

SHORT_PROBE_S = 30.0  # probes near capacity shorter than this get a note (see short_probe_note)

Measure = Callable[[float, int], Awaitable[RunSummary]]
Phase = Literal["up", "down", "bisect", "replicate"]


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
    replicate_span: float = 0.0  # widen the replicate edges to span at least this relative width
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
        if not 0 <= self.replicate_span < 1:
            raise SpecError("replicate_span", self.replicate_span, "must be in [0, 1)")
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

    def meets(self, target: float) -> bool:
        return self.attainment >= target  # NaN (no requests) never meets

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci is not None else None
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

    # 3. replicates at the bracket edges, paired by seed
    if opts.replicates == 0:
        est = interpolate(bracket, lo.attainment, hi.attainment, target)
        notes.append("no replicates: the capacity has no interval")
        return CapacityResult(target, est, None, bracket, None, False, probes, [], search_slope, opts.level, notes)
    edges = replicate_edges(bracket, opts.replicate_span)
    pairs: list[tuple[Probe, Probe]] = []
    for i in range(opts.replicates):
        seed = opts.seed + 1 + i
        pairs.append((await probe(edges[0], seed, "replicate"), await probe(edges[1], seed, "replicate")))
    values = [(a.attainment, b.attainment) for a, b in pairs]
    crossings, slope = replicate_crossings(edges, values, target, search_slope)
    if slope == search_slope:
        notes.append("replicates' pooled slope was not positive; used the search bracket's slope")
    est = float(np.mean(crossings))
    interval = jackknife_interval(edges, values, target, search_slope, opts.level)
    if not edges[0] <= est <= edges[1]:
        notes.append(f"replicate capacity {est:.3g} lies outside the replicate edges {edges}: extrapolated")
    short = short_probe_note([p for pair in pairs for p in pair])
    if short:
        notes.append(short)
    reps = [
        {"seed": a.seed, "capacity_rps": c, "lo": a.to_dict(), "hi": b.to_dict()}
        for (a, b), c in zip(pairs, crossings, strict=True)
    ]
    probed = (min(p.rate_rps for p in probes), max(p.rate_rps for p in probes))
    why = inconclusive_reason(est, interval, probed, crossings)
    if why is not None:
        return CapacityResult(target, None, None, bracket, edges, False, probes, reps, slope, opts.level, notes,
                              inconclusive=why)
    return CapacityResult(target, est, interval, bracket, edges, False, probes, reps, slope, opts.level, notes)


def inconclusive_reason(est: float, interval: tuple[float, float], probed: tuple[float, float],
                        crossings: Sequence[float]) -> str | None:
    """Why the replicates locate no capacity, or None when they do: the capacity must lie within the rates
    probed (a straight line drawn past every rate run is no measurement), and its interval above 0 and no
    wider than the rates probed span (else the seeds scatter too much to place a crossing at all). The
    interval may reach a little past the lowest or highest rate probed: a search whose first probe met or
    missed brackets the capacity with that very rate, so the interval's 95% reach can pass it."""
    lo, hi = interval
    per_seed = ", ".join(f"{c:.3g}" for c in crossings)
    tail = (f"; estimate {est:.3g} req/s, {len(crossings)} replicates crossing at {per_seed} req/s: the seeds "
            "disagree more than the probes can resolve; run longer probes (--duration) or more --replicates")
    span = f"the rates probed ({probed[0]:g}-{probed[1]:g} req/s)"
    if not (math.isfinite(est) and probed[0] <= est <= probed[1]):
        return f"the replicates put the capacity outside {span}" + tail
    if not (math.isfinite(lo) and lo > 0):
        return f"the capacity's interval [{lo:.3g}, {hi:.3g}] reaches 0 req/s or below" + tail
    if hi - lo > probed[1] - probed[0]:
        return f"the capacity's interval [{lo:.3g}, {hi:.3g}] is wider than {span}" + tail
    return None


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


def replicate_edges(bracket: tuple[float, float], span: float) -> tuple[float, float]:
    """The rates replicates run at: the bracket, widened symmetrically to at least `span` of its middle.

    Wider edges determine the pooled slope better when seeds differ more than the attainment drops across
    the bracket, but linear interpolation over a curved stretch is biased: on a logistic curve a 20% span
    took the interval's coverage from 95% to under 50%, so the default is the bracket itself (span 0).
    """
    lo, hi = bracket
    mid = (lo + hi) / 2
    half = max((hi - lo) / 2, mid * span / 2)
    return (round(mid - half, 6), round(mid + half, 6))


def interpolate(bracket: tuple[float, float], a_lo: float, a_hi: float, target: float) -> float:
    lo, hi = bracket
    if a_lo == a_hi:
        return (lo + hi) / 2
    return lo + (a_lo - target) / (a_lo - a_hi) * (hi - lo)


def replicate_crossings(
    bracket: tuple[float, float], edges: Sequence[tuple[float, float]], target: float, fallback_slope: float
) -> tuple[list[float], float]:
    """Per-seed crossing rates from (attainment at lo, attainment at hi) pairs, and the pooled slope: how one
    replicate becomes one capacity number (the choice, and why).

      Each replicate seed s is run at both bracket edges lo and hi (optionally widened: `replicate_edges`)
      with the same seed (common random numbers:
      the same requests, the arrival times scaled by the rate), giving a_lo[s] and a_hi[s]. Its crossing is
      found by linear interpolation (DistServe's goodput definition) through its own level at the bracket
      mid-point, ā_s = (a_lo[s] + a_hi[s]) / 2, with the slope β pooled over all replicates:
          c_s = (lo + hi) / 2 + (ā_s - target) / β,     β = (mean a_lo - mean a_hi) / (hi - lo)
      A per-seed slope would divide by the difference of two noisy numbers over a bracket only ~5% wide and
      explode whenever one seed's curve is flat or non-monotone there; pooling keeps each c_s linear in that
      seed's data. The capacity is the mean of c_s; its interval is a Student-t interval with a jackknife
      (leave one seed out) standard error: it carries the between-seed variance (queueing correlation
      included) and, because each leave-one-out sample re-pools the slope, the slope's uncertainty too
      (synthetic logistic curves: 94-96% coverage at 95% nominal with 5 replicates; a t-interval over the
      c_s alone gave 82-91%). If the replicates' pooled slope is not positive (noise swamped a flat curve),
      the search bracket's own slope is used instead.
    """
    lo, hi = bracket
    a = np.asarray(edges, dtype=float)
    slope = float((np.nanmean(a[:, 0]) - np.nanmean(a[:, 1])) / (hi - lo))
    if not (math.isfinite(slope) and slope > 0):
        slope = fallback_slope
    mid = (lo + hi) / 2
    level = np.nan_to_num(a.mean(axis=1), nan=0.0)  # a seed whose runs produced nothing counts as missing
    return [float(mid + (v - target) / slope) for v in level], slope


def jackknife_interval(
    bracket: tuple[float, float], edges: Sequence[tuple[float, float]], target: float, fallback_slope: float,
    level: float,
) -> tuple[float, float]:
    """Student-t interval for the replicate capacity with a leave-one-seed-out (jackknife) standard error.

    With the slope held fixed this equals the plain t-interval over the per-seed crossings; re-estimating
    the pooled slope in each leave-one-out sample adds the slope's own uncertainty, which matters when the
    crossing sits off the bracket's middle or the attainment noise is large against the bracket's drop.
    """
    from scipy import stats

    k = len(edges)
    est = float(np.mean(replicate_crossings(bracket, edges, target, fallback_slope)[0]))
    if k < 2:
        return (est, est)
    loo = np.array([
        np.mean(replicate_crossings(bracket, [e for j, e in enumerate(edges) if j != i], target, fallback_slope)[0])
        for i in range(k)
    ])
    se = math.sqrt((k - 1) / k * float(((loo - loo.mean()) ** 2).sum()))
    half = float(stats.t.ppf((1 + level) / 2, k - 1)) * se
    return (est - half, est + half)


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
