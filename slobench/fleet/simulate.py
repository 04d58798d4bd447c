"""Whole runs of the reference engine on a virtual clock: the real scheduler and block manager, modeled
step times, no asyncio, no real time. Thousands of requests take about a second.

The loop: inject every request whose scheduled arrival has come (at a step boundary, as the engine's
thread applies requests added while it steps), run one step, and let the step's modeled time pass as an
instant jump of the clock; when idle, jump to the next arrival. Every request is "sent" exactly at its
scheduled time, so the run measures the engine, never a client: sent = scheduled = arrival, TTFT = first
token time - arrival, and each token is one chunk stamped at the end of the step that produced it.

A per-step timing jitter (relative s.d., default 0) multiplies each modeled step time by
max(0.5, 1 + N(0, jitter_sd)), a stand-in for a real machine's noise when testing how often a gate cries
wolf. Everything is deterministic for a seed.

A request's fixed cost outside the steps (`request_overhead_s`, default 0: HTTP in and out, parsing, the
first SSE event) moves every time after the send by itself: TTFT grows by it, TPOT does not. It is the `o`
that `slobench calibrate` fits beside a profile; `calibrated_extras` reads it, and the fitted step-time
noise, from a calibrated profile's provenance, for the CLI to apply unless told otherwise.
"""

from __future__ import annotations

import bisect
import dataclasses
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.block_manager import shared_prefix_blocks
from reference_engine.config import EngineSpec, require_positive_ints
from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.executor.modeled_executor import CostProfile
from reference_engine.protocol import GenerationRequest
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, summarize
from slobench.errors import SpecError
from slobench.experiments.probe import ProbeMeasure, VirtualProbe, probe_jitter_seed
from slobench.fleet.decode_run import decode_run, record_run
from slobench.fleet.disagg import DisaggFleet, simulate_disagg, split_fleet_knobs
from slobench.fleet.routing import Router
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.engine import to_engine_request
from slobench.targets.options import Api

EngineFactory = Callable[[], LLMEngine]
SpecMaker = Callable[[float, int], Sequence[RequestSpec]]


@dataclass(frozen=True, slots=True)
class ModeledEngine:
    """A modeled reference engine to simulate; calling it builds a fresh `LLMEngine`.

    `step_scale` multiplies every cost coefficient (1.15 = every step 15% slower): a regression to gate.
    The executor is the one `reference_engine.server` serves (byte tokenizer, printable token ids), so a
    simulated run and an HTTP run of the same knobs see the same requests and the same step times.
    """

    profile: str | Path | CostProfile = "cpu-tiny"
    kv_blocks: int = 2048
    block_size: int = 16
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    step_scale: float = 1.0
    seed: int = 0
    name: str = "modeled"

    def __post_init__(self) -> None:
        # the CLI's names (kv_blocks, max_batched_tokens), checked before EngineConfig would see them
        require_positive_ints(self, ("kv_blocks", "block_size", "max_num_seqs", "max_batched_tokens", "max_model_len"))
        if isinstance(self.step_scale, bool) or not isinstance(self.step_scale, int | float) or not self.step_scale > 0:
            raise SpecError("step_scale", self.step_scale, "must be a number > 0")

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any]) -> ModeledEngine:
        """From an `EngineSpec`'s fields (`run --simulate`'s knobs); the executor must be the modeled one, and
        the torch executor's knobs are ignored. Sizes left to the builder (None) keep this class's defaults;
        the name is the model's when one is given."""
        spec = EngineSpec.from_knobs(knobs)
        if spec.executor != "modeled":
            raise SpecError("executor", spec.executor, "a virtual-clock run needs the modeled executor")
        given: dict[str, Any] = {"profile": spec.profile, "block_size": spec.block_size, "max_num_seqs": spec.max_num_seqs,
                                 "max_batched_tokens": spec.max_batched_tokens, "seed": spec.seed,
                                 "enable_prefix_caching": spec.enable_prefix_caching}
        if spec.kv_blocks is not None:
            given["kv_blocks"] = spec.kv_blocks
        if spec.max_model_len is not None:
            given["max_model_len"] = spec.max_model_len
        if "model" in knobs:
            given["name"] = spec.model
        return cls(**given)

    def cost_profile(self) -> CostProfile:
        base = self.profile if isinstance(self.profile, CostProfile) else CostProfile.load(self.profile)
        s = self.step_scale
        if s == 1.0:
            return base
        return base.scaled(s)

    def __call__(self) -> LLMEngine:
        from reference_engine.builder import modeled_executor
        from reference_engine.config import EngineConfig

        ex, _ = modeled_executor(self.cost_profile(), block_size=self.block_size, num_blocks=self.kv_blocks,
                                 seed=self.seed)
        cfg = EngineConfig(block_size=self.block_size, num_blocks=self.kv_blocks, max_num_seqs=self.max_num_seqs,
                           max_num_batched_tokens=self.max_batched_tokens, max_model_len=self.max_model_len,
                           enable_prefix_caching=self.enable_prefix_caching)
        return LLMEngine(cfg, ex)


