"""Calibrate's second stage: factors on the probe-fitted profile, fitted to served open-loop load.

The probes (`slobench.profiles.calibrate`) time an idle server: one prompt at a time, or one batch decoding
in lockstep. Under open-loop load the server also does work per request and per token (HTTP, SSE writes,
scheduling, a GIL shared by its event loop and its engine thread) while other requests step, and the probes
see that only in part. So, black-box, against any OpenAI-compatible endpoint, short open-loop runs at a few
rates are compared with their simulation on candidate profiles (`refine`'s doc says how and why).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from reference_engine.config import EngineConfig, EngineSpec
from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.metrics import RecordArrays
from slobench.errors import SpecError, UsageError
from slobench.experiments.probe import LiveProbe
from slobench.fleet.simulate import ModeledEngine, simulate_records
from slobench.run.records import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from slobench.load_setup import LoadSetup

METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
# With `RefinePlan.by_prompt_length`, the fit also compares the TTFT p50/p90 of the requests whose prompt is at
# most the run's median length and of the rest: o (per request) and b (per prompt token) move a whole run's
# TTFT percentiles alike, and only how TTFT grows with the prompt tells them apart. Scored (held-out error)
# on METRICS alone either way.
SPLIT_METRICS = ("ttft_short_p50", "ttft_short_p90", "ttft_long_p50", "ttft_long_p90")
MIN_SPLIT_REQUESTS = 10  # a half with fewer requests gives no percentile to fit
# each factor and the coefficients it scales
FACTORS = {"a": ("step_overhead_s",), "b": ("per_prefill_token_s",), "c": ("per_decode_seq_s",)}
COEFFICIENTS = ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s",
                "attention_per_pair_s", "per_request_s")  # a, b, c; d and f stay the probes'; r (fit_inside)
KNEE_FACTORS = (0.5, 0.8, 1.1)  # the default rates, of the probe fit's simulated knee
KNEE_TTFT_RISE = 3.0  # the knee: the last rate before TTFT p90 passes 3x its light-load value (a queue forms)
# weight of sum(log factor ^ 2) beside the mean squared log error: a factor 2 costs what a 1% error on every
# percentile does, enough to hold a direction the data do not see, too little to hold one they do (at 0.002,
# 3%, a wrong start held a, c and o 15-50% off the truth where the percentiles alone recovered them)
PRIOR = 0.0002
MAX_LOG_FACTOR = 3.0  # factors within 1/20 .. 20 of the probe fit
MAX_EVALS = 200  # candidates, all Nelder-Mead runs together; each simulates every fitted rate once
# Nelder-Mead restarted once from its best point with a fresh simplex: the surface is rough (a request's
# arrival on either side of a step boundary moves its TTFT by a step), and one run can settle in a dent that
# a fresh simplex of the same size steps out of
RESTARTS = 2
SIMPLEX_STEP = 0.5  # the first moves along each log factor: x1.65
XATOL, FATOL = 0.03, 3e-5  # a run has settled when its simplex spans 3% and its losses 3e-5 (0.5% RMS)
# The fifth parameter: step-time noise, the relative sd of each simulated step's time (the simulator's
# `jitter_sd`, drawn with JITTER_SEED). The simulated engine's steps take their modeled time exactly; a served
# one's do not (a GC pause, an SSE write landing mid-step, the client sharing the cores), and its p90s are
# made of those: without it the p90s came out 12-38% low below the knee (docs/measurements/validate_sim.md). Searched from 0
# in [0, MAX_JITTER], first move JITTER_STEP.
MAX_JITTER, JITTER_STEP, JITTER_SEED = 1.0, 0.2, 0
# With `RefinePlan.fit_inside`, a sixth: the request's own cost inside the server (CostProfile.per_request_s, r),
# as a multiple u of the probes' o, in [0, MAX_INSIDE]. o shifts a request's times and delays no one; r holds
# the server (the step sampling its first token) and delays everyone behind it: in a server that serves one
# request at a time, the difference is the queue past the knee (docs/measurements/refit_offline.md). First move INSIDE_STEP.
MAX_INSIDE, INSIDE_STEP = 4.0, 0.5
MAX_ARRIVALS_S = 600.0  # the 10 minutes for a whole calibrate: arrivals alone past it are refused

Percentiles = dict[str, float]
SpecsFor = Callable[[float], Sequence[RequestSpec]]
Measure = Callable[[float], Awaitable[Sequence[RequestRecord]]]


def _positive_int(name: str, value: Any, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecError(name, value, f"must be an integer >= {least}")


_SPEC = EngineSpec()  # the one engine description's defaults, which `--simulate` uses too
_MODELED_BLOCKS = EngineConfig().num_blocks  # EngineSpec leaves kv_blocks to the builder: this, when modeled


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The served engine's limits, which the simulation must share. `--simulate`'s defaults."""

    kv_blocks: int = _MODELED_BLOCKS
    max_num_seqs: int = _SPEC.max_num_seqs
    max_batched_tokens: int = _SPEC.max_batched_tokens
    block_size: int = _SPEC.block_size

    def __post_init__(self) -> None:
        for name in ("kv_blocks", "max_num_seqs", "max_batched_tokens", "block_size"):
            _positive_int(name, getattr(self, name))

    def engine(self, profile: CostProfile) -> ModeledEngine:
        return ModeledEngine(profile, kv_blocks=self.kv_blocks, block_size=self.block_size,
                             max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens, name="refine")


