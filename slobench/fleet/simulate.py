"""Whole runs of the reference engine on a virtual clock: the real scheduler and block manager, modeled
step times, no asyncio, no real time. Thousands of requests take about a second.

The loop: inject every request whose scheduled arrival has come (at a step boundary, as the engine's
thread applies requests added while it steps), run one step, and let the step's modeled time pass as an
instant jump of the clock; when idle, jump to the next arrival. Every request is "sent" exactly at its
scheduled time, so the run measures the engine, never a client: sent = scheduled = arrival, TTFT = first
token time - arrival, and each token is one chunk stamped at the end of the step that produced it.
Everything is deterministic for a seed; how a run is simulated is a `SimOptions`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.builder import modeled_executor
from reference_engine.config import VLLM_V1, EngineConfig, EngineSpec, check_scheduler, require_positive_ints
from reference_engine.engine import LLMEngine
from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.headline import crossing_rate
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, run_columns, summarize
from slobench.errors import SpecError
from slobench.fleet.decode_run import StandInPrompt, decode_run
from slobench.fleet.disagg import DisaggFleet, simulate_disagg, split_fleet_knobs
from slobench.fleet.engine_limits import EngineLimits
from slobench.fleet.loop import FleetLoop
from slobench.fleet.replica import COLOCATED, EngineFactory, Instance, RecordSink, SpeedTrace, request_parser
from slobench.fleet.routing import ROUTERS, Router
from slobench.fleet.sim_blocks import shared_prefix_blocks
from slobench.fleet.sim_reasoning import split_reasoning
from slobench.fleet.sim_sessions import SimSessions
from slobench.profiles.roofline import vllm_kv_blocks_of
from slobench.run.columnar import RecordBuffer, StepTimes
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.session_plan import SessionPlan
from slobench.targets.options import Api, prompt_api
from slobench.workload.limits import shortened_note

SHORTENED = "shortened"  # the note of requests cut to the engine's context, handed from the run to its summary


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
    scheduler: str = "chunked"  # reference_engine.config.SCHEDULERS

    def __post_init__(self) -> None:
        # the CLI's names (kv_blocks, max_batched_tokens), checked before EngineConfig would see them
        require_positive_ints(self, ("kv_blocks", "block_size", "max_num_seqs", "max_batched_tokens", "max_model_len"))
        if isinstance(self.step_scale, bool) or not isinstance(self.step_scale, int | float) or not self.step_scale > 0:
            raise SpecError("step_scale", self.step_scale, "must be a number > 0")
        check_scheduler(self.scheduler)

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
                                 "enable_prefix_caching": spec.enable_prefix_caching, "scheduler": spec.scheduler}
        if spec.kv_blocks is not None:
            given["kv_blocks"] = spec.kv_blocks
        elif spec.scheduler == VLLM_V1:  # as vLLM sizes its cache: the GPU's memory, when the profile names one
            derived = vllm_kv_blocks_of(CostProfile.load(spec.profile), block_size=spec.block_size,
                                        max_num_batched_tokens=spec.max_batched_tokens, max_num_seqs=spec.max_num_seqs)
            if derived is not None:
                given["kv_blocks"] = derived
        if spec.max_model_len is not None:
            given["max_model_len"] = spec.max_model_len
        if "model" in knobs:
            given["name"] = spec.model
        return cls(**given)

    def cost_profile(self) -> CostProfile:
        base = (self.profile if isinstance(self.profile, CostProfile) else CostProfile.load(self.profile)
                ).under_policy(self.scheduler)
        s = self.step_scale
        if s == 1.0:
            return base
        return base.scaled(s)

    def __call__(self) -> LLMEngine:
        ex, _ = modeled_executor(self.cost_profile(), block_size=self.block_size, num_blocks=self.kv_blocks,
                                 seed=self.seed)
        cfg = EngineConfig(block_size=self.block_size, num_blocks=self.kv_blocks, max_num_seqs=self.max_num_seqs,
                           max_num_batched_tokens=self.max_batched_tokens, max_model_len=self.max_model_len,
                           enable_prefix_caching=self.enable_prefix_caching, scheduler=self.scheduler)
        return LLMEngine(cfg, ex)


def as_factory(engine: Mapping[str, Any] | EngineFactory) -> EngineFactory:
    return ModeledEngine.from_knobs(engine) if isinstance(engine, Mapping) else engine


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
    for r in records:
        if overhead_s:
            _shift_one(r, overhead_s)
        split_reasoning(r)
    return records


def _shift_one(r: RequestRecord, overhead_s: float) -> None:
    if r.first_token_s is None and not r.chunk_times_s:
        return
    r.first_token_s = None if r.first_token_s is None else r.first_token_s + overhead_s
    r.done_s = None if r.done_s is None else r.done_s + overhead_s
    r.chunk_times_s = [t + overhead_s for t in r.chunk_times_s]


class _InOrder:
    """Hands each finished record on in arrival order, as soon as it and every request before it are done
    (a request is done once its `done_s` is set: finished, refused or rejected), so a run streams its
    records out while holding only those still in flight and the finished ones behind them."""

    def __init__(self, emit: Callable[[RequestRecord], None], overhead_s: float) -> None:
        self.emit = emit
        self.overhead_s = overhead_s
        self.waiting: deque[RequestRecord] = deque()

    def append(self, rec: RequestRecord) -> None:
        self.waiting.append(rec)

    def release(self) -> None:
        waiting = self.waiting
        while waiting and waiting[0].done_s is not None:
            rec = waiting.popleft()
            if self.overhead_s:
                _shift_one(rec, self.overhead_s)
            split_reasoning(rec)
            self.emit(rec)


def _in_order(specs: Iterable[RequestSpec]) -> Iterator[RequestSpec]:
    """A stream of requests taken as it comes, which must come in arrival order (ties by request id)."""
    last = (-float("inf"), -1)
    for sp in specs:
        key = (sp.arrival_s, sp.request_id)
        if key < last:
            raise ValueError(f"requests out of arrival order: request {sp.request_id} at {sp.arrival_s} s after "
                             f"request {last[1]} at {last[0]} s")
        last = key
        yield sp


def _streamed(specs: Iterable[RequestSpec], api: Api, block_size: int, stand_ins: bool) -> tuple[
        Iterable[RequestSpec], Callable[[int, RequestSpec], int | None] | None,
        Callable[[int, int], StandInPrompt] | None]:
    """For requests made as they are taken (`FlatSpecs`): (the requests, each one's first block that no other
    prompt shares, the `Sequence.draw_tokens` of a request whose prompt came as stand-ins). One cheap pass over
    the prompts' draws (`TokenPromptDraws.heads`) tells which first blocks are their prompt's own: 0 for
    such a prompt, None (nothing private) for one whose first block another prompt also has; (specs, None,
    None) when the stream cannot tell (see `_unshared_from`). With `stand_ins`, a prompt whose every block
    is private comes in as stand-in ids of its length (one id below the drawn range, which no prompt holds):
    nothing reads them unless its request is preempted, and then its real ids are drawn (`StandInPrompt`);
    building ~1.5k-id tuples a request was a sixth of a simulated chat run."""
    draws_of = getattr(specs, "prompt_draws", None)
    draws = draws_of() if api == "completions" and draws_of is not None else None
    if draws is None:
        return specs, None, None
    heads = draws.heads(block_size)
    seen: dict[bytes, int] = {}
    for h in heads:
        if h is not None:
            seen[h] = seen.get(h, 0) + 1
    own = [h is None or seen[h] == 1 for h in heads]
    del heads, seen

    def unshared(i: int, sp: RequestSpec) -> int | None:  # i: the request's place in the stream
        if type(sp.prompt) is not tuple or sp.extra_body:
            return None
        return 0 if own[i] else None
    if not stand_ins or draws.lo == 0 or draws.prefix:
        return specs, unshared, None
    fake = draws.lo - 1
    prompts = ((fake,) * n if mine else draws.prompt(i)
               for i, (n, mine) in enumerate(zip(draws.lengths().tolist(), own, strict=True)))

    def drawer(i: int, n: int) -> StandInPrompt:  # (n: its length, the drawn prompt's head where it was shortened)
        return StandInPrompt(partial(_head, draws.prompt, i, n))
    return specs.with_prompts(prompts), unshared, drawer  # type: ignore[attr-defined]  # FlatSpecs'


def _head(prompt: Callable[[int], tuple[int, ...]], i: int, n: int) -> tuple[int, ...]:
    return prompt(i)[:n]


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


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How a virtual-clock run is simulated, checked once. `api` and `model_name` shape each request's body as
    the server parses it; `replicas` > 1 co-located engines behind a `router` (slobench.fleet.routing), or a
    disaggregated fleet (`disagg`, slobench.fleet.disagg; `replicas` then stays 1); `speed` scales each step
    by the machine's speed as it varied (co-located fleets). `decode_runs` and `private_blocks` are the fast
    paths (False: the reference the tests compare them with).

    `jitter_sd` (relative s.d., default 0) multiplies each modeled step time by max(0.5, 1 + N(0, jitter_sd)),
    drawn from `seed`: a stand-in for a real machine's noise when testing how often a gate cries wolf.
    `request_overhead_s`, a request's fixed cost outside the steps (HTTP in and out, parsing, the first SSE
    event), moves every time after the send by itself: TTFT grows by it, TPOT does not. It is the `o` that
    `slobench calibrate` fits beside a profile; `calibrated_extras` reads it, and the fitted step-time noise,
    from a calibrated profile's provenance, for the CLI to apply unless told otherwise."""

    seed: int = 0
    jitter_sd: float = 0.0
    api: Api = "completions"
    model_name: str = "tiny"
    replicas: int = 1
    router: str = "least-outstanding"
    disagg: DisaggFleet | None = None
    request_overhead_s: float = 0.0
    speed: SpeedTrace | None = None
    decode_runs: bool = True
    private_blocks: bool = True

    def __post_init__(self) -> None:
        o = self.request_overhead_s
        if isinstance(o, bool) or not isinstance(o, int | float) or not 0 <= o < float("inf"):
            raise SpecError("request_overhead_s", o, "must be a number >= 0 (seconds)")
        if self.disagg is not None:
            if self.speed is not None:
                raise SpecError("speed", "a trace", "applies to co-located replicas, not a disaggregated fleet")
            if self.replicas != 1:
                raise SpecError("replicas", self.replicas,
                                "with prefill/decode instances, co-located ones are colocated_replicas")
        if isinstance(self.jitter_sd, bool) or not (isinstance(self.jitter_sd, int | float) and self.jitter_sd >= 0):
            raise SpecError("jitter_sd", self.jitter_sd, "must be a number >= 0")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or not 1 <= self.replicas <= 4096:
            raise SpecError("replicas", self.replicas, "must be an integer from 1 to 4096")
        if self.router not in ROUTERS:
            raise SpecError("router", self.router, f"must be one of {list(ROUTERS)}")
        if self.api not in ("completions", "chat", "responses"):
            raise SpecError("api", self.api, "must be completions, chat or responses")

    @property
    def parsed_api(self) -> Api:
        """The API the engine parses a request as (a Responses request as chat's)."""
        return prompt_api(self.api)

    @classmethod
    def of(cls, opts: SimOptions | None, knobs: Mapping[str, Any]) -> SimOptions:
        """`opts`, or the options the keywords `knobs` name (an entry point takes either, not both)."""
        if opts is None:
            return cls(**knobs)
        if knobs:
            raise TypeError(f"simulator options given twice: as SimOptions and as {sorted(knobs)}")
        return opts