def as_factory(engine: Mapping[str, Any] | EngineFactory) -> EngineFactory:
    return ModeledEngine.from_knobs(engine) if isinstance(engine, Mapping) else engine


@dataclass(frozen=True, slots=True)
class SpeedTrace:
    """How much slower (>1) than its profile the machine ran, from `times_s[i]` (virtual seconds, ascending) to
    the next: a step starting then takes `factors[i]` times its modeled time (before `times_s[0]`, the first
    factor). Read from a served run's step log (benchmarks/speed_drift.py) to ask what the simulation says when
    told the machine's speed as it varied."""

    times_s: tuple[float, ...]
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.factors):
            raise SpecError("speed", len(self.factors), "needs one factor per time, at least one")
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise SpecError("speed", self.times_s, "times must be ascending")
        if not all(isinstance(f, int | float) and 0 < f < float("inf") for f in self.factors):
            raise SpecError("speed", self.factors, "factors must be numbers > 0")

    def at(self, t_s: float) -> float:
        return self.factors[max(bisect.bisect_right(self.times_s, t_s) - 1, 0)]


class _JitteredWait:
    """The engine's `wait_until` on a VirtualClock: jump over the modeled step time, optionally jittered and
    scaled by the machine's speed at the step's start (`SpeedTrace`)."""

    def __init__(self, clock: VirtualClock, jitter_sd: float, seed: int, speed: SpeedTrace | None = None) -> None:
        self.clock = clock
        self.jitter_sd = jitter_sd
        self.rng = np.random.default_rng(seed) if jitter_sd > 0 else None
        self.speed = speed
        self.num_waits = 0

    def __call__(self, t_s: float) -> None:
        self.num_waits += 1
        if self.rng is None and self.speed is None:
            self.clock.advance_to(t_s)
            return
        now = self.clock.now_s()
        dt = t_s - now
        if self.speed is not None:
            dt *= self.speed.at(now)
        if self.rng is not None:
            dt *= max(0.5, 1.0 + self.rng.normal(0.0, self.jitter_sd))
        self.clock.advance_to(now + dt)


def calibrated_extras(profile: CostProfile) -> tuple[float, float]:
    """(request overhead s, step-time noise sd) a calibrated profile's provenance carries
    (`slobench calibrate`: `request_overhead_s`, `step_jitter_sd`); 0 for each it lacks (a bundled or roofline
    profile). A value that is not a finite number >= 0 is a SpecError naming the profile and the field."""
    prov = profile.provenance or {}
    out = []
    for key in ("request_overhead_s", "step_jitter_sd"):
        v = prov.get(key, 0.0)
        if v is None:
            v = 0.0
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise SpecError(f"profile {profile.name}: provenance.{key}", v, "must be a number >= 0")
        out.append(float(v))
    return out[0], out[1]


def _shift_after_send(records: list[RequestRecord], overhead_s: float) -> list[RequestRecord]:
    """Every time after the send moved by the request's fixed cost (first token, each chunk, the end); a
    request the protocol refused at its arrival keeps its times."""
    if overhead_s:
        for r in records:
            if r.first_token_s is None and not r.chunk_times_s:
                continue
            r.first_token_s = None if r.first_token_s is None else r.first_token_s + overhead_s
            r.done_s = None if r.done_s is None else r.done_s + overhead_s
            r.chunk_times_s = [t + overhead_s for t in r.chunk_times_s]
    return records