@dataclass(frozen=True, slots=True)
class RefinePlan:
    """What to send: `workload` (a bundled name or a TOML path) at `rates_rps` (None: KNEE_FACTORS of the
    probe fit's simulated knee), `num_requests` a rate, `seed`; `limits`: the served engine's."""

    workload: str = "tiny"
    rates_rps: tuple[float, ...] | None = None
    # 200: at 100 a rate three refinements of one server put o's factor at 0.4-7.5 and a's at 0.93-1.33; at 200,
    # two refinements on two shapes agreed within 8% on a, b, c and o (docs/measurements/refine_spread.md)
    num_requests: int = 200
    seed: int = 0
    limits: EngineLimits = field(default_factory=EngineLimits)
    by_prompt_length: bool = False  # also fit the TTFT of the shorter and longer half of the prompts (SPLIT_METRICS)
    fit_overhead: bool = True  # False: o stays the probes' (the fit moves a, b, c and the noise only)
    fit_inside: bool = False  # also fit r, the request's cost inside the server (MAX_INSIDE)

    def __post_init__(self) -> None:
        _positive_int("num_requests", self.num_requests, least=10)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SpecError("seed", self.seed, "must be an integer")
        if self.rates_rps is not None:
            rates = tuple(self.rates_rps)
            if any(isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r < math.inf for r in rates):
                raise SpecError("rates_rps", rates, "every rate must be a number > 0 (req/s)")
            if len(set(rates)) < 3:
                raise SpecError("rates_rps", rates, "needs at least 3 distinct rates (one is held out of the fit)")
            object.__setattr__(self, "rates_rps", tuple(sorted(float(r) for r in rates)))


@dataclass(slots=True)
class RatePoint:
    rate_rps: float
    held_out: bool
    measured: Percentiles
    num_requests: int
    num_ok: int
    probe_only: Percentiles = field(default_factory=dict)
    refined: Percentiles = field(default_factory=dict)


def errors(simulated: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, float]:
    """Relative error of each percentile, (simulated - measured) / measured, as validate_sim prints it."""
    return {k: (simulated[k] - measured[k]) / measured[k] for k in METRICS if k in measured and k in simulated}


def mean_abs_error(simulated: Mapping[str, float], measured: Mapping[str, float]) -> float:
    e = errors(simulated, measured)
    return float(np.mean([abs(v) for v in e.values()])) if e else float("nan")


