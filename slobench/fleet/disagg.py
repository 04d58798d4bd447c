"""Disaggregated prefill/decode fleets on the virtual clock: P prefill, D decode and C co-located engines.

Every instance is the bundled engine (real scheduler and block manager, modeled step times). A request is
routed on arrival among the instances that take new prompts (co-located and prefill, one router). On a
co-located instance it runs whole, as in `simulate_records`; on a prefill instance its prompt is computed
and its first token sampled, then its KV moves to a decode instance (`simulate_disagg`). Records are
ordinary records, so every metric, report and gate reads them unchanged.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_engine.engine import TokenEvent
from reference_engine.sequence import Sequence as Seq
from slobench.errors import SpecError
from slobench.fleet.decode_run import decode_run
from slobench.fleet.engine_limits import EngineLimits
from slobench.fleet.fold import add_token, fold_event
from slobench.fleet.loop import FleetLoop
from slobench.fleet.replica import (
    COLOCATED,
    DECODE,
    PREFILL,
    EngineFactory,
    Instance,
    RecordSink,
    request_parser,
    wake,
)
from slobench.fleet.routing import Router
from slobench.fleet.sim_sessions import SimSessions
from slobench.profiles.specs import get_model
from slobench.run.records import RequestRecord, RequestSpec

MAX_INSTANCES = 4096
KV_DTYPE_BYTES = 2  # bf16/fp16 KV, as GPU serving stores it

_BANDWIDTH = re.compile(r"^\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmgt]i?)?(b|bit)/s\s*$", re.IGNORECASE)
_LATENCY = re.compile(r"^\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)\s*$", re.IGNORECASE)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # divide: 20 / 1e6 is 2e-05 exactly


@dataclass(frozen=True, slots=True)
class KVLink:
    """The link a prefill instance sends KV over: bytes per second (inf: free) and a latency per transfer."""

    bandwidth_Bps: float = math.inf  # noqa: N815 (bytes, not bits)
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth_Bps, int | float) and self.bandwidth_Bps > 0):
            raise SpecError("kv_link", self.bandwidth_Bps, "bandwidth must be > 0 bytes/s")
        if not (isinstance(self.latency_s, int | float) and 0 <= self.latency_s < math.inf):
            raise SpecError("kv_link", self.latency_s, "latency must be a finite number of seconds >= 0")

    @classmethod
    def parse(cls, text: str) -> KVLink:
        """`50GB/s,20us` (B = bytes, b or bit = bits; k/M/G/T decimal, Ki/Mi/Gi binary), or `inf,0`."""
        parts = text.split(",") if isinstance(text, str) else []
        if len(parts) != 2:
            raise SpecError("kv_link", text, "expected BANDWIDTH,LATENCY, e.g. 50GB/s,20us (or inf,0 for a free link)")
        bw_text, lat_text = (p.strip() for p in parts)
        if bw_text.lower() == "inf":
            bandwidth = math.inf
        else:
            m = _BANDWIDTH.match(bw_text)
            if m is None:
                raise SpecError("kv_link", text, f"bandwidth {bw_text!r} is not like 50GB/s, 400Gbit/s or inf")
            unit = m.group(3)
            bandwidth = float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()] / (8 if unit in ("b", "bit") else 1)
        if lat_text == "0":
            latency = 0.0
        else:
            m = _LATENCY.match(lat_text)
            if m is None:
                raise SpecError("kv_link", text, f"latency {lat_text!r} is not like 20us, 1.5ms or 0")
            latency = float(m.group(1)) / _PER_SECOND[m.group(2).lower()]
        try:
            return cls(bandwidth, latency)
        except SpecError as e:
            raise SpecError("kv_link", text, e.why) from None

    def send_s(self, num_bytes: float) -> float:
        """Time the bytes occupy the link (the latency comes after)."""
        return num_bytes / self.bandwidth_Bps if num_bytes else 0.0

    def __str__(self) -> str:
        bw = "inf" if math.isinf(self.bandwidth_Bps) else f"{self.bandwidth_Bps / 1e9:g}GB/s"
        return f"{bw},{self.latency_s * 1e6:g}us"


def kv_bytes_per_token(model: str, dtype_bytes: int = KV_DTYPE_BYTES) -> int:
    """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype bytes, of a model the
    one vocabulary knows (`slobench.profiles.specs.get_model`: the bundled engine's configs and the
    roofline's models) or a Hugging Face config.json path."""
    try:
        m = get_model(model)
    except SpecError as e:
        raise SpecError("model", model, f"KV bytes per token come from a model config: {e.why}") from None
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class DisaggFleet:
    prefill: int
    decode: int
    colocated: int = 0
    link: KVLink = field(default_factory=KVLink)
    bytes_per_token: int = 0
    router: str = "least-outstanding"  # both pools route with the same policy
    # the decode pool's own engine (another parallelism, profile or limits: prefill TP 2, decode TP 1, say);
    # None: the same engine as the rest of the fleet
    decode_engine: EngineFactory | None = field(default=None, compare=False)
    # when the client sees the first token: "decode" (the decode instance streams every token, once the KV
    # has landed: vLLM's disaggregated connectors) or "prefill" (the prefill instance sends it as the prompt
    # ends: DistServe), the wait for room and the transfer then fall between the first and second tokens
    first_token_from: str = "decode"
    # the decode pool's engine as the rest of the fleet's with these knobs replaced (`--decode-profile`,
    # `--decode-kv-blocks`: profile, kv_blocks), when no `decode_engine` is given
    decode_knobs: tuple[tuple[str, Any], ...] = ()
    # how a decode instance takes handed-off requests (`DECODE_ADMISSIONS`)
    decode_admission: str = "on-room"
    # "distserve": the accepted requests not yet decoding may hold at most this share of the decode KV blocks
    admit_block_frac: float = 0.05

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "colocated"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_INSTANCES:
                raise SpecError(f"{name}_replicas", v, f"must be an integer from 0 to {MAX_INSTANCES}")
        if (self.prefill == 0) != (self.decode == 0):
            raise SpecError("prefill_replicas" if self.prefill == 0 else "decode_replicas", 0,
                            "a disaggregated fleet needs at least one prefill and one decode instance")
        if self.prefill + self.colocated == 0:
            raise SpecError("prefill_replicas", 0, "no instance would take new prompts")
        if isinstance(self.bytes_per_token, bool) or not isinstance(self.bytes_per_token, int) or self.bytes_per_token < 0:
            raise SpecError("kv_bytes_per_token", self.bytes_per_token, "must be an integer >= 0")
        Router(self.router, 1)  # the policy name, checked now
        if self.first_token_from not in ("decode", "prefill"):
            raise SpecError("first_token_from", self.first_token_from, "must be decode or prefill")
        if self.decode_admission not in DECODE_ADMISSIONS:
            raise SpecError("decode_admission", self.decode_admission, f"must be one of {list(DECODE_ADMISSIONS)}")
        if not 0 < self.admit_block_frac <= 1:
            raise SpecError("admit_block_frac", self.admit_block_frac, "must be a share in (0, 1]")
        for k, v in self.decode_knobs:
            if k not in DECODE_KNOBS.values():
                raise SpecError("decode_knobs", k, f"must be among {sorted(DECODE_KNOBS.values())}")
            if k == "kv_blocks" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SpecError("decode_kv_blocks", v, "must be an integer >= 1")

    def to_dict(self) -> dict[str, Any]:
        doc = {"colocated": self.colocated, "prefill": self.prefill, "decode": self.decode,
               "kv_link": str(self.link), "kv_bytes_per_token": self.bytes_per_token, "router": self.router}
        if self.decode_knobs:
            doc["decode_engine"] = {k: str(v) for k, v in self.decode_knobs}
        return doc


# How a decode instance admits handed-off requests:
# - on-room: a transfer starts as soon as the instance has blocks for the prompt and a batch slot, at any
#   moment, without stalling its steps; the request joins at the first step boundary after its KV lands (vLLM's
#   disaggregated connectors, which pull KV beside the forward pass).
# - distserve: DistServe's decoding-stage FCFS scheduler. Requests are accepted only between steps (and
#   while the instance is idle), first come first served, while the accepted requests not yet decoding hold
#   less than `admit_block_frac` of its blocks and the head's prompt fits in the free ones; each accepted
#   request's KV is pulled in turn while the decode loop waits; an accepted request joins the batch at a step
#   start only when the free blocks could hold its prompt and first token once more (its scheduler counts the
#   waiting requests' blocks beside the batch's and the candidate's whole length again), so under KV pressure
#   it waits there, holding its blocks, and the requests behind it wait too.
DECODE_ADMISSIONS = ("on-room", "distserve")

# knob -> the field of the decode pool's engine it replaces
DECODE_KNOBS = {"decode_profile": "profile", "decode_kv_blocks": "kv_blocks"}
FLEET_KNOBS = ("prefill_replicas", "decode_replicas", "colocated_replicas", "kv_link", *DECODE_KNOBS)


def split_fleet_knobs(knobs: dict[str, Any], router: str = "least-outstanding") -> tuple[dict[str, Any], DisaggFleet | None]:
    """Engine knobs without the disaggregated fleet's, and that fleet (None when the knobs name none)."""
    if not any(k in knobs for k in FLEET_KNOBS):
        return knobs, None
    rest = {k: v for k, v in knobs.items() if k not in FLEET_KNOBS}
    link = knobs.get("kv_link") or "inf,0"
    fleet = DisaggFleet(
        prefill=knobs.get("prefill_replicas", 0), decode=knobs.get("decode_replicas", 0),
        colocated=knobs.get("colocated_replicas", 0),
        link=link if isinstance(link, KVLink) else KVLink.parse(link),
        bytes_per_token=kv_bytes_per_token(str(knobs.get("model") or "tiny")), router=router,
        decode_knobs=tuple((field_, knobs[k]) for k, field_ in DECODE_KNOBS.items() if knobs.get(k) is not None),
    )
    return rest, fleet


@dataclass(eq=False, slots=True)
class _Handoff:
    """A request between its prefill and its decode."""

    rec: RequestRecord
    prompt: list[int]
    first_token: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    sampling: Any
    stop_check: Any
    weight: int
    cached_tokens: int | None
    source: Instance
    hold: Seq | None = None  # the prompt's blocks the prefill instance keeps until the bytes have left
    seq: Seq | None = None  # its sequence on the decode instance, once room is reserved
    decode: Instance | None = None


class KVHandoff:
    """The fleet loop's handoff policy for prefill/decode fleets (`slobench.fleet.loop.Handoff`): a request's
    KV goes from its prefill instance to a decode instance, in the three events `simulate_disagg` describes."""

    def __init__(self, fleet: DisaggFleet, decoders: list[Instance], router: Router | None) -> None:
        self.fleet = fleet
        self.link = fleet.link
        self.decoders = decoders
        self.router = router  # picks among the decoders (None: the fleet has none)
        self.events: list[tuple[float, int, str, Any]] = []  # (time, order, kind, handoff or decode instance)
        self.order = 0
        self.moved_bytes = 0
        self.num_handoffs = 0
        self.between_steps = fleet.decode_admission == "distserve"
        # "distserve", by decode instance index: accepted requests not yet in its batch (FIFO), whether a
        # "post" event (its scheduler's pass between steps) is queued, when its last pull lands
        self.accepted: dict[int, deque[_Handoff]] = {d.index: deque() for d in decoders}
        self.post_queued: dict[int, bool] = {d.index: False for d in decoders}
        self.pull_free_s: dict[int, float] = {d.index: 0.0 for d in decoders}

    def next_s(self) -> float:
        return self.events[0][0] if self.events else math.inf

    def is_pending(self) -> bool:
        return any(d.incoming for d in self.decoders) or any(self.accepted.values())

    def check(self, num_prompt_tokens: int, max_tokens: int, min_tokens: int) -> None:
        self.decoders[0].engine.scheduler.validate(num_prompt_tokens, max_tokens, min_tokens)

    def ticket(self, rec: RequestRecord, req: Any, stop_check: Any, weight: int, source: Instance) -> _Handoff:
        return _Handoff(rec, list(req.prompt_token_ids), -1, req.max_tokens, req.min_tokens, req.ignore_eos,
                        req.sampling, stop_check, weight, None, source)

    def _push(self, t: float, kind: str, h: Any) -> None:
        heapq.heappush(self.events, (t, self.order, kind, h))
        self.order += 1

    def prefilled(self, inst: Instance, rec: RequestRecord, h: _Handoff, ev: TokenEvent) -> bool:
        """`rec`'s prompt is in: its handoff queued; True when its only token ended it here."""
        if ev.finish_reason == "stop" or h.max_tokens == 1:  # its only token: no decode needed
            fold_event(rec, ev)
            return True
        if ev.num_cached_tokens is not None:
            rec.cached_tokens = ev.num_cached_tokens
        assert ev.token_id is not None
        h.first_token = ev.token_id
        h.cached_tokens = ev.num_cached_tokens
        if self.fleet.first_token_from == "prefill":
            add_token(rec, ev.time_s)
        self._hold_prompt(inst, h)
        self.num_handoffs += 1
        self._push(ev.time_s, "ready", h)
        return False

    def take_event(self) -> None:
        t, _, kind, h = heapq.heappop(self.events)
        if kind == "ready":
            assert self.router is not None
            k = self.router.pick(h.prompt)
            self.router.started(k, h.weight)
            d = self.decoders[k]
            d.incoming.append(h)
            if self.between_steps:
                self._post_soon(d, t)
            else:
                self._try_start(d, t)
        elif kind == "post":
            self.post_queued[h.index] = False
            self._post(h, t)
        elif kind == "sent":
            if h.hold is not None:
                src = h.source
                src.blocks.free(h.hold)
                h.hold = None
                if src.stuck:  # it may admit now, from this moment on
                    src.clock.advance_to(t)
                    src.stuck = False
        else:
            self._land(h, t)

    def stepped(self, inst: Instance) -> None:
        if inst.role != DECODE:
            return
        if self.between_steps:
            if inst.incoming or self.accepted[inst.index]:
                self._post_soon(inst, inst.clock.now_s())
        elif inst.incoming:
            self._try_start(inst, inst.clock.now_s())

    def _post_soon(self, d: Instance, t: float) -> None:
        """Queue `d`'s pass between steps: at the end of its step under way, or at `t` when it is idle."""
        if self.post_queued[d.index] or d.num_reserved:
            return  # (a pass is due, or the one under way takes what comes while it pulls)
        self.post_queued[d.index] = True
        self._push(max(t, d.clock.now_s()) if d.engine.has_work() else t, "post", d)

    def _post(self, d: Instance, t: float) -> None:
        """DistServe's pass between two decode steps: accept what the rules let in and pull each accepted
        request's KV in turn, the loop waiting (`d` stuck until the last lands: then this pass goes on); once
        nothing more is pulled, the landed requests join the batch while they fit."""
        wake(d, t)
        sched, bm, accepted = d.engine.scheduler, d.blocks, self.accepted[d.index]
        cap = self.fleet.admit_block_frac * bm.num_blocks
        bs = bm.block_size
        waiting_blocks = sum(-(-len(h.prompt) // bs) for h in accepted)
        while d.incoming and waiting_blocks < cap:
            h = d.incoming[0]
            if not self._reserve(d, h):
                break
            accepted.append(h)
            waiting_blocks += -(-len(h.prompt) // bs)
            # one pull at a time, awaited in turn
            self.pull_free_s[d.index] = self._send(h, max(t, self.pull_free_s[d.index]))
        if d.num_reserved:
            d.stuck = True  # its loop awaits the pulls
            return
        running = sched.running  # (every accepted request's KV has landed: none is reserved in flight)
        while accepted and not sched.waiting:  # (a preempted request goes back first)
            h = accepted[0]
            assert h.seq is not None
            if running and (len(running) >= sched.config.max_num_seqs
                            or bm.num_blocks_to_admit(h.seq.num_tokens, []) > bm.num_allocatable):
                break
            accepted.popleft()
            self._join(d, h, t)

    def _try_start(self, d: Instance, now_s: float) -> None:
        """Start the transfers queued for `d` that it has room for, in FIFO order."""
        sched = d.engine.scheduler
        while d.incoming:
            h = d.incoming[0]
            if sched.num_running + d.num_reserved >= sched.config.max_num_seqs or not self._reserve(d, h):
                return
            self._send(h, now_s)

    def _reserve(self, d: Instance, h: _Handoff) -> bool:
        """Blocks on `d` for `h`, the head of its queue (its prompt and first token, prefix hits there counted,
        as its scheduler admits), taken off the queue; False, and nothing taken, when they do not fit."""
        seq = d.engine.prefilled_sequence(h.prompt, h.first_token, h.max_tokens, min_tokens=h.min_tokens,
                                          ignore_eos=h.ignore_eos, sampling=h.sampling, stop_check=h.stop_check)
        hits = d.blocks.match_prefix(seq)
        if not d.blocks.can_admit(seq.num_tokens, hits):
            return False
        d.incoming.popleft()
        d.blocks.admit(seq, hits)
        h.seq, h.decode = seq, d
        d.num_reserved += 1
        return True

    def _send(self, h: _Handoff, not_before_s: float) -> float:
        """`h`'s KV (the bytes not already cached on its decode instance) over its prefill instance's link, in
        FIFO order from `not_before_s`, its "sent" and "landed" events queued; when it lands."""
        assert h.seq is not None
        num_bytes = (len(h.prompt) - h.seq.num_computed_tokens) * self.fleet.bytes_per_token
        self.moved_bytes += num_bytes
        src = h.source
        src.link_free_s = max(not_before_s, src.link_free_s) + self.link.send_s(num_bytes)
        landed = src.link_free_s + self.link.latency_s
        self._push(src.link_free_s, "sent", h)
        self._push(landed, "landed", h)
        return landed

    def _hold_prompt(self, inst: Instance, h: _Handoff) -> None:
        """Keep the prompt's KV on the prefill instance (its blocks were just freed with the request)."""
        bm = inst.blocks
        hold = Seq(-1, h.prompt, 1)
        hits = bm.match_prefix(hold)
        if not bm.can_admit(hold.num_tokens, hits):
            return  # a block it shared is held past its cap elsewhere: nothing to keep
        bm.admit_uncounted(hold, hits)
        h.hold = hold

    def _land(self, h: _Handoff, t: float) -> None:
        d = h.decode
        assert d is not None
        d.num_reserved -= 1
        if self.between_steps:
            if not d.num_reserved:  # the pass that pulled it goes on
                d.stuck = False
                d.clock.advance_to(max(d.clock.now_s(), t))
                self._post(d, t)
            return
        wake(d, t)
        self._join(d, h, t)

    def _join(self, d: Instance, h: _Handoff, t: float) -> None:
        """`h`'s request joins `d`'s running batch at `t`, its KV there."""
        seq = h.seq
        assert seq is not None
        d.engine.adopt_prefilled(seq, t, h.cached_tokens)  # the prompt's KV is here; its first token came with it
        rec = h.rec
        if rec.first_token_s is None:  # (else the prefill instance sent it)
            add_token(rec, t)
        d.num_output_tokens += 1
        d.records[seq.seq_id] = rec
        d.weights[seq.seq_id] = h.weight


def simulate_disagg(
    specs: Sequence[RequestSpec],
    factory: EngineFactory,
    fleet: DisaggFleet,
    *,
    seed: int = 0,
    jitter_sd: float = 0.0,
    api: Any = "completions",
    model_name: str = "tiny",
    info: dict[str, Any] | None = None,
    within: EngineLimits | None = None,
    sink: RecordSink | None = None,
    release: Callable[[], None] | None = None,
    decode_runs: bool = True,
    sessions: SimSessions | None = None,
) -> list[RequestRecord]:
    """The records of one virtual-clock run of a disaggregated (or mixed) fleet, in arrival order (or, given
    a `sink`, each record appended there as its request arrives, none returned; `release` is called before
    each event of the loop). A request prefilled on a prefill instance (max_tokens=1) then goes through:

      1. KV ready (prefill end): a second router picks a decode instance; the request queues there for room.
      2. Transfer start: once the decode instance can hold the request (blocks for its prompt and first
         token, as its scheduler admits, prefix hits there counted; a batch slot), it reserves them; the
         bytes not already cached there, `bytes_per_token` each, leave over the prefill instance's link in
         FIFO order: bytes / bandwidth, then the link's latency. The prefill instance keeps the prompt's
         blocks until the bytes have left (as vLLM's NIXL connector delays freeing them).
      3. KV landed: the request joins the decode instance's running batch at its next step boundary, with its
         prompt's KV written and its first token as the last sampled one, and decodes there to the end.

    The client sees the first token when the KV has landed (TTFT includes the queue for room and the
    transfer), or with `first_token_from` "prefill" as the prefill ends; then a token at the end of every
    decode step that produced one. The decode pool runs `fleet.decode_engine` when one is given. `replica` on a record is the
    instance that took its prompt (co-located or prefill). Instances are numbered co-located first, then
    prefill, then decode. `within`: each request bounded by the engine's limits as it arrives. `sessions`:
    sessions that wait for the server, a later turn arriving once the instance that ends its predecessor does.

    Not modeled: transfers overlapping the prefill layer by layer (the transfer starts when the prefill
    ends), link contention beyond one FIFO per prefill instance, and a decode instance preempting a request
    whose KV is in flight (its blocks are reserved, so it cannot be)."""
    roles = [COLOCATED] * fleet.colocated + [PREFILL] * fleet.prefill + [DECODE] * fleet.decode
    num_front = fleet.colocated + fleet.prefill
    front_router = Router(fleet.router, num_front)
    decode_router = Router(fleet.router, fleet.decode) if fleet.decode else None
    insts = [Instance.build(fleet.decode_engine if role == DECODE and fleet.decode_engine else factory, k, role,
                            decode_router if role == DECODE else front_router,  # type: ignore[arg-type]
                            k - num_front if role == DECODE else k, seed=seed, jitter_sd=jitter_sd)
             for k, role in enumerate(roles)]
    handoff = KVHandoff(fleet, insts[num_front:], decode_router)
    parse, ids_checked = request_parser(insts[0].engine, model_name=model_name, api=api)
    records: list[RequestRecord] = []
    FleetLoop(insts, front_router, iter(sorted(specs, key=lambda s: (s.arrival_s, s.request_id))), parse,
              ids_checked, sink if sink is not None else records, within=within, handoff=handoff, sessions=sessions,
              run_decodes=decode_run if decode_runs else None, label_replicas=True, release=release, api=api).run()
    if info is not None:
        info.update({
            **fleet.to_dict(), "replicas": len(insts),
            "requests_per_replica": [*front_router.sent, *(decode_router.sent if decode_router else [])],
            "output_tokens_per_replica": [x.num_output_tokens for x in insts],
            "kv_handoffs": handoff.num_handoffs, "kv_bytes_moved": handoff.moved_bytes,
        })
    return records
