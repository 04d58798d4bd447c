"""One engine of a simulated fleet: a fresh modeled `LLMEngine` on its own virtual clock, the wait that jumps
that clock over each step (jittered, scaled by the machine's speed), and a request's arrival as the server
would parse it; an `Instance` is such an engine in its role in the fleet loop (`slobench.fleet.loop`), which
`slobench.fleet.simulate` (co-located replicas) and `slobench.fleet.disagg` (prefill and decode pools) run.
"""

from __future__ import annotations

import bisect
import dataclasses
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any, Protocol

import numpy as np

from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.protocol import BadRequest, GenerationRequest
from reference_engine.tokenizer import ByteTokenizer
from slobench.errors import SpecError
from slobench.fleet.routing import Router
from slobench.fleet.sim_blocks import SimBlockManager
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.engine import Api, refusal_error, to_engine_request

EngineFactory = Callable[[], LLMEngine]
RequestParser = Callable[[RequestSpec], Any]


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


class JitteredWait:
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


COLOCATED, PREFILL, DECODE = "colocated", "prefill", "decode"  # an instance's role in its fleet


@dataclass(eq=False, slots=True)
class Instance:
    """One engine of a simulated fleet and what the fleet loop (`slobench.fleet.loop`) keeps about it: its
    role (co-located: whole requests; prefill: prompts, handed off; decode: handed-off requests), the router
    that sends it requests and its place there, and its open requests' records and token weights by engine
    request id."""

    index: int
    role: str
    engine: LLMEngine
    clock: VirtualClock
    wait: JitteredWait
    blocks: SimBlockManager  # its engine's
    router: Router
    slot: int  # its index among the instances `router` picks from
    stuck: bool = False  # its last step scheduled nothing: only a new arrival (or freed blocks) can help it
    num_output_tokens: int = 0
    records: dict[int, RequestRecord] = field(default_factory=dict)
    weights: dict[int, int] = field(default_factory=dict)
    handoffs: dict[int, Any] = field(default_factory=dict)  # prefill: each request's handoff (the fleet's policy)
    link_free_s: float = 0.0  # prefill: when its link has sent everything queued
    incoming: deque[Any] = field(default_factory=deque)  # decode: handoffs waiting for room here
    num_reserved: int = 0  # decode: requests whose KV is in flight to it

    @classmethod
    def build(cls, factory: EngineFactory, index: int, role: str, router: Router, slot: int, *, seed: int,
              jitter_sd: float, speed: SpeedTrace | None = None) -> Instance:
        """A fresh engine from `factory` on its own clock (`virtual_engine`) in `role`, routed to by `router`."""
        return cls(index, role, *virtual_engine(factory, index, seed, jitter_sd, speed), router, slot)


def virtual_engine(factory: EngineFactory, index: int, seed: int, jitter_sd: float,
                   speed: SpeedTrace | None = None) -> tuple[LLMEngine, VirtualClock, JitteredWait, SimBlockManager]:
    """The fleet's engine number `index`: a fresh one from `factory` on its own clock, with the simulator's
    block manager (`SimBlockManager`). Engine 0 keeps the run's own jitter stream, so a fleet of one repeats
    the single-engine run exactly."""
    built = factory()
    clock = VirtualClock()
    wait = JitteredWait(clock, float(jitter_sd), seed if index == 0 else zlib.crc32(repr((seed, index)).encode()), speed)
    cfg = built.config
    blocks = SimBlockManager(cfg.num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching)
    blocks.use_unkeyed_hash()  # no tenant to keep out: the cheaper hash
    return LLMEngine(cfg, built.executor, clock, wait_until=wait, block_manager=blocks), clock, wait, blocks


def request_parser(engine: LLMEngine, *, model_name: str, api: Api) -> tuple[RequestParser, bool]:
    """How a run's requests are parsed (`engine_request`, one template cache a run), and whether the parse
    has already checked every prompt id against the engine's vocabulary (so the engine need not)."""
    tokenizer = getattr(engine.executor, "tokenizer", None) or ByteTokenizer(engine.executor.vocab_size)
    parse = partial(engine_request, model_name=model_name, tokenizer=tokenizer,
                    max_model_len=engine.config.max_model_len, api=api, templates={})
    return parse, engine.executor.vocab_size >= tokenizer.vocab_size


def engine_request(sp: RequestSpec, *, model_name: str, tokenizer: Any, max_model_len: int, api: Api,
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
            template = templates[key] = engine_request(dataclasses.replace(sp, prompt=p[:1]), model_name=model_name,
                                                       tokenizer=tokenizer, max_model_len=max_model_len, api=api)
        req = _copy_request(template)
    else:
        req = to_engine_request(dataclasses.replace(sp, prompt=p[:1]), model_name=model_name, tokenizer=tokenizer,
                                max_model_len=max_model_len, api=api)
    req.prompt_token_ids = p  # the engine copies it
    return req


_REQUEST_FIELDS = attrgetter(*(f.name for f in dataclasses.fields(GenerationRequest)))


def _copy_request(req: GenerationRequest) -> GenerationRequest:
    """A shallow copy (copy.copy goes through __reduce_ex__ for a slotted class: several times slower)."""
    return GenerationRequest(*_REQUEST_FIELDS(req))


class RecordSink(Protocol):
    """Where a run puts each record as its request arrives: a list, or what hands finished ones on."""

    def append(self, rec: RequestRecord, /) -> None: ...


def arrive(sp: RequestSpec, records: RecordSink, parse: RequestParser) -> tuple[RequestRecord, Any]:
    """A request arriving at its scheduled time: its record (appended to `records`; sent = scheduled) and
    its engine request, parsed by `parse` as the server would; None when the protocol refuses it, which the
    record then says."""
    t = sp.arrival_s
    rec = RequestRecord(sp.request_id, t, tag=sp.tag, sent_s=t, input_tokens=sp.input_tokens, max_tokens=sp.max_tokens)
    records.append(rec)
    try:
        return rec, parse(sp)
    except BadRequest as e:
        rec.fail("error", refusal_error(e.message), t)
        return rec, None


def wake(unit: Instance, t_s: float) -> None:
    """An idle (or stuck) engine's clock waits for work that comes at `t_s`."""
    if not unit.engine.has_work() or unit.stuck:
        unit.clock.advance_to(max(unit.clock.now_s(), t_s))
        unit.stuck = False