@dataclass(slots=True)
class Refinement:
    plan: RefinePlan
    workload: str  # its name
    api: str
    knee_rps: float | None  # the probe fit's simulated knee, when the rates came from it
    points: list[RatePoint]
    factors: dict[str, float]  # refined / probe fit, by FACTORS name and "o"
    profile: CostProfile  # refined
    request_overhead_s: float  # refined `o`
    probe_profile: CostProfile
    probe_overhead_s: float
    num_simulations: int
    measure_s: float
    fit_s: float
    notes: list[str] = field(default_factory=list)
    jitter_sd: float = 0.0  # refined step-time noise (the simulator's jitter_sd; the probe fit has none)

    @property
    def held_out(self) -> RatePoint:
        return next(p for p in self.points if p.held_out)

    def held_out_error(self, which: str) -> float:
        """Mean |relative error| of TTFT/TPOT p50/p90 at the held-out rate: `which` "refined" or "probe_only"."""
        p = self.held_out
        return mean_abs_error(getattr(p, which), p.measured)

    def to_dict(self) -> dict[str, Any]:
        """What the profile's provenance records of it."""
        lim = self.plan.limits
        return {
            "workload": self.workload, "api": self.api, "num_requests": self.plan.num_requests,
            "seed": self.plan.seed, "knee_rps": self.knee_rps, "rates_rps": [p.rate_rps for p in self.points],
            "by_prompt_length": self.plan.by_prompt_length, "fit_overhead": self.plan.fit_overhead,
            "fit_inside": self.plan.fit_inside, "per_request_s": self.profile.per_request_s,
            "held_out_rate_rps": self.held_out.rate_rps,
            "engine_limits": {"kv_blocks": lim.kv_blocks, "block_size": lim.block_size,
                              "max_num_seqs": lim.max_num_seqs, "max_batched_tokens": lim.max_batched_tokens},
            "factors": dict(self.factors), "step_jitter_sd": self.jitter_sd,
            "held_out_error": {
                "probe_only": {**errors(self.held_out.probe_only, self.held_out.measured),
                               "mean_abs": self.held_out_error("probe_only")},
                "refined": {**errors(self.held_out.refined, self.held_out.measured),
                            "mean_abs": self.held_out_error("refined")},
            },
            "points": [{"rate_rps": p.rate_rps, "held_out": p.held_out, "num_requests": p.num_requests,
                        "num_ok": p.num_ok, "measured": p.measured, "probe_only": p.probe_only,
                        "refined": p.refined} for p in self.points],
            "num_simulations": self.num_simulations, "measure_s": round(self.measure_s, 1),
            "fit_s": round(self.fit_s, 1), "notes": list(self.notes),
        }


def scaled(profile: CostProfile, factors: Mapping[str, float]) -> CostProfile:
    changes = {c: getattr(profile, c) * factors.get(name, 1.0) for name, coefs in FACTORS.items() for c in coefs}
    return replace(profile, **changes)


def percentiles(records: Sequence[RequestRecord], overhead_s: float = 0.0, *, smooth: bool = False,
                split_tokens: int | None = None) -> Percentiles:
    """TTFT (from the send, plus `overhead_s`) and TPOT p50/p90 by the summary's own column rules; a metric
    no request has is left out. `smooth`: Harrell-Davis estimates (what the fit compares, see `harrell_davis`).
    `split_tokens`: also SPLIT_METRICS, the TTFT of the requests meant to send at most that many prompt tokens
    and of the rest (each half with at least MIN_SPLIT_REQUESTS TTFTs)."""
    a = RecordArrays.from_records(records)
    out: Percentiles = {}

    def put(metric: str, x: np.ndarray, shift: float, least: int) -> None:
        x = x[~np.isnan(x)]
        if len(x) >= least:
            p50, p90 = harrell_davis(x, (0.5, 0.9)) if smooth else np.quantile(x, (0.5, 0.9))
            out[f"{metric}_p50"], out[f"{metric}_p90"] = float(p50) + shift, float(p90) + shift

    put("ttft", a.ttft_s, overhead_s, 1)
    put("tpot", a.tpot_s, 0.0, 1)
    if split_tokens is not None:
        short = np.array([r.input_tokens <= split_tokens for r in records])
        put("ttft_short", a.ttft_s[short], overhead_s, MIN_SPLIT_REQUESTS)
        put("ttft_long", a.ttft_s[~short], overhead_s, MIN_SPLIT_REQUESTS)
    return out


def median_prompt(specs: Sequence[RequestSpec]) -> int:
    """The split of `percentiles(split_tokens=)`: the median prompt length the requests are meant to send."""
    return int(np.median([s.input_tokens for s in specs]))


@functools.lru_cache(maxsize=256)
def _hd_weights(n: int, q: float) -> np.ndarray:
    from scipy.stats import beta

    return np.diff(beta.cdf(np.arange(n + 1) / n, (n + 1) * q, (n + 1) * (1 - q)))


def harrell_davis(x: np.ndarray, qs: Sequence[float]) -> list[float]:
    """The Harrell-Davis quantile estimates: a weighted mean of every order statistic, the weights a Beta
    density's mass around q. The fit compares these rather than the plain percentiles because a request whose
    arrival lands on the other side of a step boundary moves its own TTFT by a whole step: the plain p50 of 30
    requests jumps with it (by 4% for a 0.5% change of `a` in a test), the Harrell-Davis estimate by a fraction,
    so the search sees a surface it can descend."""
    x = np.sort(x)
    return [float(_hd_weights(len(x), q) @ x) for q in qs]