def simulate_records(
    specs: Iterable[RequestSpec],
    engine: Mapping[str, Any] | EngineFactory,
    opts: SimOptions | None = None,
    *,
    fleet: dict[str, Any] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    step_times: StepTimes | None = None,
    **knobs: Any,
) -> list[RequestRecord]:
    """The records of one virtual-clock run, in arrival order. `engine`: knobs or a factory of fresh engines
    (its clock is replaced by the run's VirtualClock; its executor must model step times). `opts`: how
    (`SimOptions`), or its fields as keywords.

    Replicas: a discrete-event loop over one virtual time, each replica with its own clock (the end of its
    last step). An arrival is routed once every busy replica's clock has reached it; the replica whose clock
    is earliest steps next. With one replica this is exactly the single-engine loop. `fleet`, if given,
    receives per-replica counts. Engine knobs naming prefill_replicas/decode_replicas/colocated_replicas/
    kv_link simulate that disaggregated fleet (`slobench.fleet.disagg`).

    Stretches of plain decode steps are taken at once (`slobench.fleet.decode_run`), leaving every record and
    every engine state as stepping would. Token-id prompts are all known before the run, so each request's
    blocks past what any other prompt shares are kept as private blocks (slobench.fleet.sim_blocks): the same
    lookups, counts and times with no per-block bookkeeping.

    `specs`: a list (sorted here), or requests made as they are taken, in arrival order (`FlatSpecs`, a
    streamed trace), each dropped once it has arrived. `on_record`: each record handed on in arrival order
    as soon as it and every request before it are done, none kept (the list returned is then empty), so
    memory holds the requests in flight, not the run (a prefill/decode fleet hands them all on at its end).
    `step_times`: each replica's step end times are appended to its table there, as its tokens come (not those
    of a prefill/decode fleet).

    Each request is bounded by the engine's `max_model_len` and its chat text sized by the engine's count as a
    live run's are (`slobench.fleet.engine_limits`); how many were shortened goes to `fleet` as a note, which
    `simulate_run` puts in the summary's `notes`."""
    opts = SimOptions.of(opts, knobs)
    if isinstance(engine, Mapping):
        engine, named = split_fleet_knobs(dict(engine), opts.router)
        if named is not None and opts.disagg is None:
            opts = replace(opts, disagg=named)
    seed, jitter_sd, api = opts.seed, opts.jitter_sd, opts.parsed_api
    sessions = None  # sessions that wait for the server: their later turns arrive as earlier ones end
    if isinstance(specs, Sequence) and SessionPlan.waits(specs):
        sessions = SimSessions(specs, opts.request_overhead_s)
        specs = sessions.first
    records: list[RequestRecord] = []
    out = _InOrder(on_record, opts.request_overhead_s) if on_record is not None else None
    sink: RecordSink = out if out is not None else records  # where each record goes when its request arrives
    release = out.release if out is not None else None
    if opts.disagg is not None:
        pools = opts.disagg
        if pools.decode_knobs and pools.decode_engine is None:
            base = as_factory(engine)
            if not isinstance(base, ModeledEngine):
                raise SpecError("decode_knobs", dict(pools.decode_knobs), "replace a ModeledEngine's knobs only")
            pools = replace(pools, decode_engine=replace(base, **dict(pools.decode_knobs)))
        prefill = as_factory(engine)()  # (the prefill pool's engine parses and bounds every request)
        within = EngineLimits(prefill.config.max_model_len,
                              request_parser(prefill, model_name=opts.model_name, api=api)[0], api)
        simulate_disagg(list(specs), as_factory(engine), pools, seed=seed, jitter_sd=jitter_sd, api=api,
                        model_name=opts.model_name, info=fleet, within=within, sink=sink, release=release,
                        decode_runs=opts.decode_runs, sessions=sessions)
        if fleet is not None and within.num_shortened:
            fleet[SHORTENED] = shortened_note(within.num_shortened, prefill.config.max_model_len)
    else:
        _colocated(specs, as_factory(engine), opts, sessions, sink, release, fleet, step_times)
    if out is not None:
        out.release()
        return records
    return _shift_after_send(records, opts.request_overhead_s)


