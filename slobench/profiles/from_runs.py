"""The serving loop's host costs fitted from measured requests, by replaying them through the simulator.

A profile of the forward pass alone (a roofline, or step-time fits of an idle engine) leaves out the host
work of the loop around it: scheduling, sampling and detokenising each running request, RPC to the workers.
Two terms stand for it (`CostProfile.host_step_s`, `host_per_seq_s`: a fixed cost a step and a cost per
sequence sampling a token in it), and a third for what a request pays outside the steps (the request
overhead: its HTTP, parsing and tokenising, the first token's way out), which moves every time after the
send alike and so TTFT, not TPOT. They are fitted by replaying each measured run (its arrivals and lengths)
on the simulated server and comparing every request's simulated TTFT and TPOT with its measured ones:

- the loss: per request, the squared log ratio simulated / measured of its TPOT (answers of more than one
  token), and per run, of its TTFT deciles (a request's own TTFT moves with where its arrival falls in a
  step: matched in distribution); each clipped at |log| <= CLIP (0.3: off by more than 35%), so that a
  request the simulator misses for a reason of its own (a wait before its second token that it does not
  model, a cliff) counts as one miss and does not bend the host costs;
- the request overhead: for each pair of host costs replayed, the one (>= 0, on a 0.25 ms grid up to the
  measured runs' fastest TTFT decile) that minimises the TTFT loss; it queues nothing, so it costs no replay;
- search: a coarse grid, then a pattern search (3 x 3 around the best point; it moves to the best of them,
  and the spacing halves when the centre stays best);
- the estimate: the minimum of a quadratic surface fitted to the losses at the last rounds' points;
- uncertainty: the same minimum over bootstrap resamples of the requests (within each run), with the last
  spacing's resolution added (its uniform error, spacing / sqrt(12)).

Replays are exact and deterministic: the fit's cost is (points evaluated) x (replay of the fitting runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError
from slobench.fleet.published import (
    FleetBuilder,
    Run,
    ScaledBuilder,
    scaled_kv_blocks,
    simulated_times_ms,
    specs_of,
)
from slobench.fleet.simulate import ModeledEngine, SimOptions, simulate_records
from slobench.run.records import RequestSpec

# (run, host step s, host per-seq s) -> the run's simulated TTFT and TPOT (ms) in request order
Replayer = Callable[[Run, float, float], tuple[np.ndarray, np.ndarray]]
# |log(simulated / measured)| beyond this counts as this: about twice a good fit's scatter a request (rms
# 0.17 on DistServe's runs at 3 req/s), so the bulk of the requests decides the host costs, not a tail
CLIP = 0.3


@dataclass(frozen=True, slots=True)
class FitPlan:
    """The search: coarse grids in units of `scale_s` (a decode step of the base profile), then `rounds` of
    3 x 3 pattern search; `bootstrap` resamples of the requests for the uncertainty."""

    scale_s: float
    step_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)
    per_seq_grid: tuple[float, ...] = (0.0, 0.01, 0.02, 0.04, 0.08)
    rounds: int = 3
    bootstrap: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.scale_s < math.inf:
            raise SpecError("fit scale", self.scale_s, "must be a step time > 0 s")
        for name in ("step_grid", "per_seq_grid"):
            g = getattr(self, name)
            if len(g) < 3 or any(x < 0 for x in g) or list(g) != sorted(set(g)):
                raise SpecError(name, g, "must be >= 3 increasing values >= 0")
        if self.rounds < 1 or self.bootstrap < 10:
            raise SpecError("fit plan", (self.rounds, self.bootstrap), "needs rounds >= 1 and bootstrap >= 10")


@dataclass(frozen=True, slots=True)
class HostFit:
    """The fitted host costs (s), their bootstrap standard deviations (s) and what the fit cost."""

    step_s: float
    per_seq_s: float
    step_sd_s: float
    per_seq_sd_s: float
    request_overhead_s: float
    request_overhead_sd_s: float
    loss: float  # mean loss a request at the estimate
    base_loss: float  # the same with no host costs and no request overhead
    num_replays: int
    fit_runs: tuple[str, ...]
    bootstrap: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    # the base profile's prefill price times this (fitted with `fit_with_scales`; else 1), its sd, and
    # the loss at each scale tried
    prefill_scale: float = 1.0
    prefill_scale_sd: float = 0.0
    prefill_losses: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    # the served engine's KV blocks times this (fitted with `fit_with_scales(kv=True)`; else 1), its sd, and
    # the loss at each scale tried (each the best over the prefill scales)
    kv_scale: float = 1.0
    kv_scale_sd: float = 0.0
    kv_losses: tuple[tuple[float, float], ...] = field(default=(), repr=False)


def _clipped_sq_log(sim: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """(log(sim / meas))^2 with |log| clipped at CLIP; a time never reached (inf) counts as CLIP."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(sim / meas)
    r = np.where(np.isnan(r), 0.0, r)
    return np.clip(r, -CLIP, CLIP) ** 2