def simulate(specs: Sequence[RequestSpec], limits: EngineLimits, profile: CostProfile, api: str,
             overhead_s: float = 0.0, *, smooth: bool = False, jitter_sd: float = 0.0,
             split_tokens: int | None = None) -> Percentiles:
    records = simulate_records(specs, limits.engine(profile), api=api, jitter_sd=jitter_sd,  # type: ignore[arg-type]
                               seed=JITTER_SEED)
    return percentiles(records, overhead_s, smooth=smooth, split_tokens=split_tokens)


def knee_rate(specs_for: SpecsFor, limits: EngineLimits, profile: CostProfile, overhead_s: float, api: str) -> float:
    """The highest rate, within ~9%, at which the simulated TTFT p90 stays under KNEE_TTFT_RISE times its
    light-load value. No SLO needed: it is where a queue forms on this profile and these limits. Doubling
    from a light load until it passes, then three halvings of the step in log space: ~10 simulations."""
    light = RecordArrays.from_records(simulate_records(specs_for(1e-3), limits.engine(profile), api=api))  # type: ignore[arg-type]
    limit = KNEE_TTFT_RISE * (float(np.nanquantile(light.ttft_s, 0.9)) + overhead_s)

    def queues(rate: float) -> bool:
        return simulate(specs_for(rate), limits, profile, api, overhead_s)["ttft_p90"] > limit

    lo = 0.2 / (float(np.nanmean(light.e2e_s)) + overhead_s)  # one request in flight a fifth of the time
    if queues(lo):
        return lo
    hi = lo * 2
    for _ in range(40):  # 2^40: from light load past any engine's limits
        if queues(hi):
            break
        lo, hi = hi, hi * 2
    for _ in range(3):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if queues(mid) else (mid, hi)
    return lo


@dataclass(frozen=True, slots=True)
class FactorFit:
    factors: dict[str, float]
    profile: CostProfile
    overhead_s: float
    num_simulations: int
    objective: float
    jitter_sd: float = 0.0