def _engine_request(sp: RequestSpec, *, model_name: str, tokenizer: Any, max_model_len: int, api: Api,
                    templates: dict[tuple[int, int | None, bool], Any] | None = None) -> Any:
    """`to_engine_request`, with a token-id prompt checked at C speed. The protocol checks ids one by one
    (~0.4 ms for a 1k-token prompt, most of a simulated request); a prompt that passes the quick check
    would pass that one, so the body is parsed with its first id standing for it and the prompt put back.
    A prompt slobench.workload drew from a range within the vocabulary (`RequestSpec.ids_below`) passes
    without a look at its ids (the quick check alone is ~0.3 ms a 1k-token prompt). Anything else (text, a
    doubtful id, a body that overrides the prompt or max_tokens) is parsed whole. With `templates` (one
    dict a run), the parse of a body without extra fields is done once per (max_tokens, min_tokens,
    ignore_eos): the rest of such a body never depends on the prompt, and the request it gives is copied."""
    p = sp.prompt
    keys = {k for k, _ in sp.extra_body} if sp.extra_body else ()
    if (api != "completions" or type(p) is not tuple or not p or "prompt" in keys or "max_tokens" in keys
            or not ((below := sp.ids_below) is not None and below <= tokenizer.vocab_size
                    or set(map(type, p)) <= {int} and min(p) >= 0 and max(p) < tokenizer.vocab_size)):
        return to_engine_request(sp, model_name=model_name, tokenizer=tokenizer, max_model_len=max_model_len,
                                 api=api)
    if templates is not None and not sp.extra_body:
        key = (sp.max_tokens, sp.min_tokens, sp.ignore_eos)
        template = templates.get(key)
        if template is None:
            template = templates[key] = _engine_request(dataclasses.replace(sp, prompt=p[:1]), model_name=model_name,
                                                        tokenizer=tokenizer, max_model_len=max_model_len, api=api)
        req = _copy_request(template)
    else:
        req = to_engine_request(dataclasses.replace(sp, prompt=p[:1]), model_name=model_name, tokenizer=tokenizer,
                                max_model_len=max_model_len, api=api)
    req.prompt_token_ids = p  # the engine copies it
    return req


def _unshared_from(specs: Sequence[RequestSpec], api: Api, block_size: int) -> list[int] | None:
    """Each spec's first block that no other prompt shares (`shared_prefix_blocks`), when every prompt is a
    token-id tuple the engine will see as it is (the completions API passes such a prompt through, and no
    spec's extra body replaces it); None otherwise (text is tokenized at arrival, so its ids are not known
    before the run)."""
    if api != "completions" or not all(type(sp.prompt) is tuple for sp in specs):
        return None
    if any(sp.extra_body and any(k == "prompt" for k, _ in sp.extra_body) for sp in specs):
        return None
    return shared_prefix_blocks([sp.prompt for sp in specs], block_size)  # type: ignore[misc]


_REQUEST_FIELDS = attrgetter(*(f.name for f in dataclasses.fields(GenerationRequest)))


def _copy_request(req: GenerationRequest) -> GenerationRequest:
    """A shallow copy (copy.copy goes through __reduce_ex__ for a slotted class: several times slower)."""
    return GenerationRequest(*_REQUEST_FIELDS(req))


def _arrive(sp: RequestSpec, records: list[RequestRecord], parse: Callable[[RequestSpec], Any]) -> tuple[RequestRecord, Any]:
    """A request arriving at its scheduled time: its record (appended to `records`; sent = scheduled) and
    its engine request, parsed by `parse` as the server would; None when the protocol refuses it, which the
    record then says."""
    from reference_engine.protocol import BadRequest

    t = sp.arrival_s
    rec = RequestRecord(sp.request_id, t, tag=sp.tag, sent_s=t, input_tokens=sp.input_tokens, max_tokens=sp.max_tokens)
    records.append(rec)
    try:
        return rec, parse(sp)
    except BadRequest as e:
        rec.fail("error", f"rejected: {e.message}", t)
        return rec, None


def _wake(unit: Any, t_s: float) -> None:
    """An idle (or stuck) engine's clock waits for work that comes at `t_s` (`unit`: a replica or instance)."""
    if not unit.engine.has_work() or unit.stuck:
        unit.clock.advance_to(max(unit.clock.now_s(), t_s))
        unit.stuck = False


@dataclass(slots=True)
class _Replica:
    index: int
    engine: LLMEngine
    clock: VirtualClock
    wait: _JitteredWait
    num_output_tokens: int = 0
    stuck: bool = False  # its last step scheduled nothing: only a new arrival can help it