def tpot_loss(run: Run, tpot_sim_ms: np.ndarray) -> np.ndarray:
    """Per request: the clipped squared log ratio of its TPOT (0 for one-token answers and unusable times)."""
    ok = (run.output_len > 1) & (run.tpot_ms > 0) & np.isfinite(run.tpot_ms)
    return np.where(ok, _clipped_sq_log(np.where(ok, tpot_sim_ms, 1.0), np.where(ok, run.tpot_ms, 1.0)), 0.0)


DECILES = np.arange(10, 100, 10)


def ttft_losses(meas_ms: np.ndarray, sim_ms: np.ndarray, overheads_ms: np.ndarray,
                prompt_len: np.ndarray | None = None) -> np.ndarray:
    """For each request overhead (ms), the clipped squared log ratios of a run's TTFT deciles (simulated plus
    the overhead, against measured), their mean. A request's own TTFT is a few steps and moves with where its
    arrival falls in a step, so it is matched in distribution, not request by request. With `prompt_len`, the
    deciles are taken within each third of the prompts by length and the thirds' losses averaged: a constant
    (the overhead) and a share of the prompt (the prefill's price) then move the thirds differently."""
    ok = np.isfinite(meas_ms) & (meas_ms > 0)
    if not ok.any():
        return np.zeros(len(overheads_ms))
    groups = [ok]
    if prompt_len is not None and ok.sum() >= PROMPT_THIRDS * MIN_PER_THIRD:
        edges = np.percentile(prompt_len[ok], [100 / 3, 200 / 3])
        third = np.searchsorted(edges, prompt_len, side="right")
        groups = [ok & (third == k) for k in range(PROMPT_THIRDS)]
        groups = [g for g in groups if g.sum() >= MIN_PER_THIRD] or [ok]
    out = np.zeros(len(overheads_ms))
    for g in groups:
        sim = np.percentile(np.where(np.isfinite(sim_ms[g]), sim_ms[g], np.inf), DECILES)
        meas = np.percentile(meas_ms[g], DECILES)
        out += _clipped_sq_log(sim[None, :] + overheads_ms[:, None], meas[None, :]).mean(axis=1)
    return out / len(groups)


PROMPT_THIRDS = 3
MIN_PER_THIRD = 30  # requests a third needs for its deciles; fewer, and the run's TTFT is matched whole


OVERHEAD_STEP_MS = 0.25


def overhead_grid_ms(runs: Sequence[Run]) -> np.ndarray:
    """The request overheads tried (ms): 0 up to the measured runs' fastest TTFT decile, 0.25 ms apart."""
    tops = [float(np.percentile(r.ttft_ms[ok], 10)) for r in runs
            if (ok := np.isfinite(r.ttft_ms) & (r.ttft_ms > 0)).any()]
    return np.arange(0.0, min(tops, default=0.0) + OVERHEAD_STEP_MS / 2, OVERHEAD_STEP_MS)