def fit_factors(profile: CostProfile, overhead_s: float, train: Sequence[tuple[Sequence[RequestSpec], Percentiles]],
                limits: EngineLimits, api: str, *, fit_overhead: bool = True, fit_inside: bool = False) -> FactorFit:
    """The factors (and `o`) and the step-time noise minimising the mean squared log ratio of simulated to
    measured percentiles over `train` (each: the requests of one rate and the Harrell-Davis percentiles
    measured of them), plus PRIOR * (sum(log factor ^ 2) + noise ^ 2). The search's point is the log factors
    followed by the noise (MAX_JITTER)."""
    from scipy.optimize import minimize, minimize_scalar

    free = [k for k, coefs in FACTORS.items() if any(getattr(profile, c) > 0 for c in coefs)]
    keys = [(i, k) for i, (_, m) in enumerate(train) for k in METRICS + SPLIT_METRICS if k in m]
    # measured by prompt length (RefinePlan.by_prompt_length): simulated the same way, split at the same length
    splits = [median_prompt(specs) if any(k in m for k in SPLIT_METRICS) else None for specs, m in train]
    if not keys:
        raise UsageError("calibrate: the refinement runs measured no TTFT or TPOT to fit")
    count = 0
    seen: dict[bytes, list[Percentiles]] = {}  # each restart begins at a point already simulated

    def simulated(x: np.ndarray) -> list[Percentiles]:
        nonlocal count
        key = np.asarray(x, dtype=float).tobytes()
        if key not in seen:
            count += len(train)
            prof = scaled(profile, dict(zip(free, np.exp(x[:len(free)]), strict=True)))
            if inside:
                prof = replace(prof, per_request_s=_inside(x, len(free), overhead_s))
            seen[key] = [simulate(specs, limits, prof, api, smooth=True, jitter_sd=_noise(x), split_tokens=split)
                         for (specs, _), split in zip(train, splits, strict=True)]
        return seen[key]

    def loss(got: list[Percentiles], log_o: float, metric: str) -> float:
        o = overhead_s * math.exp(log_o) if metric == "ttft" else 0.0
        return sum(_log_ratio(got[i].get(k), train[i][1][k], o) ** 2 for i, k in keys if k.startswith(metric)) / len(keys)

    def solve_o(got: list[Percentiles]) -> tuple[float, float]:
        if overhead_s <= 0 or not fit_overhead:
            return 0.0, loss(got, 0.0, "ttft")
        r = minimize_scalar(lambda t: loss(got, t, "ttft") + PRIOR * t**2, bounds=(-MAX_LOG_FACTOR, MAX_LOG_FACTOR),
                            method="bounded", options={"xatol": 1e-3})
        return float(r.x), float(r.fun)

    def objective(x: np.ndarray) -> float:
        got = simulated(x)
        return loss(got, 0.0, "tpot") + solve_o(got)[1] + PRIOR * float(np.sum(x**2))

    inside = fit_inside and overhead_s > 0
    n = len(free) + inside + 1  # the log factors, r's multiple of o (fit_inside), then the noise
    x = np.zeros(n)
    best = objective(x)
    if free:  # first one factor on every step cost: an idle server's view of a busy one is low across the board
        common = minimize_scalar(lambda t: objective(np.append(np.full(len(free), t), np.zeros(n - len(free)))),
                                 bounds=(-MAX_LOG_FACTOR, MAX_LOG_FACTOR), method="bounded", options={"xatol": 0.02})
        if common.fun < best:
            best, x = float(common.fun), np.append(np.full(len(free), float(common.x)), np.zeros(n - len(free)))
    steps = np.array([SIMPLEX_STEP] * len(free) + [INSIDE_STEP] * inside + [JITTER_STEP])
    for _ in range(RESTARTS):
        left = MAX_EVALS - count // len(train)
        if left < 4 * n:
            break
        simplex = np.vstack([x, x + np.diag(steps)])
        res = minimize(objective, x, method="Nelder-Mead",
                       bounds=[(-MAX_LOG_FACTOR, MAX_LOG_FACTOR)] * len(free) + [(0.0, MAX_INSIDE)] * inside
                       + [(0.0, MAX_JITTER)],
                       options={"initial_simplex": simplex, "xatol": XATOL, "fatol": FATOL, "maxfev": left})
        if not res.fun < best - 1e-6:
            break  # a restart from the best point found nothing better: the search has settled
        best, x = float(res.fun), res.x
    log_o, _ = solve_o(simulated(x))
    factors = {k: 1.0 for k in FACTORS} | dict(zip(free, (float(v) for v in np.exp(x[:len(free)])), strict=True))
    factors["o"] = math.exp(log_o)
    r = _inside(x, len(free), overhead_s) if inside else 0.0
    return FactorFit(factors, replace(scaled(profile, factors), per_request_s=r), overhead_s * factors["o"], count,
                     best, _noise(x))


def noise_notes(jitter_sd: float) -> list[str]:
    """A note when the fitted step-time noise sits at its bound (llama.cpp's refinements, 2026-12-02: 0.99-1.00):
    the search wanted more, so the noise stands for something else the model lacks."""
    if jitter_sd < MAX_JITTER * 0.99:
        return []
    return [f"the step-time noise reached its bound ({MAX_JITTER:g}): the measured spread (the p90s against the "
            "p50s) is wider than noise on each step explains, e.g. a server that queues requests outside its steps "
            "or a client sharing its cores; read the refined p90s with care"]


def _inside(x: np.ndarray, at: int, overhead_s: float) -> float:
    """r of a search point (fit_inside: its coordinate `at`, a multiple of the probes' o, within bounds)."""
    return float(np.clip(x[at], 0.0, MAX_INSIDE)) * overhead_s


def _noise(x: np.ndarray) -> float:
    """The step-time noise of a search point (its last coordinate), within the bounds Nelder-Mead may step past."""
    return float(np.clip(x[-1], 0.0, MAX_JITTER))


def _log_ratio(simulated: float | None, measured: float, shift_s: float = 0.0) -> float:
    if simulated is None or not simulated + shift_s > 0 or not measured > 0:
        return MAX_LOG_FACTOR  # a metric the simulation lacks: as bad as a factor e^3
    return math.log((simulated + shift_s) / measured)


def check_budget(rates: Sequence[float], num_requests: int) -> None:
    arrivals_s = sum(num_requests / r for r in rates)
    if arrivals_s > MAX_ARRIVALS_S:
        raise UsageError(f"calibrate: {num_requests} requests at each of {', '.join(f'{r:.3g}' for r in rates)} req/s "
                         f"take {arrivals_s:.0f} s of arrivals alone, over {MAX_ARRIVALS_S:.0f} s; give higher "
                         "--refine-rates or fewer --refine-requests")


