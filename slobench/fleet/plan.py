"""The fleet planner: for each window of a day, the cheapest fleet of prefill (P), decode (D) and co-located
(C) instances that meets the SLO attainment target on that window's traffic, simulated with the engine's
real scheduler (slobench.fleet.simulate, slobench.fleet.disagg); then a plan over the day with a switching
cost and hysteresis (`plan_day`), compared with static fleets and an interpolation planner of NVIDIA
Dynamo's kind (`_dynamo`). Window by window, `search_window` finds the cheapest fleet.

Every evaluation is a pure function of (day recipe, setup, job), run through a `slobench.fleet.plan_pool` pool
(serial, processes or Ray), so every executor gives the same plan for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import SLO
from slobench.errors import SpecError
from slobench.fleet.disagg import DisaggFleet, KVLink
from slobench.fleet.plan_day import DayRecipe, Window
from slobench.fleet.simulate import ModeledEngine, SimOptions, simulate_records
from slobench.run.records import RequestRecord, RequestSpec
from slobench.workload.prompts import token_prompts

__all__ = ["Evaluation", "Fleet", "PlanOptions", "Setup", "evaluate", "fleet_cost_order", "plan_day",
           "search_window", "transition_fleet"]

FLEET_KINDS = ("colocated", "disagg", "mixed")
TARGET_SCOPES = ("window", "day")


@dataclass(frozen=True, slots=True, order=True)
class Fleet:
    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        for name in ("colocated", "prefill", "decode"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(name, v, "must be an integer >= 0")

    @property
    def total(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def is_servable(self) -> bool:
        """Some instance takes prompts, and prefill instances have decode instances to hand to."""
        return (self.prefill == 0) == (self.decode == 0) and self.prefill + self.colocated > 0

    @property
    def num_kinds(self) -> int:
        return (self.colocated > 0) + (self.prefill > 0)

    def label(self) -> str:
        parts = [f"{n}{k}" for n, k in ((self.colocated, "C"), (self.prefill, "P"), (self.decode, "D")) if n]
        return "+".join(parts) or "none"

    def to_dict(self) -> dict[str, int]:
        return {"colocated": self.colocated, "prefill": self.prefill, "decode": self.decode, "instances": self.total}


def transition_fleet(old: Fleet, new: Fleet) -> Fleet:
    """What serves while a change from `old` to `new` is under way: per role, the instances that keep it;
    a prefill pool without a decode pool (or the reverse) cannot serve and is left out."""
    c, p, d = min(old.colocated, new.colocated), min(old.prefill, new.prefill), min(old.decode, new.decode)
    if p == 0 or d == 0:
        p = d = 0
    return Fleet(c, p, d)


def num_switched(old: Fleet, new: Fleet) -> int:
    """Instances of `new` that change role or are added (unavailable for the switching time)."""
    keep = min(old.colocated, new.colocated) + min(old.prefill, new.prefill) + min(old.decode, new.decode)
    return new.total - keep


@dataclass(frozen=True, slots=True)
class Setup:
    """What every evaluation shares."""

    engine: ModeledEngine
    slo: SLO
    link: Any = None  # slobench.fleet.disagg.KVLink; None: free
    bytes_per_token: int = 0
    router: str = "least-outstanding"
    api: str = "completions"
    seed: int = 0
    jitter_sd: float = 0.0  # step-time noise, relative sd (a calibrated profile's, `slobench.fleet.simulate`)
    request_overhead_s: float = 0.0  # each request's fixed cost outside the steps (a calibrated profile's o)


@dataclass(frozen=True, slots=True)
class Evaluation:
    num_requests: int  # counted requests of the sample
    num_met: int
    ttft_p90_s: float
    tpot_p90_s: float
    e2e_p50_s: float = math.nan  # how long a request takes: a sample much shorter than this shows no queue

    @property
    def attainment(self) -> float:
        return self.num_met / self.num_requests if self.num_requests else 1.0

    def meets(self, target: float) -> bool:
        return self.attainment >= target - 1e-12

    def to_dict(self) -> dict[str, Any]:
        return {"attainment": self.attainment, "num_requests": self.num_requests, "num_met": self.num_met,
                "ttft_p90_s": _finite(self.ttft_p90_s), "tpot_p90_s": _finite(self.tpot_p90_s),
                "e2e_p50_s": _finite(self.e2e_p50_s)}


def _finite(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 6)


def simulate_fleet(setup: Setup, specs: Sequence[RequestSpec], fleet: Fleet) -> list[RequestRecord]:
    if not specs:
        return []
    opts = SimOptions(seed=setup.seed, jitter_sd=setup.jitter_sd, api=setup.api, router=setup.router,  # type: ignore[arg-type]
                      request_overhead_s=setup.request_overhead_s)
    if fleet.prefill == 0:
        return simulate_records(specs, setup.engine, replace(opts, replicas=fleet.colocated))
    disagg = DisaggFleet(fleet.prefill, fleet.decode, fleet.colocated, setup.link or KVLink(), setup.bytes_per_token,
                         setup.router)
    return simulate_records(specs, setup.engine, replace(opts, disagg=disagg))


def _judge(setup: Setup, records: Sequence[RequestRecord], counted: set[int], missed: int = 0) -> Evaluation:
    a = RecordArrays.from_records([r for r in records if r.request_id in counted])
    met = setup.slo.meets(a)
    ttft = a.ttft_from_scheduled_s
    ttft90 = float(np.nanquantile(ttft, 0.9)) if len(ttft) and np.isfinite(ttft).any() else math.nan
    tpot90 = float(np.nanquantile(a.tpot_s, 0.9)) if len(a.tpot_s) and np.isfinite(a.tpot_s).any() else math.nan
    e2e50 = float(np.nanquantile(a.e2e_s, 0.5)) if len(a.e2e_s) and np.isfinite(a.e2e_s).any() else math.nan
    return Evaluation(len(met) + missed, int(met.sum()), ttft90, tpot90, e2e50)


def evaluate(setup: Setup, window: Window, fleet: Fleet, previous: Fleet | None = None,
             switch_share: float = 0.0) -> Evaluation:
    """`fleet` on the window's sample. With `previous` (a change) the arrivals of the first `switch_share`
    of the sample are served by `transition_fleet(previous, fleet)`, the rest by `fleet` (its lead-in: the
    requests before them, from the lead-in and the switching part)."""
    counted = window.counted
    ids = {s.request_id for s in counted}
    if not fleet.is_servable:
        raise SpecError("fleet", fleet.label(), "cannot serve: needs a co-located instance or both P and D")
    if previous is None or previous == fleet or switch_share <= 0 or not counted:
        return _judge(setup, simulate_fleet(setup, window.specs, fleet), ids)
    lo, hi = window.sample_span()
    t_switch = lo + min(switch_share, 1.0) * (hi - lo)
    early = [s for s in window.specs if s.arrival_s < t_switch]
    early_ids = ids & {s.request_id for s in early}
    trans = transition_fleet(previous, fleet)
    records: list[RequestRecord] = []
    missed = 0
    if trans.is_servable:
        records += [r for r in simulate_fleet(setup, early, trans) if r.request_id in early_ids]
    else:
        missed = len(early_ids)  # nothing can serve them
    lead_s = window.specs[window.num_lead].arrival_s - window.specs[0].arrival_s
    late = [s for s in window.specs if s.arrival_s >= t_switch - lead_s]
    late_ids = ids - early_ids
    records += [r for r in simulate_fleet(setup, late, fleet) if r.request_id in late_ids]
    return _judge(setup, records, ids, missed)


# ---- the search in one window ----------------------------------------------------------------------------


def fleet_cost_order(fleet: Fleet, ev: Evaluation) -> tuple[int, float, int, Fleet]:
    """How candidates rank: fewer instances, then higher attainment, then fewer role kinds."""
    return (fleet.total, -ev.attainment, fleet.num_kinds, fleet)


@dataclass(slots=True)
class WindowSearch:
    index: int
    evaluations: dict[Fleet, Evaluation] = field(default_factory=dict)
    best: Fleet | None = None  # cheapest that met the target; None: none did up to max_instances
    colocated_min: int | None = None  # fewest co-located instances that met it

    def feasible(self, target: float) -> list[Fleet]:
        ok = [(f, e) for f, e in self.evaluations.items() if e.meets(target)]
        return [f for f, e in sorted(ok, key=lambda fe: fleet_cost_order(*fe))]

    def fallback(self) -> Fleet:
        """Nothing met the target: the fleet with the highest attainment (then the cheapest)."""
        return min(self.evaluations.items(), key=lambda fe: (-fe[1].attainment, fe[0].total, fe[0]))[0]


def search_window(window: Window, evaluate_one: Callable[[Fleet], Evaluation], target: float, *,
                  max_instances: int = 64, kinds: Iterable[str] = ("colocated", "disagg")) -> WindowSearch:
    """The cheapest fleet meeting `target` on one window. Attainment is taken to rise with every count.
    Co-located fleets: C = 1, 2, 4, ... until one meets the target, then bisection. Disaggregated fleets,
    only those cheaper than that: a staircase walk over the (P, D) frontier (P up by one; D down while one
    fewer decode instance still meets it), O(P + D) evaluations instead of P x D. Mixed fleets (C >= 1 beside
    P and D, `mixed`): the same walk for each C. Every evaluation is kept; the window's choice is the
    cheapest fleet that met the target (ties: the higher attainment, then fewer role kinds), which the tests
    check against a brute force."""
    kinds = tuple(kinds)
    out = WindowSearch(window.index)

    def ok(f: Fleet) -> bool:
        if f not in out.evaluations:
            out.evaluations[f] = evaluate_one(f)
        return out.evaluations[f].meets(target)

    best = math.inf
    if "colocated" in kinds:
        lo, hi, c = 0, None, 1  # lo: the most co-located instances known to miss
        while c <= max_instances:
            if ok(Fleet(colocated=c)):
                hi = c
                break
            lo, c = c, c * 2
        if hi is None and lo < max_instances and ok(Fleet(colocated=max_instances)):
            hi = max_instances
        if hi is not None:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if ok(Fleet(colocated=mid)) else (mid, hi)
            out.colocated_min = best = hi
    walks = ([0] if "disagg" in kinds else []) + (list(range(1, max_instances)) if "mixed" in kinds else [])
    for c in walks:
        if c + 2 >= best or c + 2 > max_instances:
            break
        best = min(best, _staircase(ok, c, best, max_instances))
    ok_fleets = out.feasible(target)
    out.best = ok_fleets[0] if ok_fleets else None
    return out


def _staircase(ok: Callable[[Fleet], bool], c: int, best: float, max_instances: int) -> float:
    """The (P, D) frontier with C = c fixed, walked over fleets cheaper than `best`: P up by one, D down while
    a fleet one decode instance smaller still meets the target. Returns the cheapest total found."""
    d = max_instances - c - 1
    p = 1
    while True:
        limit = min(best - 1, max_instances) - c - p  # the most decode instances a cheaper fleet may have
        d = min(d, int(limit) if math.isfinite(limit) else d)
        if d < 1:
            return best
        if ok(Fleet(c, p, d)):
            while d > 1 and ok(Fleet(c, p, d - 1)):
                d -= 1
            best = min(best, c + p + d)
        p += 1


# ---- the interpolation baseline's profiling ----------------------------------------------------------------

PROFILE_PREFILL_INSTANCES = 8  # decode profiling: enough prefill in front that only decoding limits
PROFILE_GRID = tuple(2 ** (k / 3) for k in range(-9, 4))  # rates around the estimate, 26% apart


def profile_run(setup: Setup, kind: str, input_tokens: int, output_tokens: int, rate_rps: float,
                num_requests: int) -> Evaluation:
    """One profiling run of the interpolation baseline: random prompts (no prefix reuse) of fixed lengths,
    Poisson at `rate_rps`. `prefill`: one instance, prompts only (max_tokens 1), judged on TTFT alone;
    `decode`: one decode instance behind PROFILE_PREFILL_INSTANCES prefill ones, judged on the whole SLO (on
    TPOT alone an overloaded decode instance looks fine: its batch is capped, the queue waits before the
    first token, so it shows in TTFT only)."""
    rng = np.random.default_rng([setup.seed, 0x5EED, int(rate_rps * 1e6)])
    times = np.cumsum(rng.exponential(1.0 / rate_rps, num_requests))
    prompts = token_prompts(np.full(num_requests, input_tokens), rng)
    out = 1 if kind == "prefill" else output_tokens
    specs = [RequestSpec(i, float(t), p, input_tokens, out, min_tokens=out) for i, (t, p) in
             enumerate(zip(times.tolist(), prompts, strict=True))]
    if kind == "prefill":
        slo = SLO(ttft_s=setup.slo.ttft_s, target=setup.slo.target, clock=setup.slo.clock)
        fleet = Fleet(colocated=1)
    else:
        slo = setup.slo
        fleet = Fleet(prefill=PROFILE_PREFILL_INSTANCES, decode=1)
    one = replace(setup, slo=slo)
    return _judge(one, simulate_fleet(one, specs, fleet), {s.request_id for s in specs})


def _profile_estimate(setup: Setup, kind: str, isl: int, osl: int) -> float:
    """A first guess of the rate one instance sustains, from the cost profile (the grid spans around it)."""
    prof = setup.engine.cost_profile()
    if kind == "prefill":
        per_req = prof.per_prefill_token_s * isl + prof.step_overhead_s * math.ceil(isl / setup.engine.max_batched_tokens)
        return 1.0 / max(per_req, 1e-9)
    b = setup.engine.max_num_seqs
    step = prof.step_s(0, b, int(b * (isl + osl / 2)))
    return b / max(step, 1e-9) / max(osl, 1)


# ---- the plan over the day ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanOptions:
    switch_s: float = 60.0  # real seconds an instance changing role (or added) is unavailable
    min_saving: int = 1  # a scale-down must save at least this many instances ...
    hold: int = 2  # ... in this many windows in a row
    max_instances: int = 32
    kinds: tuple[str, ...] = ("colocated", "disagg")
    gpus_per_instance: int = 1
    max_candidates: int = 4  # change candidates evaluated with their switch, per window
    baselines: tuple[str, ...] = ("static-colocated", "static-disagg", "dynamo")
    profile_requests: int = 512  # several batches' worth, so a profiling run reaches its steady state
    target_scope: str = "window"  # "window": the target in every window; "day": the day's attainment

    def __post_init__(self) -> None:
        if not (isinstance(self.switch_s, int | float) and math.isfinite(self.switch_s) and self.switch_s >= 0):
            raise SpecError("switch_cost", self.switch_s, "must be a duration >= 0")
        for name in ("min_saving", "hold", "max_instances", "gpus_per_instance", "max_candidates", "profile_requests"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(name.replace("_", "-"), v, "must be an integer >= 1")
        if self.target_scope not in TARGET_SCOPES:
            raise SpecError("target_scope", self.target_scope, f"choose from {', '.join(TARGET_SCOPES)}")
        bad = [k for k in self.kinds if k not in FLEET_KINDS]
        if bad or not self.kinds:
            raise SpecError("fleets", ",".join(self.kinds), f"choose from {', '.join(FLEET_KINDS)}")


Key = tuple[int, Fleet, Fleet | None, float]


class _Evals:
    """Every evaluation made, keyed by (window, fleet, previous fleet or None, switch share); missing ones
    are run through the pool in one batch."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.done: dict[Key, Evaluation] = {}

    def get(self, keys: Sequence[Key]) -> list[Evaluation]:
        todo = list(dict.fromkeys(k for k in keys if k not in self.done))
        for k, ev in zip(todo, self.pool.map([("eval", *k) for k in todo]), strict=True):
            self.done[k] = ev
        return [self.done[k] for k in keys]