class _Losses:
    """Per point evaluated: each fitting request's TPOT loss and its simulated TTFT (a point is replayed once).
    The loss: the mean TPOT loss a request plus the mean TTFT-decile loss a run, over any resample of the
    requests (`total`)."""

    def __init__(self, runs: Sequence[Run], replay: Replayer) -> None:
        self.runs, self.replay = runs, replay
        self.at: dict[tuple[float, float], tuple[np.ndarray, list[np.ndarray]]] = {}
        self.every = [np.arange(len(r.start_s)) for r in runs]
        self.overheads_ms = overhead_grid_ms(runs)

    def key(self, x: float, y: float) -> tuple[float, float]:
        k = (round(max(x, 0.0), 12), round(max(y, 0.0), 12))
        if k not in self.at:
            tp, tt = [], []
            for r in self.runs:
                ttft, tpot = self.replay(r, *k)
                tp.append(tpot_loss(r, tpot))
                tt.append(ttft)
            self.at[k] = (np.concatenate(tp), tt)
        return k

    def total(self, k: tuple[float, float], pick: Sequence[np.ndarray]) -> float:
        return self.with_overhead(k, pick)[0]

    def with_overhead(self, k: tuple[float, float], pick: Sequence[np.ndarray], free: bool = True
                      ) -> tuple[float, float]:
        """The loss at `k` over the requests `pick`ed, with the request overhead that minimises it (`free`; else
        none), and that overhead (s)."""
        tp, tt = self.at[k]
        offsets = np.cumsum([0, *(len(r.start_s) for r in self.runs[:-1])])
        tpot = np.concatenate([tp[o + i] for o, i in zip(offsets, pick, strict=True)]).mean()
        ttft = np.mean([ttft_losses(r.ttft_ms[i], s[i], self.overheads_ms, r.prompt_len[i])
                        for r, s, i in zip(self.runs, tt, pick, strict=True)], axis=0)
        best = int(np.argmin(ttft)) if free else 0
        return float(tpot + ttft[best]), float(self.overheads_ms[best]) / 1e3

    def __call__(self, x: float, y: float) -> float:
        return self.total(self.key(x, y), self.every)


def _quadratic_min(points: list[tuple[float, float]], values: np.ndarray, sx: float, sy: float
                   ) -> tuple[float, float]:
    """The minimum of loss ~ quadratic(x, y) over `points` (scaled by sx, sy), kept within their box; the
    best point where the surface has no minimum."""
    p = np.asarray(points)
    u, v = p[:, 0] / sx, p[:, 1] / sy
    design = np.column_stack([np.ones_like(u), u, v, u * u, u * v, v * v])
    best = p[int(np.argmin(values))]
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    _, b1, b2, a11, a12, a22 = coef
    hess = np.array([[2 * a11, a12], [a12, 2 * a22]])
    if np.linalg.det(hess) <= 0 or hess[0, 0] <= 0:
        return float(best[0]), float(best[1])
    uu, vv = np.linalg.solve(hess, [-b1, -b2])
    x = float(np.clip(uu * sx, p[:, 0].min(), p[:, 0].max()))
    y = float(np.clip(vv * sy, p[:, 1].min(), p[:, 1].max()))
    return x, y


@dataclass(slots=True)
class _Search:
    """One pattern search's result: the estimate, the points near it (and their spacing), the losses."""

    loss: _Losses
    pts: list[tuple[float, float]]
    sx: float
    sy: float
    step_s: float
    per_seq_s: float