async def refine(profile: CostProfile, overhead_s: float, plan: RefinePlan, measure: Measure, specs_for: SpecsFor,
                 *, api: str, workload: str, on_point: Callable[[RatePoint, float], None] | None = None) -> Refinement:
    """Measure `plan`'s rates with `measure(rate) -> records` (the requests `specs_for(rate)`), fit the
    factors on all but the middle rate, and score both profiles everywhere:

    1. short open-loop Poisson runs of a workload at a few rates, sent as `slobench run` sends them (the load
       flags' `LoadSetup`: its target, the runner, `LiveProbe`);
    2. the same requests (workload, seed, count) simulated on the virtual clock with candidate profiles and the
       served engine's limits, the request's fixed cost `o` added to every time after the send (as
       `benchmarks/validate_sim.py` adds it), TTFT and TPOT p50/p90 compared as log ratios;
    3. a search over the logs of three factors, on a (per step), b (per prompt token) and c (per decoding
       sequence): first one factor on all three (an idle server's view of a busy one is low across the board),
       then Nelder-Mead from there, restarted once. `o`'s factor is solved inside for each candidate: `o` shifts
       every TTFT percentile by exactly itself and leaves TPOT alone, so it needs no simulation of its own. The
       percentiles compared are Harrell-Davis estimates (`harrell_davis`), and a weak prior pulls each log factor
       toward 0 (the probe fit). A fifth parameter, searched beside them from 0, is the step-time noise: the
       relative sd of each simulated step's time (MAX_JITTER says why).

    Why factors on the probe fit and not a free fit: the probes fix the shape well (held-out probe error a few
    percent); served load moves the level of some costs. A factor is unit-free (one step size and one prior for a
    10 µs and a 10 ms coefficient), keeps the coefficient's sign, and makes twice and half equally far. Why these
    four: what the served path adds is work per step (scheduling, the event loop's turn), per token streamed (an
    SSE write, under the GIL the engine's thread needs: c) and per request (HTTP, parsing: o, and the steps it
    lands in), none of which grows with the context. d and f, the context's cost (attention), stay the probes'
    (decode at three contexts, prefill up to 1,024 tokens measure them as well as an idle server can): served
    percentiles cannot tell c from d (c·B and d·ΣC both grow with the batch), and a free d+f factor let the fit
    trade one for the other (in a test against a known profile it ended 45% off on d and c). A coefficient the
    probes put at 0 stays 0 (no factor moves it; the search leaves it out and says so).

    The middle rate is held out of the fit; both profiles, refined and probe-only, are scored on it, and that
    is the figure to trust. The profile written is the one fitted without it.

    The simulation needs the served engine's limits (KV blocks, most sequences, token budget a step). A
    black-box endpoint does not reveal them: they are given (`--kv-blocks`, `--max-num-seqs`,
    `--max-batched-tokens`), else `--simulate`'s defaults stand in, and the refinement is as good as they are.
    """
    cache: dict[float, Sequence[RequestSpec]] = {}

    def specs(rate: float) -> Sequence[RequestSpec]:
        if rate not in cache:
            cache[rate] = list(specs_for(rate))
        return cache[rate]

    limits = plan.limits
    knee = None
    rates = plan.rates_rps
    if rates is None:
        knee = knee_rate(specs, limits, profile, overhead_s, api)
        rates = tuple(knee * f for f in KNEE_FACTORS)
    check_budget(rates, plan.num_requests)
    held = len(rates) // 2
    points: list[RatePoint] = []
    smoothed: dict[float, Percentiles] = {}  # what the fit compares (`harrell_davis`)
    notes: list[str] = []
    t0 = time.perf_counter()
    for i, rate in enumerate(rates):
        t = time.perf_counter()
        recs = list(await measure(rate))
        if len(recs) != len(specs(rate)):
            raise UsageError(f"calibrate: the refinement run at {rate:.3g} req/s measured {len(recs)} requests, "
                             f"not the {len(specs(rate))} it was to send")
        ok = [r for r in recs if r.status == "ok"]
        if not ok:
            first = next((r.error for r in recs if r.error), "no error given")
            raise UsageError(f"calibrate: every request of the refinement run at {rate:.3g} req/s failed ({first}); "
                             "is --refine-workload within the server's limits?")
        if len(ok) < len(recs):
            notes.append(f"{len(recs) - len(ok)} of {len(recs)} requests failed at {rate:.3g} req/s; its percentiles "
                         "are those of the rest")
        points.append(RatePoint(rate, i == held, percentiles(recs), len(recs), len(ok)))
        smoothed[rate] = percentiles(recs, smooth=True,
                                     split_tokens=median_prompt(specs(rate)) if plan.by_prompt_length else None)
        if on_point is not None:
            on_point(points[-1], time.perf_counter() - t)
    measure_s = time.perf_counter() - t0
    notes += drift_notes(points)
    t0 = time.perf_counter()
    train = [(specs(p.rate_rps), smoothed[p.rate_rps]) for p in points if not p.held_out]
    fit = fit_factors(profile, overhead_s, train, limits, api, fit_overhead=plan.fit_overhead,
                      fit_inside=plan.fit_inside)
    for p in points:
        p.probe_only = simulate(specs(p.rate_rps), limits, profile, api, overhead_s)
        p.refined = simulate(specs(p.rate_rps), limits, fit.profile, api, fit.overhead_s, jitter_sd=fit.jitter_sd)
    for name, coefs in FACTORS.items():
        if not any(getattr(profile, c) > 0 for c in coefs):
            notes.append(f"{name} is 0 in the probe fit: no factor moves it")
    notes += overfit_notes(points) + noise_notes(fit.jitter_sd)
    return Refinement(plan, workload, api, knee, points, fit.factors, fit.profile, fit.overhead_s, profile, overhead_s,
                      fit.num_simulations, measure_s, time.perf_counter() - t0, notes, fit.jitter_sd)