def simulate_records(
    specs: Sequence[RequestSpec],
    engine: Mapping[str, Any] | EngineFactory,
    *,
    seed: int = 0,
    jitter_sd: float = 0.0,
    api: Api = "completions",
    model_name: str = "tiny",
    replicas: int = 1,
    router: str = "least-outstanding",
    fleet: dict[str, Any] | None = None,
    decode_runs: bool = True,
    disagg: DisaggFleet | None = None,
    request_overhead_s: float = 0.0,
    private_blocks: bool = True,
    speed: SpeedTrace | None = None,
) -> list[RequestRecord]:
    """The records of one virtual-clock run, in arrival order. `engine`: knobs or a factory of fresh engines
    (its clock is replaced by the run's VirtualClock; its executor must model step times).

    `replicas` > 1 simulates a fleet of identical engines behind a `router` (slobench.fleet.routing): a discrete-event loop
    over one virtual time, each replica with its own clock (the end of its last step). An arrival is routed
    once every busy replica's clock has reached it; the replica whose clock is earliest steps next. With one
    replica this is exactly the single-engine loop. `fleet`, if given, receives per-replica counts.

    Stretches of plain decode steps are taken at once (`slobench.fleet.decode_run`), leaving every record and
    every engine state as stepping would; `decode_runs=False` steps every step (the reference for tests).
    Token-id prompts are all known before the run, so each request's blocks past what any other prompt
    shares are kept as private blocks (reference_engine.block_manager's doc): the same lookups, counts and
    times with no per-block bookkeeping; `private_blocks=False` keeps every block in full (the reference).

    `disagg` (or knobs naming prefill_replicas/decode_replicas/colocated_replicas/kv_link) simulates a
    disaggregated fleet instead (`slobench.fleet.disagg`); `replicas` must then stay 1.

    `request_overhead_s` (the module's doc) moves every time after the send of each record by itself.
    `speed` scales each step's time by the machine's speed when it starts (`SpeedTrace`; co-located fleets)."""
    o = request_overhead_s
    if isinstance(o, bool) or not isinstance(o, int | float) or not 0 <= o < float("inf"):
        raise SpecError("request_overhead_s", o, "must be a number >= 0 (seconds)")
    if isinstance(engine, Mapping):
        engine, named = split_fleet_knobs(dict(engine), router)
        disagg = disagg or named
    if disagg is not None:
        if speed is not None:
            raise SpecError("speed", "a trace", "applies to co-located replicas, not a disaggregated fleet")
        if replicas != 1:
            raise SpecError("replicas", replicas, "with prefill/decode instances, co-located ones are colocated_replicas")
        return _shift_after_send(simulate_disagg(specs, as_factory(engine), disagg, seed=seed, jitter_sd=jitter_sd,
                                                 api=api, model_name=model_name, info=fleet), o)
    if not (isinstance(jitter_sd, int | float) and jitter_sd >= 0):
        raise SpecError("jitter_sd", jitter_sd, "must be a number >= 0")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 4096:
        raise SpecError("replicas", replicas, "must be an integer from 1 to 4096")
    from reference_engine.scheduler import RequestRejected
    from reference_engine.tokenizer import ByteTokenizer

    factory = as_factory(engine)
    reps: list[_Replica] = []
    for k in range(replicas):
        built = factory()
        clock = VirtualClock()
        # replica 0 keeps the run's own jitter stream, so one replica repeats the single-engine run exactly
        wait = _JitteredWait(clock, float(jitter_sd), seed if k == 0 else zlib.crc32(repr((seed, k)).encode()), speed)
        eng = LLMEngine(built.config, built.executor, clock, wait_until=wait)
        eng.scheduler.block_manager.use_unkeyed_hash()  # no tenant to keep out: the cheaper hash
        reps.append(_Replica(k, eng, clock, wait))
    route = Router(router, replicas)
    first = reps[0].engine
    tokenizer = getattr(first.executor, "tokenizer", None) or ByteTokenizer(first.executor.vocab_size)
    max_model_len = first.config.max_model_len
    # the protocol has checked every id against the tokenizer's vocabulary: the engine need not check again
    ids_checked = first.executor.vocab_size >= tokenizer.vocab_size

    parse = partial(_engine_request, model_name=model_name, tokenizer=tokenizer, max_model_len=max_model_len, api=api,
                    templates={})

    specs = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
    unshared = _unshared_from(specs, api, first.config.block_size) if private_blocks else None
    records: list[RequestRecord] = []
    by_rid: list[dict[int, RequestRecord]] = [{} for _ in reps]  # per replica: engine request id -> record
    weights: dict[tuple[int, int], int] = {}  # the token weight each routed request holds on its replica
    inf = float("inf")
    i, n = 0, len(specs)
    lone = reps[0] if replicas == 1 else None
    while True:
        if lone is not None:  # (the same, without the lists)
            busy = [lone] if not lone.stuck and lone.engine.has_work() else []
            t_step = lone.clock.now_s() if busy else inf
        else:
            busy = [r for r in reps if r.engine.has_work() and not r.stuck]
            t_step = min((r.clock.now_s() for r in busy), default=inf)
        t_arrival = specs[i].arrival_s if i < n else inf
        if t_arrival == inf and t_step == inf:
            if any(r.engine.has_work() for r in reps):
                raise RuntimeError("the engine has work but schedules nothing, and no request is left to arrive")
            break
        if t_arrival <= t_step:
            sp = specs[i]
            i += 1
            t = sp.arrival_s
            rec, req = _arrive(sp, records, parse)
            if req is None:
                continue
            rep = reps[route.pick(req.prompt_token_ids)]
            _wake(rep, t)
            try:
                rid = rep.engine.add_request(req.prompt_token_ids, req.max_tokens, min_tokens=req.min_tokens,
                                             ignore_eos=req.ignore_eos, sampling=req.sampling,
                                             stop_check=req.stop_check(), ids_checked=ids_checked,
                                             unshared_from=None if unshared is None else unshared[i - 1])
            except RequestRejected as e:
                rec.fail("error", f"rejected: {e}", t)
                continue
            rec.prompt_tokens = len(req.prompt_token_ids)
            if replicas > 1:
                rec.replica = rep.index
            weight = len(req.prompt_token_ids) + req.max_tokens
            by_rid[rep.index][rid] = rec
            weights[(rep.index, rid)] = weight
            route.started(rep.index, weight)
            continue
        rep = busy[0] if lone is not None else min(busy, key=lambda r: (r.clock.now_s(), r.index))
        eng = rep.engine
        ran = decode_run(eng, t_arrival) if decode_runs else None
        if ran is not None:  # a stretch of plain decode steps, taken at once (slobench.fleet.decode_run)
            times = ran.times_s
            mine = by_rid[rep.index]
            rep.num_output_tokens += record_run(ran, mine.__getitem__)
            for seq in ran.finished:
                mine[seq.seq_id].done_s = times[-1]
                route.finished(rep.index, weights.pop((rep.index, seq.seq_id)))
            continue
        steps, waits = eng.num_steps, rep.wait.num_waits
        events = eng.step()
        if eng.num_steps > steps and rep.wait.num_waits == waits:
            raise SpecError("executor", type(eng.executor).__name__,
                            "reports no modeled step time: a virtual-clock run needs a modeled executor")
        if eng.num_steps == steps and not events:
            rep.stuck = True  # nothing could be scheduled: only an arrival can help
        for ev in events:
            rec = by_rid[rep.index][ev.request_id]
            if ev.num_cached_tokens is not None:
                rec.cached_tokens = ev.num_cached_tokens
            if ev.token_id is not None:
                if rec.first_token_s is None:
                    rec.first_token_s = ev.time_s
                rec.chunk_times_s.append(ev.time_s)
                rec.chunk_tokens.append(1)
                rec.output_tokens += 1
                rep.num_output_tokens += 1
            if ev.finish_reason is not None:
                rec.done_s = ev.time_s
                route.finished(rep.index, weights.pop((rep.index, ev.request_id)))
    if fleet is not None:
        fleet.update({
            "replicas": replicas, "router": router,
            "requests_per_replica": list(route.sent),
            "output_tokens_per_replica": [r.num_output_tokens for r in reps],
        })
    return _shift_after_send(records, o)