def _colocated(specs: Iterable[RequestSpec], factory: EngineFactory, opts: SimOptions, sessions: SimSessions | None,
               sink: RecordSink, release: Callable[[], None] | None, fleet: dict[str, Any] | None,
               step_times: StepTimes | None) -> None:
    """`simulate_records` of co-located replicas: the fleet loop (`slobench.fleet.loop`) with every replica in
    the co-located role, and the private blocks and stand-in prompts that knowing the prompts allows."""
    api, replicas = opts.parsed_api, opts.replicas
    route = Router(opts.router, replicas)
    reps = [Instance.build(factory, k, COLOCATED, route, k, seed=opts.seed, jitter_sd=opts.jitter_sd, speed=opts.speed)
            for k in range(replicas)]
    first = reps[0].engine
    parse, ids_checked = request_parser(first, model_name=opts.model_name, api=api)
    within = EngineLimits(first.config.max_model_len, parse, api)  # as a live run bounds and sizes its requests
    block_size = first.config.block_size
    unshared_of: Callable[[int, RequestSpec], int | None] | None = None  # (arrival index, request)
    stand_in_of: Callable[[int, int], StandInPrompt] | None = None  # (arrival index, length): a stand-in prompt's
    if isinstance(specs, Sequence):
        ordered = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
        # (a waiting session's prompts are rebuilt as it goes: not known before the run)
        unshared = _unshared_from(ordered, api, block_size) if opts.private_blocks and sessions is None else None
        if unshared is not None:
            unshared_of = lambda i, _sp: unshared[i]  # noqa: E731
        stream: Iterator[RequestSpec] = iter(ordered)
    else:
        if opts.private_blocks:  # (stand-ins where a router does not read the prompts' heads)
            specs, unshared_of, stand_in_of = _streamed(specs, api, block_size, not route.reads_prompts)
        stream = _in_order(specs)
    FleetLoop(reps, route, stream, parse, ids_checked, sink, within=within, sessions=sessions,
              run_decodes=decode_run if opts.decode_runs else None, unshared_of=unshared_of, stand_in_of=stand_in_of,
              step_times=step_times, label_replicas=replicas > 1, release=release, api=api).run()
    if fleet is not None:
        if within.num_shortened:
            fleet[SHORTENED] = shortened_note(within.num_shortened, first.config.max_model_len)
        fleet.update({
            "replicas": replicas, "router": opts.router,
            "requests_per_replica": list(route.sent),
            "output_tokens_per_replica": [r.num_output_tokens for r in reps],
        })