def overfit_notes(points: Sequence[RatePoint]) -> list[str]:
    """The refined profile scoring worse than the probe fit on the held-out rate: the factors fit noise in
    the fitted rates rather than the server (three refinements of 100 requests a rate did so on a quiet
    machine, docs/measurements/refine_spread.md). Said, not refused: one held-out rate is itself a small sample."""
    held = next((p for p in points if p.held_out), None)
    if held is None or not held.refined or not held.probe_only:
        return []
    refined, probe = mean_abs_error(held.refined, held.measured), mean_abs_error(held.probe_only, held.measured)
    if not refined > probe:
        return []
    return [f"on the held-out rate {held.rate_rps:.3g} req/s the refined profile is further off ({refined:.1%}) than "
            f"the probe fit alone ({probe:.1%}): the refinement may have fitted noise; refine on more requests "
            "(--refine-requests), or keep the probe fit (--no-refine)"]


def drift_notes(points: Sequence[RatePoint], drop: float = 2 / 3) -> list[str]:
    """A median that falls by a third or more from one rate to the next higher one: the same server does not
    serve more load faster, so its speed changed between the runs (another process on the machine, a
    throttled CPU), and a fit to both describes neither. Said, not refused: the user decides."""
    out = []
    for lo, hi in zip(points, points[1:], strict=False):
        for k in ("ttft_p50", "tpot_p50"):
            if k in lo.measured and k in hi.measured and hi.measured[k] < drop * lo.measured[k]:
                out.append(f"measured {k.replace('_', ' ').upper()} fell from {lo.measured[k] * 1e3:.0f} ms at "
                           f"{lo.rate_rps:.3g} req/s to {hi.measured[k] * 1e3:.0f} ms at {hi.rate_rps:.3g}: the "
                           "server's speed changed between the runs, and the refinement is doubtful; run it again")
    return out


async def refine_live(setup: LoadSetup, profile: CostProfile, overhead_s: float, plan: RefinePlan,
                      *, write: Callable[[str], None] = print) -> Refinement:
    """`refine` against the endpoint `setup` names, through `LoadSetup.probe` (a `LiveProbe`)."""

    def on_point(p: RatePoint, wall_s: float) -> None:
        m = p.measured
        write(f"  refine: {p.rate_rps:.3g} req/s{' (held out)' if p.held_out else ''}: {p.num_ok}/{p.num_requests} "
              f"ok in {wall_s:.0f} s; TTFT p50 {_ms(m.get('ttft_p50'))} p90 {_ms(m.get('ttft_p90'))}, TPOT p50 "
              f"{_ms(m.get('tpot_p50'))} p90 {_ms(m.get('tpot_p90'))}")

    async with setup.probe(scrape=False) as (probe, manifest, _served):
        assert isinstance(probe, LiveProbe)  # a setup of a URL probes it live

        def specs_for(rate: float) -> list[RequestSpec]:
            # what the probe sends, bounded by the server's context as it was found at preflight
            return list(probe.make_specs(rate, plan.seed))

        async def measure(rate: float) -> Sequence[RequestRecord]:
            res = await probe(rate, plan.seed, None, {**manifest, "rate_rps": rate})
            if res.interrupted:
                raise KeyboardInterrupt
            return res.records

        return await refine(profile, overhead_s, plan, measure, specs_for, api=setup.api,
                            workload=setup.workload.name, on_point=on_point)


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:.1f} ms"