def simulate_run(
    specs: Sequence[RequestSpec],
    engine: Mapping[str, Any] | EngineFactory,
    *,
    slo: SLO | None = None,
    seed: int = 0,
    jitter_sd: float = 0.0,
    api: Api = "completions",
    model_name: str = "tiny",
    intervals: bool = True,
    replicas: int = 1,
    router: str = "least-outstanding",
    disagg: DisaggFleet | None = None,
    request_overhead_s: float = 0.0,
) -> tuple[list[RequestRecord], RunSummary]:
    """One virtual-clock run: its records and its summary (`slobench.analysis.summary.summarize`).

    `intervals=False` leaves out the bootstrap intervals (they cost several times the simulation itself;
    capacity searches decide on replicates instead).
    """
    fleet: dict[str, Any] = {}
    records = simulate_records(specs, engine, seed=seed, jitter_sd=jitter_sd, api=api, model_name=model_name,
                               replicas=replicas, router=router, fleet=fleet, disagg=disagg,
                               request_overhead_s=request_overhead_s)
    summary = summarize(records, slo, seed=seed, intervals=intervals)
    return records, replace(summary, clock="virtual", fleet=fleet if replicas != 1 or "prefill" in fleet else None)


class SimulatedMeasure(ProbeMeasure):
    """`slobench.experiments.capacity`'s `measure(rate_rps, seed) -> summary`, on the virtual clock: a `ProbeMeasure`
    over a `VirtualProbe`.

    `workload`: a WorkloadSpec, a bundled workload name or TOML path, or a `(rate_rps, seed) -> specs`
    callable (e.g. the CLI's trace replay). The jitter stream of each probe is drawn from
    (trial, rate, seed, engine name), so two measures differing only in `trial` see fresh timing noise on
    the same requests. With `out_dir`, each probe is also written as a run directory (records, manifest,
    summary) named as a live probe's is, so gates and reports read simulated probes like real ones.
    """

    def __init__(
        self,
        workload: Any,
        engine: Mapping[str, Any] | EngineFactory,
        slo: SLO,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        input_len: int | None = None,
        output_len: int | None = None,
        api: Api | None = None,
        jitter_sd: float = 0.0,
        trial: int = 0,
        intervals: bool = False,
        out_dir: str | Path | None = None,
        manifest: dict[str, Any] | None = None,
        on_probe: Callable[[float, int, RunSummary], None] | None = None,
        replicas: int = 1,
        router: str = "least-outstanding",
    ) -> None:
        make_specs: SpecMaker
        if callable(workload):
            make_specs = workload
            api_: Api = api or "completions"
        else:
            from slobench.workload import generate, load_workload

            wl = load_workload(workload) if isinstance(workload, str | Path) else workload
            api_ = api or ("chat" if wl.api == "chat" else "completions")

            def make_specs(rate_rps: float, seed: int) -> list[RequestSpec]:
                return generate(wl, rate_rps=rate_rps, num_requests=num_requests, duration_s=duration_s, seed=seed,
                                input_len=input_len, output_len=output_len, api=api_)

        self.trial = trial
        self.jitter_sd = jitter_sd
        probe = VirtualProbe(make_specs, engine, slo=slo, api=api_, jitter_sd=jitter_sd, replicas=replicas,
                             router=router, intervals=intervals, jitter_seed=self.jitter_seed)
        self.factory = probe.factory
        self.name = probe.name
        super().__init__(probe, out_dir=out_dir, manifest=manifest, on_probe=on_probe)

    def jitter_seed(self, rate_rps: float, seed: int) -> int:
        return probe_jitter_seed(rate_rps, seed, self.name, self.trial)

    def manifest_for(self, rate_rps: float, seed: int) -> dict[str, Any]:
        return {**super().manifest_for(rate_rps, seed), "engine": repr(self.factory), "jitter_sd": self.jitter_sd,
                "trial": self.trial}


async def sweep_crossing(
    measure: Callable[[float, int], Any], rates: Sequence[float], seeds: Sequence[int], target: float
) -> tuple[float | None, list[float]]:
    """A dense sweep's crossing of `target`: attainment averaged over `seeds` at each rate, then
    `slobench.experiments.sweep.crossing_rate`. The reference a capacity search is checked against; affordable on the
    virtual clock only."""
    from slobench.analysis.headline import crossing_rate

    means = []
    for r in rates:
        means.append(float(np.mean([(await measure(r, s)).attainment.value for s in seeds])))
    return crossing_rate(list(rates), means, target), means