def _search(runs: Sequence[Run], replay: Replayer, plan: FitPlan) -> _Search:
    """The coarse grid, then the pattern search and the quadratic surface's minimum."""
    loss = _Losses(runs, replay)
    xs = [g * plan.scale_s for g in plan.step_grid]
    ys = [g * plan.scale_s for g in plan.per_seq_grid]
    best = min(((x, y) for x in xs for y in ys), key=lambda p: loss(*p))
    i, j = xs.index(best[0]), ys.index(best[1])
    dx = (xs[min(i + 1, len(xs) - 1)] - xs[max(i - 1, 0)]) / 4
    dy = (ys[min(j + 1, len(ys) - 1)] - ys[max(j - 1, 0)]) / 4
    near: list[tuple[float, float]] = []
    halvings = moves = 0
    while halvings < plan.rounds and moves < 4 * plan.rounds:  # the spacing halves when the centre stays best
        ring = [(max(best[0] + a * dx, 0.0), max(best[1] + b * dy, 0.0)) for a in (-1, 0, 1) for b in (-1, 0, 1)]
        centre = loss.key(*best)
        best = min(ring, key=lambda p: loss(*p))
        near = ring + near[:9]  # this round's points and the round before's
        if loss.key(*best) == centre:
            dx, dy, halvings = dx / 2, dy / 2, halvings + 1
        else:
            moves += 1
    pts = list(dict.fromkeys(loss.key(x, y) for x, y in near))
    sx, sy = dx * 2, dy * 2
    step_s, per_seq_s = _quadratic_min(pts, np.array([loss.total(k, loss.every) for k in pts]), sx, sy)
    return _Search(loss, pts, sx, sy, step_s, per_seq_s)


def _host_fit(runs: Sequence[Run], found: _Search, plan: FitPlan, prefill: tuple[float, float, tuple[tuple[float, float], ...]]
              = (1.0, 0.0, ())) -> HostFit:
    """The estimate with its bootstrap uncertainty (see the module's docstring)."""
    loss, pts, sx, sy = found.loss, found.pts, found.sx, found.sy
    at = loss.key(found.step_s, found.per_seq_s)
    overhead_s = loss.with_overhead(at, loss.every)[1]
    rng = np.random.default_rng(plan.seed)
    draws, overheads = [], []
    for _ in range(plan.bootstrap):
        pick = [rng.choice(e, len(e)) for e in loss.every]
        draws.append(_quadratic_min(pts, np.array([loss.total(k, pick) for k in pts]), sx, sy))
        overheads.append(loss.with_overhead(at, pick)[1])  # (at the estimate's host costs)
    boot = np.asarray(draws)
    res = np.array([sx, sy]) * 2 / math.sqrt(12)  # the last spacing's resolution
    sd = np.sqrt(boot.std(axis=0) ** 2 + res ** 2)
    overhead_sd_s = math.hypot(float(np.std(overheads)), OVERHEAD_STEP_MS / 1e3 / math.sqrt(12))
    return HostFit(found.step_s, found.per_seq_s, float(sd[0]), float(sd[1]), overhead_s, overhead_sd_s,
                   loss(found.step_s, found.per_seq_s),
                   loss.with_overhead(loss.key(0.0, 0.0), loss.every, free=False)[0], len(loss.at),
                   tuple(r.name for r in runs), tuple(map(tuple, boot.tolist())), *prefill)


def fit_host_costs(runs: Sequence[Run], replay: Replayer, plan: FitPlan) -> HostFit:
    """Host step and per-sequence costs that best replay `runs` (see the module's docstring)."""
    if not runs:
        raise SpecError("calibration", "no runs", "needs at least one run to fit on")
    return _host_fit(runs, _search(runs, replay, plan), plan)


# a scale's search: where it starts, the step it moves by, and its bounds
SCALE_START, SCALE_STEP, SCALE_BOUNDS = 1.0, 0.1, (0.4, 2.0)
# the KV blocks scales tried first: a grid, for the loss is not smooth in them (past saturation a block more or
# less moves which requests wait and which are preempted); the prefill scale's is, and is searched downhill
KV_GRID = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1)
# the replay of a run at (prefill scale, KV blocks scale)
ScaledReplayer = Callable[[float, float], Replayer]