def _predicted(simulated: Mapping[str, float], err: Mapping[str, float], k: str) -> str:
    """A simulated value beside its error, or n/a where the simulation had none (no request of it finished)."""
    if k not in simulated or k not in err:
        return f"{'n/a':>18}"
    return f"{simulated[k] * 1e3:8.1f}ms ({err[k]:+5.0%})"


def print_refinement(ref: Refinement, write: Callable[[str], None] = print) -> None:
    lim = ref.plan.limits
    knee = f"; rates from the probe fit's simulated knee {ref.knee_rps:.3g} req/s" if ref.knee_rps else ""
    write(f"refinement on served load: workload {ref.workload}, {ref.plan.num_requests} requests a rate, seed "
          f"{ref.plan.seed}{knee}; simulated with {lim.kv_blocks} KV blocks of {lim.block_size}, "
          f"{lim.max_num_seqs} sequences, {lim.max_batched_tokens} tokens a step")
    write("factors on the probe fit: " + "  ".join(f"{k} x{v:.3g}" for k, v in ref.factors.items())
          + (f"  r {ref.profile.per_request_s * 1e3:.2f} ms inside the server" if ref.profile.per_request_s else "")
          + f"   (o = {ref.request_overhead_s * 1e3:.2f} ms; step-time noise sd {ref.jitter_sd:.2f}: `--simulate` and"
          f" `plan` with this profile apply both; fit {ref.fit_s:.0f} s, {ref.num_simulations} simulations;"
          f" measured {ref.measure_s:.0f} s)")
    write(f"{'req/s':>8} {'':<8} {'metric':<9} {'measured':>10} {'probe-only':>18} {'refined':>18}")
    for p in ref.points:
        e_probe, e_ref = errors(p.probe_only, p.measured), errors(p.refined, p.measured)
        for k in METRICS:
            if k not in p.measured:
                continue
            write(f"{p.rate_rps:8.3g} {'held out' if p.held_out else 'fit':<8} {k.replace('_', ' ').upper():<9} "
                  f"{p.measured[k] * 1e3:8.1f}ms {_predicted(p.probe_only, e_probe, k)} "
                  f"{_predicted(p.refined, e_ref, k)}")
    write(f"held-out rate {ref.held_out.rate_rps:.3g} req/s, mean |error| of TTFT/TPOT p50/p90: probe-only "
          f"{ref.held_out_error('probe_only'):.1%}, refined {ref.held_out_error('refined'):.1%}")
    for note in ref.notes:
        write(f"note: {note}")


def with_refinement(profile: CostProfile, ref: Refinement) -> CostProfile:
    """The probe-fitted `profile` (with its provenance) carrying the refined coefficients, the refined `o`
    as its `request_overhead_s`, the probe fit beside it (`probe_fit`) and the refinement (`refinement`)."""
    prov = dict(profile.provenance or {})
    p = ref.probe_profile
    prov["probe_fit"] = {**{c: getattr(p, c) for c in COEFFICIENTS}, "request_overhead_s": ref.probe_overhead_s}
    prov["request_overhead_s"] = ref.request_overhead_s
    prov["step_jitter_sd"] = ref.jitter_sd  # `--simulate` and `plan` apply it (slobench.fleet.simulate.calibrated_extras)
    prov["refinement"] = ref.to_dict()
    note = (f"{profile.note + ' ' if profile.note else ''}REFINED on served load ({ref.workload}, {len(ref.points)} rates): held-out rate "
            f"{ref.held_out.rate_rps:.3g} req/s, mean TTFT/TPOT p50/p90 error {ref.held_out_error('refined'):.1%} "
            f"(probe fit alone {ref.held_out_error('probe_only'):.1%}); request overhead now "
            f"{ref.request_overhead_s * 1e3:.2f} ms, step-time noise sd {ref.jitter_sd:.2f}, both applied by --simulate "
            "and plan.")
    return replace(profile, **{c: getattr(ref.profile, c) for c in COEFFICIENTS}, note=note, provenance=prov)