def simulate_run(
    specs: Iterable[RequestSpec],
    engine: Mapping[str, Any] | EngineFactory,
    opts: SimOptions | None = None,
    *,
    slo: SLO | None = None,
    intervals: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    **knobs: Any,
) -> tuple[list[RequestRecord], RunSummary]:
    """One virtual-clock run (`simulate_records`): its records and its summary
    (`slobench.analysis.summary.summarize`, seeded by the run's seed).

    `intervals=False` leaves out the bootstrap intervals (they cost several times the simulation itself;
    capacity searches decide on replicates instead). `on_record`: each record handed on as `simulate_records`
    streams it (to a run directory), none returned; the summary is then made from their columns, gathered as
    they go (`RecordBuffer`: numbers in flat arrays, chunk times as slices of the step times, no record kept).
    """
    opts = SimOptions.of(opts, knobs)
    fleet: dict[str, Any] = {}
    notes: tuple[str, ...] | None = None
    if on_record is None:
        records = simulate_records(specs, engine, opts, fleet=fleet)
        summary = summarize(records, slo, seed=opts.seed, intervals=intervals)
    else:
        # (the summary reads chunk times only, and those as slices of the step times where it can)
        kept = RecordBuffer(tokens=False, steps=StepTimes(opts.request_overhead_s))

        def keep(rec: RequestRecord) -> None:
            on_record(rec)
            kept.add(rec)

        records = simulate_records(specs, engine, opts, fleet=fleet, on_record=keep, step_times=kept.steps)
        # (the buffer is ours to give away: its chunk times are overwritten by the gaps between them)
        summary = summarize(run_columns(kept.columns(), consume=True), slo, seed=opts.seed, intervals=intervals)
    if SHORTENED in fleet:
        notes = (fleet.pop(SHORTENED),)
    return records, replace(summary, clock="virtual", fleet=fleet if opts.replicas != 1 or "prefill" in fleet else None,
                            notes=notes)


async def sweep_crossing(
    measure: Callable[[float, int], Any], rates: Sequence[float], seeds: Sequence[int], target: float
) -> tuple[float | None, list[float]]:
    """A dense sweep's crossing of `target`: attainment averaged over `seeds` at each rate, then
    `slobench.analysis.headline.crossing_rate`. The reference a capacity search is checked against; affordable on the
    virtual clock only."""
    means = []
    for r in rates:
        means.append(float(np.mean([(await measure(r, s)).attainment.value for s in seeds])))
    return crossing_rate(list(rates), means, target), means