@dataclass(frozen=True, slots=True)
class _Scaled:
    """One scale's best fit within it: the host fit's search, and the inner scale chosen (the prefill's, inside a
    KV scale)."""

    search: _Search
    inner: float = 1.0
    inner_sd: float = 0.0
    inner_curve: tuple[tuple[float, float], ...] = ()

    @property
    def loss(self) -> float:
        return self.search.loss(self.search.step_s, self.search.per_seq_s)

    def resampled(self, picks: Sequence[np.ndarray]) -> float:
        f = self.search
        return f.loss.total(f.loss.key(f.step_s, f.per_seq_s), picks)


def _scale_search(fit_at: Callable[[float], _Scaled], plan: FitPlan, grid: Sequence[float] = ()
                  ) -> tuple[float, float, dict[float, _Scaled]]:
    """The scale of lowest loss, each scale tried fitted by `fit_at`: every scale of `grid`, or, without one,
    SCALE_STEP at a time downhill from SCALE_START; then half a step either side of the best, and the vertex
    of a parabola through the best three (to 0.01). Its sd: the vertex's spread over bootstrap resamples of the
    requests (each scale's loss at its own estimate), with the 0.01 resolution added."""
    tried: dict[float, _Scaled] = {}

    def at(scale: float) -> float:
        scale = round(min(max(scale, SCALE_BOUNDS[0]), SCALE_BOUNDS[1]), 6)
        if scale not in tried:
            tried[scale] = fit_at(scale)
        return tried[scale].loss

    for x in grid:
        at(x)
    best = min(tried, key=at) if grid else SCALE_START
    for direction in () if grid else (-1, 1):  # downhill in whichever direction is
        while (SCALE_BOUNDS[0] < best + direction * SCALE_STEP < SCALE_BOUNDS[1]
               and at(best + direction * SCALE_STEP) < at(best)):
            best = round(best + direction * SCALE_STEP, 6)
    for d in (-SCALE_STEP / 2, SCALE_STEP / 2):
        at(best + d)
    order = sorted(tried, key=at)[:3]
    at(round(_parabola_min(order, [at(x) for x in order]), 2))  # the parabola's vertex, tried itself
    chosen = min(tried, key=at)
    every = tried[chosen].search.loss.every
    rng = np.random.default_rng(plan.seed)
    draws = []
    for _ in range(plan.bootstrap):
        picks = [rng.choice(e, len(e)) for e in every]
        draws.append(_parabola_min(order, [tried[x].resampled(picks) for x in order]))
    return chosen, math.hypot(float(np.std(draws)), 0.01 / math.sqrt(12)), tried


def fit_with_scales(runs: Sequence[Run], replay_at: ScaledReplayer, plan: FitPlan, *, prefill: bool = True,
                    kv: bool = False) -> HostFit:
    """The host costs with the scale of the base profile's prefill price (its per-token terms; `prefill`) and
    of the served engine's KV blocks (`kv`) that best replay `runs`. Each scale tried gets fits of its own:
    a host fit from the grid at each prefill scale (a search started at a nearby scale's estimate stops in the
    trade the host costs and the overhead make with the prefill price), and a prefill search at each KV scale.
    The search of each scale and its sd: `_scale_search` (the KV scale's from KV_GRID)."""
    if not runs:
        raise SpecError("calibration", "no runs", "needs at least one run to fit on")
    searches: list[_Search] = []

    def host_at(prefill_scale: float, kv_scale: float) -> _Scaled:
        searches.append(_search(runs, replay_at(prefill_scale, kv_scale), plan))
        return _Scaled(searches[-1])

    def prefill_at(kv_scale: float) -> _Scaled:
        if not prefill:
            return host_at(1.0, kv_scale)
        chosen, sd, tried = _scale_search(lambda x: host_at(x, kv_scale), plan)
        curve = tuple(sorted((x, t.loss) for x, t in tried.items()))
        return _Scaled(tried[chosen].search, chosen, sd, curve)

    if kv:
        kv_scale, kv_sd, kv_tried = _scale_search(prefill_at, plan, KV_GRID)
        best = kv_tried[kv_scale]
        kv_fit = (kv_scale, kv_sd, tuple(sorted((x, t.loss) for x, t in kv_tried.items())))
    else:
        best, kv_fit = prefill_at(1.0), (1.0, 0.0, ())
    unscaled = searches[0].loss  # the base as it is (the first fit: both scales 1): no host costs
    base_loss = unscaled.with_overhead(unscaled.key(0.0, 0.0), unscaled.every, free=False)[0]
    fit = _host_fit(runs, best.search, plan, (best.inner, best.inner_sd, best.inner_curve))
    return replace(fit, base_loss=base_loss, num_replays=sum(len(f.loss.at) for f in searches),
                   kv_scale=kv_fit[0], kv_scale_sd=kv_fit[1], kv_losses=kv_fit[2])