def _key(w: int, fleet: Fleet, previous: Fleet | None, share: float) -> Key:
    if previous is None or previous == fleet or share <= 0:
        return (w, fleet, None, 0.0)
    return (w, fleet, previous, share)


def plan_day(pool: Any, windows: Sequence[Window], recipe: DayRecipe, setup: Setup, options: PlanOptions,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Window by window: keep the fleet in place while it meets the target, unless the window's cheapest
    fleet is at least `min_saving` instances cheaper for `hold` windows in a row (scale-down waits:
    hysteresis); when it misses, change at once. A change is evaluated with its cost: every instance that
    changes role, and every added one, is unavailable for `switch_s` (real seconds) from the window's start;
    until then the window's arrivals are served by the instances that keep their role (per role, the smaller
    of old and new; a prefill pool with no decode pool left serves nothing), after it by the new fleet.
    Candidates are tried cheapest first; the first that meets the target with its switch is chosen.

    Baselines, evaluated on the same windows: the best static co-located fleet and the best static
    disaggregated fleet (cheapest meeting the target in every window), and `dynamo` (`_dynamo`)."""
    target = setup.slo.target
    share = min(1.0, options.switch_s / recipe.window_s)
    say = progress or (lambda _: None)
    say(f"searching {len(windows)} windows")
    searches: list[WindowSearch] = pool.map(
        [("search", w.index, target, options.max_instances, options.kinds) for w in windows])
    evals = _Evals(pool)
    for s in searches:
        for f, ev in s.evaluations.items():
            evals.done[(s.index, f, None, 0.0)] = ev
    strategies: dict[str, list[tuple[Fleet, Evaluation, int]]] = {}
    say(f"planning the day ({len(evals.done)} evaluations so far)")
    strategies["planner"] = _plan(windows, searches, evals, options, share, target)
    notes: list[str] = []
    weights = _day_weights(windows, recipe)
    if options.target_scope == "day":
        say(f"trading windows against each other for the day's target ({len(evals.done)} evaluations so far)")
        strategies["planner"] = _plan_for_day(windows, searches, evals, strategies["planner"], share, target,
                                              weights, notes)
    for kind in ("colocated", "disagg"):
        if f"static-{kind}" in options.baselines:
            say(f"the best static {kind} fleet ({len(evals.done)} evaluations so far)")
            rows = _static(windows, searches, evals, options, target, notes, kind)
            if options.target_scope == "day":
                rows = _static_for_day(windows, evals, rows, target, weights, kind)
            strategies[f"static-{kind}"] = rows
    dynamo_profile: dict[str, Any] = {}
    if "dynamo" in options.baselines:
        say(f"the interpolation baseline ({len(evals.done)} evaluations so far)")
        strategies["dynamo"] = _dynamo(pool, windows, evals, setup, options, share, dynamo_profile)
    return _result(windows, searches, strategies, recipe, setup, options, share, dynamo_profile, notes, evals)


def _plan(windows: Sequence[Window], searches: Sequence[WindowSearch], evals: _Evals, options: PlanOptions,
          share: float, target: float) -> list[tuple[Fleet, Evaluation, int]]:
    out: list[tuple[Fleet, Evaluation, int]] = []
    prev: Fleet | None = None
    streak = 0
    for w, s in zip(windows, searches, strict=True):
        feasible = s.feasible(target)
        if prev is None:
            first = s.best or s.fallback()
            out.append((first, evals.get([_key(w.index, first, None, 0)])[0], 0))
            prev = first
            continue
        stay = evals.get([_key(w.index, prev, None, 0)])[0]
        cheaper = [f for f in feasible if f.total <= prev.total - options.min_saving]
        streak = streak + 1 if stay.meets(target) and cheaper else 0
        if stay.meets(target) and streak < options.hold:
            out.append((prev, stay, 0))
            continue
        cands = [f for f in (cheaper if stay.meets(target) else feasible) if f != prev][: options.max_candidates]
        if not cands and not stay.meets(target):
            cands = [s.fallback()] if s.fallback() != prev else []
        tried = evals.get([_key(w.index, f, prev, share) for f in cands])
        pick = next(((f, ev) for f, ev in zip(cands, tried, strict=True) if ev.meets(target)), None)
        if pick is None:
            if stay.meets(target):
                out.append((prev, stay, 0))  # no cheaper fleet survives its own switch: stay
                continue
            pool_ = [(prev, stay), *zip(cands, tried, strict=True)]
            pick = max(pool_, key=lambda fe: (fe[1].attainment, -fe[0].total))
        fleet, ev = pick
        out.append((fleet, ev, num_switched(prev, fleet)))
        streak = 0
        prev = fleet
    return out


def _day_weights(windows: Sequence[Window], recipe: DayRecipe) -> tuple[list[float], list[float]]:
    """Each window's requests in the real day (attainment's weight) and its real hours (GPU-hours' weight)."""
    real_s = [w.duration_s * recipe.compression for w in windows]
    return [w.rate_rps * t for w, t in zip(windows, real_s, strict=True)], [t / 3600 for t in real_s]


def _day_attainment(evs: Sequence[Evaluation], offered: Sequence[float]) -> float:
    total = sum(offered)
    return sum(ev.attainment * n for ev, n in zip(evs, offered, strict=True)) / total if total else 1.0


def _frontier(evaluations: dict[Fleet, Evaluation]) -> list[tuple[Fleet, Evaluation]]:
    """A window's evaluated fleets that no cheaper (or equally cheap) one beats on attainment, cheapest
    first (ties: the cost order's)."""
    out: list[tuple[Fleet, Evaluation]] = []
    for f, ev in sorted(evaluations.items(), key=lambda fe: fleet_cost_order(*fe)):
        if not out or (f.total > out[-1][0].total and ev.attainment > out[-1][1].attainment):
            out.append((f, ev))
    return out


def _plan_for_day(windows: Sequence[Window], searches: Sequence[WindowSearch], evals: _Evals,
                  start: list[tuple[Fleet, Evaluation, int]], share: float, target: float,
                  weights: tuple[list[float], list[float]], notes: list[str]) -> list[tuple[Fleet, Evaluation, int]]:
    """`--target-scope day`: the request-weighted attainment of the whole day must reach the target, not
    each window's. From the per-window plan (`start`), windows are shrunk one step at a time along their
    evaluated (cost, attainment) frontier of the same kind of fleet, always the step that loses the fewest met requests per GPU-hour
    saved, while the day's attainment (without switches) stays at the target. Then every change is
    evaluated with its switching cost; when the day falls short with them, the shortfall is kept as a
    margin and the shrinking redone (four tries, then `start`). The result is never more GPU-hours than `start`, nor below the target where `start` met it."""
    offered, hours = weights
    n = len(windows)
    base = [f for f, _, _ in start]

    def shape(f: Fleet) -> tuple[bool, bool]:
        return f.colocated > 0, f.prefill > 0

    # shrinks keep each window's kind of fleet: a change of role in a shrink (4C -> 2P+1D) would make its
    # instances, and the next window's, serve nothing during the switch
    fronts = [_frontier({f: ev for f, ev in s.evaluations.items() if shape(f) == shape(b)})
              for s, b in zip(searches, base, strict=True)]
    base_plain = evals.get([_key(w.index, f, None, 0) for w, f in zip(windows, base, strict=True)])
    need = target * sum(offered) - 1e-9 * sum(offered)

    def shrink(margin: float) -> list[Fleet]:
        fleets, plain = list(base), list(base_plain)
        met = [ev.attainment * k for ev, k in zip(plain, offered, strict=True)]
        while True:
            best: tuple[float, int, Fleet, Evaluation] | None = None
            slack = sum(met) - need - margin
            for i in range(n):
                lower = [(f, ev) for f, ev in fronts[i] if f.total < fleets[i].total]
                if not lower:
                    continue
                f, ev = lower[-1]  # the next cheaper step of the frontier
                lost = met[i] - ev.attainment * offered[i]
                if lost > slack:
                    continue
                rate = lost / ((fleets[i].total - f.total) * hours[i])
                if best is None or (rate, i) < (best[0], best[1]):
                    best = (rate, i, f, ev)
            if best is None:
                return fleets
            _, i, f, ev = best
            fleets[i], plain[i], met[i] = f, ev, ev.attainment * offered[i]

    def with_switches(fleets: list[Fleet]) -> list[tuple[Fleet, Evaluation, int]]:
        keys = [_key(w.index, f, fleets[i - 1] if i else None, share) for i, (w, f) in enumerate(zip(windows, fleets, strict=True))]
        evs = evals.get(keys)
        return [(f, ev, num_switched(fleets[i - 1], f) if i else 0) for i, (f, ev) in enumerate(zip(fleets, evs, strict=True))]

    # the shrinks are chosen without switches; what the switches then cost the day is kept as a margin and
    # the shrinking redone, a few times
    margin = 0.0
    for _ in range(4):
        rows = with_switches(shrink(margin))
        short = need - sum(ev.attainment * k for (_, ev, _), k in zip(rows, offered, strict=True))
        if short <= 0:
            return rows
        margin += short
    notes.append("day target: every set of shrinks tried missed the day's target once switches were counted; "
                 "the per-window plan is kept")
    return list(start)


def _static_for_day(windows: Sequence[Window], evals: _Evals, per_window: list[tuple[Fleet, Evaluation, int]],
                    target: float, weights: tuple[list[float], list[float]], kind: str) -> list[tuple[Fleet, Evaluation, int]]:
    """`--target-scope day`: the cheapest static fleet of `kind` whose day reaches the target. The one
    meeting it in every window (`per_window`) does; smaller totals are bisected (attainment taken to rise
    with the count, as the search does), each total's fleets (every P:D split for `disagg`) tried on the
    heaviest windows first and dropped once the day cannot reach the target even if the rest all met."""
    offered, _ = weights
    top = per_window[0][0]
    need = target * sum(offered) - 1e-9 * sum(offered)
    order = sorted(range(len(windows)), key=lambda i: -offered[i])  # the heaviest windows decide first

    def passing(total: int) -> Fleet | None:
        cands = [Fleet(colocated=total)] if kind == "colocated" else [Fleet(0, p, total - p) for p in range(1, total)]
        lost = [0.0] * len(cands)
        for chunk in (order[:1], order[1:4], order[4:]):
            alive = [k for k in range(len(cands)) if sum(offered) - lost[k] >= need]
            evs = evals.get([_key(windows[i].index, cands[k], None, 0) for k in alive for i in chunk])
            for j, k in enumerate(alive):
                lost[k] += sum((1 - ev.attainment) * offered[i]
                               for i, ev in zip(chunk, evs[j * len(chunk):(j + 1) * len(chunk)], strict=True))
        ok = [k for k in range(len(cands)) if sum(offered) - lost[k] >= need]
        return cands[min(ok, key=lambda k: (lost[k], k))] if ok else None

    lo, hi, best = (0 if kind == "colocated" else 1), top.total, None  # lo fails (or is impossible), hi passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        f = passing(mid)
        if f is None:
            lo = mid
        else:
            hi, best = mid, f
    if best is None:
        return per_window
    evs = evals.get([_key(w.index, best, None, 0) for w in windows])
    return [(best, ev, 0) for ev in evs]


def _static(windows: Sequence[Window], searches: Sequence[WindowSearch], evals: _Evals, options: PlanOptions,
            target: float, notes: list[str], kind: str) -> list[tuple[Fleet, Evaluation, int]]:
    """The cheapest fleet of one kind that meets the target in every window (none does: the biggest tried)."""
    order = sorted(range(len(windows)), key=lambda i: -(searches[i].best or searches[i].fallback()).total)

    def all_ok(f: Fleet) -> bool:
        if not evals.get([_key(order[0], f, None, 0)])[0].meets(target):  # the hardest window first
            return False
        return all(ev.meets(target) for ev in evals.get([_key(i, f, None, 0) for i in order]))

    chosen: Fleet | None = None
    if kind == "colocated":
        mins = [s.colocated_min for s in searches]
        c = max((m for m in mins if m is not None), default=1) if None not in mins else options.max_instances
        while chosen is None and c <= options.max_instances:
            if all_ok(Fleet(colocated=c)):
                chosen = Fleet(colocated=c)
            c += 1
        fallback = Fleet(colocated=options.max_instances)
    else:
        chosen = _static_disagg(windows, searches, evals, options, target)
        fallback = Fleet(0, options.max_instances // 2, options.max_instances - options.max_instances // 2)
    if chosen is None:
        notes.append(f"no static {kind} fleet up to {options.max_instances} instances met the target in every "
                     f"window; shown: {fallback.label()}")
        chosen = fallback
    evs = evals.get([_key(w.index, chosen, None, 0) for w in windows])
    return [(chosen, ev, 0) for ev in evs]


def _static_disagg(windows: Sequence[Window], searches: Sequence[WindowSearch], evals: _Evals,
                   options: PlanOptions, target: float) -> Fleet | None:
    """The cheapest (P, D) fleet meeting the target in every window. No fleet can be cheaper than the
    hardest window's cheapest, so totals are tried from there up; at each total every split is first run
    on three telling windows (the hardest, the most prefill-heavy, the most decode-heavy) in one batch,
    and the survivors on every window."""
    ratio = [w.stats.get("prefill_decode_ratio", 1.0) for w in windows]
    hard = max(range(len(windows)), key=lambda i: ((searches[i].best or searches[i].fallback()).total, -i))
    probe = list(dict.fromkeys([hard, ratio.index(max(ratio)), ratio.index(min(ratio))]))
    lower = max(2, max((s.best or s.fallback()).total for s in searches))
    for total in range(lower, options.max_instances + 1):
        splits = [Fleet(0, p, total - p) for p in range(1, total)]
        first = evals.get([_key(i, f, None, 0) for f in splits for i in probe])
        alive = [f for k, f in enumerate(splits) if all(ev.meets(target) for ev in first[k * len(probe):(k + 1) * len(probe)])]
        if not alive:
            continue
        rest = [i for i in range(len(windows)) if i not in probe]
        evs = evals.get([_key(i, f, None, 0) for f in alive for i in rest])
        passing = [f for k, f in enumerate(alive) if all(ev.meets(target) for ev in evs[k * len(rest):(k + 1) * len(rest)])]
        if passing:
            return max(passing, key=lambda f: (min(evals.done[_key(i, f, None, 0)].attainment
                                                   for i in range(len(windows))), -f.prefill))
    return None


def _dynamo(pool: Any, windows: Sequence[Window], evals: _Evals, setup: Setup, options: PlanOptions,
            share: float, info: dict[str, Any]) -> list[tuple[Fleet, Evaluation, int]]:
    """The interpolation baseline: prefill and decode throughput per instance profiled once at the day's mean
    input and output lengths with random prompts (no prefix reuse; a prefill instance alone against TTFT, a
    decode instance behind ample prefill against TPOT), then P = ceil(rate x mean input / prefill tokens/s),
    D = ceil(rate x mean output / decode tokens/s) for each window, changed every window with the same
    switching cost."""
    weights = np.array([w.rate_rps * w.duration_s for w in windows])
    isl = int(round(np.average([w.stats["mean_input_tokens"] for w in windows], weights=weights)))
    osl = int(round(np.average([w.stats["mean_output_tokens"] for w in windows], weights=weights)))
    n = options.profile_requests
    tps: dict[str, float] = {}
    for kind in ("prefill", "decode"):
        est = _profile_estimate(setup, kind, max(isl, 1), max(osl, 2))
        ok_rates: list[float] = []
        for _ in range(4):  # the grid again above its top (or below its bottom) while the answer is off it
            rates = [est * g for g in PROFILE_GRID]
            res = pool.map([("profile", kind, max(isl, 1), max(osl, 2), r, n) for r in rates])
            ok_rates += [r for r, ev in zip(rates, res, strict=True) if ev.meets(setup.slo.target)]
            if ok_rates and max(ok_rates) < rates[-1]:
                break
            est = est * PROFILE_GRID[-1] ** 4 if ok_rates else est * PROFILE_GRID[0] ** 1.3
        rate = max(ok_rates) if ok_rates else est * PROFILE_GRID[0]
        tps[kind] = rate * (isl if kind == "prefill" else osl)
    info.update({"mean_input_tokens": isl, "mean_output_tokens": osl, "prefill_tokens_per_s": tps["prefill"],
                 "decode_tokens_per_s": tps["decode"], "profile_requests": n})
    fleets = []
    for w in windows:
        p = max(1, math.ceil(w.rate_rps * w.stats["mean_input_tokens"] / tps["prefill"]))
        d = max(1, math.ceil(w.rate_rps * w.stats["mean_output_tokens"] / tps["decode"]))
        cap = options.max_instances
        fleets.append(Fleet(0, min(p, cap - 1), min(d, cap - min(p, cap - 1))))
    keys = [_key(w.index, f, fleets[i - 1] if i else None, share) for i, (w, f) in enumerate(zip(windows, fleets, strict=True))]
    evs = evals.get(keys)
    return [(f, ev, num_switched(fleets[i - 1], f) if i else 0) for i, (f, ev) in enumerate(zip(fleets, evs, strict=True))]


def _result(windows: Sequence[Window], searches: Sequence[WindowSearch],
            strategies: dict[str, list[tuple[Fleet, Evaluation, int]]], recipe: DayRecipe, setup: Setup,
            options: PlanOptions, share: float, dynamo: dict[str, Any], notes: list[str],
            evals: _Evals) -> dict[str, Any]:
    target = setup.slo.target
    real_s = [w.duration_s * recipe.compression for w in windows]
    offered = [w.rate_rps * t for w, t in zip(windows, real_s, strict=True)]  # requests in the real window
    summary: dict[str, Any] = {}
    for name, rows in strategies.items():
        gpu_s = [f.total * options.gpus_per_instance * t for (f, _, _), t in zip(rows, real_s, strict=True)]
        met = [ev.attainment * n for (_, ev, _), n in zip(rows, offered, strict=True)]
        summary[name] = {
            "gpu_hours": sum(gpu_s) / 3600, "attainment": sum(met) / sum(offered) if sum(offered) else 1.0,
            "goodput_per_gpu_rps": sum(met) / sum(gpu_s) if sum(gpu_s) else 0.0,
            "windows_met": sum(ev.meets(target) for _, ev, _ in rows), "num_windows": len(rows),
            "instances_switched": sum(k for _, _, k in rows),
            "max_instances": max(f.total for f, _, _ in rows),
        }
    base = [n for n in ("static-colocated", "static-disagg") if n in summary]
    if base:
        best = min(base, key=lambda n: (summary[n]["gpu_hours"], n))
        summary["planner"]["vs_best_static"] = {
            "static": best, "gpu_hours_saved": summary[best]["gpu_hours"] - summary["planner"]["gpu_hours"],
            "gpu_hours_saved_share": 1 - summary["planner"]["gpu_hours"] / summary[best]["gpu_hours"],
            "attainment_delta": summary["planner"]["attainment"] - summary[best]["attainment"],
        }
    short = []
    for i, w in enumerate(windows):  # a sample shorter than a few requests' own time cannot show a queue build
        lo, hi = w.sample_span()
        e2e = strategies["planner"][i][1].e2e_p50_s
        if math.isfinite(e2e) and hi - lo < 3 * e2e:
            short.append(f"{i} ({hi - lo:.0f} s sample, median request {e2e:.0f} s)")
    if short:
        notes.append("windows whose sample spans less than 3 median requests (queues may not have built up; "
                     "raise --max-requests): " + ", ".join(short))
    out_windows = []
    for i, w in enumerate(windows):
        s = searches[i]
        out_windows.append({
            "index": w.index, "start_h": w.start_s * recipe.compression / 3600, "hours": real_s[i] / 3600,
            "traffic": {**w.stats, "num_sampled": len(w.counted), "num_lead_in": w.num_lead},
            "search": {"num_evaluated": len(s.evaluations), "cheapest": s.best.to_dict() if s.best else None,
                       "colocated_min": s.colocated_min},
            "strategies": {name: {"fleet": rows[i][0].to_dict(), "label": rows[i][0].label(),
                                  "gpus": rows[i][0].total * options.gpus_per_instance,
                                  "switched": rows[i][2], **rows[i][1].to_dict(),
                                  "meets_target": rows[i][1].meets(target)} for name, rows in strategies.items()},
        })
    return {
        "schema": "slobench.fleet.plan/1",
        "day": {"name": recipe.name, "traces": list(recipe.traces), "rate_rps": recipe.rate_rps, "seed": recipe.seed,
                "compression": recipe.compression, "window_s": recipe.window_s, "num_windows": len(windows),
                "max_requests_per_window": recipe.max_requests, "lead_s": recipe.lead_s},
        "slo": setup.slo.to_dict(),
        "engine": {"profile": setup.engine.cost_profile().name, "kv_blocks": setup.engine.kv_blocks,
                   "max_num_seqs": setup.engine.max_num_seqs, "max_batched_tokens": setup.engine.max_batched_tokens,
                   "max_model_len": setup.engine.max_model_len, "router": setup.router,
                   "kv_link": str(setup.link) if setup.link is not None else "inf,0us",
                   "kv_bytes_per_token": setup.bytes_per_token, "step_jitter_sd": setup.jitter_sd,
                   "request_overhead_s": setup.request_overhead_s},
        "options": {"target_scope": options.target_scope, "switch_s": options.switch_s, "switch_share": share, "min_saving": options.min_saving,
                    "hold": options.hold, "max_instances": options.max_instances, "fleets": list(options.kinds),
                    "gpus_per_instance": options.gpus_per_instance, "max_candidates": options.max_candidates},
        "dynamo_profile": dynamo,
        "strategies": summary,
        "windows": out_windows,
        "notes": notes,
        "num_evaluations": len(evals.done),
    }