def _parabola_min(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The vertex of the parabola through three points, kept within them; the lowest point when it opens down."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    lowest = float(x[int(np.argmin(y))])
    if len(x) < 3:
        return lowest
    a, b, _ = np.polyfit(x, y, 2)
    if a <= 0:
        return lowest
    return float(np.clip(-b / (2 * a), x.min(), x.max()))


def split_by_rate(runs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """The lower-rate half of the runs (the median's side included) to fit on, and the rest to check."""
    order = sorted(runs, key=lambda r: (r.rate_rps if math.isfinite(r.rate_rps) else 0.0, r.name))
    k = math.ceil(len(order) / 2) if len(order) > 1 else 1
    return order[:k], order[k:]


def run_errors(run: Run, ttft_sim_ms: np.ndarray, tpot_sim_ms: np.ndarray) -> dict[str, float]:
    """Simulated against measured, % difference, of TTFT and TPOT mean, p50 and p90."""
    out = {}
    multi = run.output_len > 1
    for name, meas, sim in (("ttft", run.ttft_ms, ttft_sim_ms), ("tpot", run.tpot_ms[multi], tpot_sim_ms[multi])):
        ok = np.isfinite(sim) & np.isfinite(meas)
        for stat, f in (("mean", np.mean), ("p50", np.median), ("p90", lambda a: np.percentile(a, 90))):
            m, s = float(f(meas[ok])) if ok.any() else math.nan, float(f(sim[ok])) if ok.any() else math.nan
            out[f"{name}_{stat}_err_pct"] = (s - m) / m * 100 if m else math.nan
    return out


def fleet_replayer(build: FleetBuilder, seed: int = 0) -> Replayer:
    """Replays on the engine (and fleet) `build` makes for the host costs asked for; each run's requests are
    made once."""
    specs: dict[int, list[RequestSpec]] = {}

    def replay(run: Run, step_s: float, per_seq_s: float) -> tuple[np.ndarray, np.ndarray]:
        if id(run) not in specs:
            specs[id(run)] = specs_of(run, seed)
        engine, opts = build((step_s, per_seq_s, 0.0))  # (the request overhead is added after: it queues nothing)
        return simulated_times_ms(simulate_records(specs[id(run)], engine, opts))
    return replay


def colocated_builder(base: CostProfile, engine: ModeledEngine) -> FleetBuilder:
    """One simulated engine (`engine`'s limits) priced by `base` with the host costs asked for."""
    return lambda host: (replace(engine, profile=base.with_host_costs(host[0], host[1])),
                         SimOptions(request_overhead_s=host[2]))


def scaled_colocated(base: CostProfile, engine: ModeledEngine) -> ScaledBuilder:
    """`colocated_builder` at a prefill scale (the base's prompts priced that many times) and a KV blocks
    scale (the engine's cache that many times, at least a block)."""
    return lambda prefill, kv: colocated_builder(
        base.with_prefill_scale(prefill), replace(engine, kv_blocks=scaled_kv_blocks(engine.kv_blocks, kv)))


def decode_step_scale_s(base: CostProfile, runs: Sequence[Run]) -> float:
    """A decode step of one request at the runs' median context: the unit of the search grids."""
    ctx = int(np.median(np.concatenate([r.prompt_len + r.output_len // 2 for r in runs])))
    return max(base.step_s(0, 1, ctx, ctx), 1e-6)
