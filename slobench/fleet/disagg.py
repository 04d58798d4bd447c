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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.scheduler import RequestRejected
from reference_engine.sequence import Sequence as Seq
from slobench.errors import SpecError
from slobench.fleet.decode_run import decode_run
from slobench.fleet.fold import add_token, fold_event, fold_run
from slobench.fleet.replica import EngineFactory, JitteredWait, arrive, request_parser, virtual_engine, wake
from slobench.fleet.routing import Router
from slobench.fleet.sim_blocks import SimBlockManager
from slobench.profiles.specs import get_model
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.engine import refusal_error

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


@dataclass(eq=False)
class _Instance:
    index: int
    role: str  # colocated | prefill | decode
    engine: LLMEngine
    clock: VirtualClock
    wait: JitteredWait
    blocks: SimBlockManager  # its engine's
    stuck: bool = False
    num_output_tokens: int = 0
    link_free_s: float = 0.0  # prefill: when its link has sent everything queued
    incoming: deque[_Handoff] = field(default_factory=deque)  # decode: KV waiting for room here
    num_reserved: int = 0  # decode: requests whose KV is in flight to it


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
    source: _Instance
    hold: Seq | None = None  # the prompt's blocks the prefill instance keeps until the bytes have left
    seq: Seq | None = None  # its sequence on the decode instance, once room is reserved
    decode: _Instance | None = None


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
) -> list[RequestRecord]:
    """The records of one virtual-clock run of a disaggregated (or mixed) fleet, in arrival order. A request
    prefilled on a prefill instance (max_tokens=1) then goes through:

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
    prefill, then decode.

    Not modeled: transfers overlapping the prefill layer by layer (the transfer starts when the prefill
    ends), link contention beyond one FIFO per prefill instance, and a decode instance preempting a request
    whose KV is in flight (its blocks are reserved, so it cannot be)."""
    roles = ["colocated"] * fleet.colocated + ["prefill"] * fleet.prefill + ["decode"] * fleet.decode
    insts = [_Instance(k, role, *virtual_engine(fleet.decode_engine if role == "decode" and fleet.decode_engine
                                                else factory, k, seed, jitter_sd))
             for k, role in enumerate(roles)]
    front = [x for x in insts if x.role != "decode"]
    decoders = [x for x in insts if x.role == "decode"]
    front_router = Router(fleet.router, len(front))
    decode_router = Router(fleet.router, len(decoders)) if decoders else None
    parse, ids_checked = request_parser(insts[0].engine, model_name=model_name, api=api)
    link = fleet.link

    specs = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
    records: list[RequestRecord] = []
    # (instance, engine request id) -> (record, its handoff when it is a prefill, token weight)
    owned: dict[tuple[int, int], tuple[RequestRecord, _Handoff | None, int]] = {}
    events: list[tuple[float, int, str, _Handoff]] = []  # (time, order, kind, handoff): ready, sent, landed
    order = 0
    moved_bytes = 0
    num_handoffs = 0

    def push(t: float, kind: str, h: _Handoff) -> None:
        nonlocal order
        heapq.heappush(events, (t, order, kind, h))
        order += 1

    def try_start(d: _Instance, now_s: float) -> None:
        """Start the transfers queued for `d` that it has room for, in FIFO order."""
        nonlocal moved_bytes
        sched = d.engine.scheduler
        bm = sched.block_manager
        while d.incoming:
            h = d.incoming[0]
            if len(sched.running) + d.num_reserved >= sched.config.max_num_seqs:
                return
            seq = d.engine.prefilled_sequence(h.prompt, h.first_token, h.max_tokens, min_tokens=h.min_tokens,
                                              ignore_eos=h.ignore_eos, sampling=h.sampling, stop_check=h.stop_check)
            hits = bm.match_prefix(seq)
            if not bm.can_admit(seq.num_tokens, hits):
                return
            d.incoming.popleft()
            bm.admit(seq, hits)  # blocks for the prompt and the first token, as its scheduler admits
            h.seq, h.decode = seq, d
            d.num_reserved += 1
            num_bytes = (len(h.prompt) - seq.num_computed_tokens) * fleet.bytes_per_token
            moved_bytes += num_bytes
            src = h.source
            start = max(now_s, src.link_free_s)
            src.link_free_s = start + link.send_s(num_bytes)
            push(src.link_free_s, "sent", h)
            push(src.link_free_s + link.latency_s, "landed", h)

    def hold_prompt(inst: _Instance, h: _Handoff) -> None:
        """Keep the prompt's KV on the prefill instance (its blocks were just freed with the request)."""
        bm = inst.blocks
        hold = Seq(-1, h.prompt, 1)
        hits = bm.match_prefix(hold)
        if not bm.can_admit(hold.num_tokens, hits):
            return  # a block it shared is held past its cap elsewhere: nothing to keep
        bm.admit_uncounted(hold, hits)
        h.hold = hold

    def land(h: _Handoff, t: float) -> None:
        d, seq = h.decode, h.seq
        assert d is not None and seq is not None
        wake(d, t)
        d.engine.adopt_prefilled(seq, t, h.cached_tokens)  # the prompt's KV is here; its first token came with it
        d.num_reserved -= 1
        rec = h.rec
        if rec.first_token_s is None:  # (else the prefill instance sent it)
            add_token(rec, t)
        d.num_output_tokens += 1
        owned[(d.index, seq.seq_id)] = (rec, None, h.weight)

    def on_events(inst: _Instance, evs: list[Any]) -> None:
        nonlocal num_handoffs
        for ev in evs:
            rec, h, weight = owned[(inst.index, ev.request_id)]
            if inst.role == "prefill" and h is not None:
                front_router.finished(front.index(inst), weight)
                del owned[(inst.index, ev.request_id)]
                if ev.finish_reason == "stop" or h.max_tokens == 1:  # its only token: no decode needed
                    fold_event(rec, ev)
                    continue
                if ev.num_cached_tokens is not None:
                    rec.cached_tokens = ev.num_cached_tokens
                h.first_token = ev.token_id
                h.cached_tokens = ev.num_cached_tokens
                if fleet.first_token_from == "prefill":
                    add_token(rec, ev.time_s)
                hold_prompt(inst, h)
                num_handoffs += 1
                push(ev.time_s, "ready", h)
                continue
            if fold_event(rec, ev):
                inst.num_output_tokens += 1
            if ev.finish_reason is not None:
                finish(inst, ev.request_id, ev.time_s)

    def finish(inst: _Instance, rid: int, t: float) -> None:
        rec, _, weight = owned.pop((inst.index, rid))
        rec.done_s = t
        if inst.role == "decode":
            assert decode_router is not None
            decode_router.finished(decoders.index(inst), weight)
        else:
            front_router.finished(front.index(inst), weight)

    inf = math.inf
    i, n = 0, len(specs)
    while True:
        busy = [x for x in insts if x.engine.has_work() and not x.stuck]
        t_step = min((x.clock.now_s() for x in busy), default=inf)
        t_arrival = specs[i].arrival_s if i < n else inf
        t_event = events[0][0] if events else inf
        if t_arrival == inf and t_event == inf and t_step == inf:
            if any(x.engine.has_work() or x.incoming for x in insts):
                raise RuntimeError("an instance has work but schedules nothing, and nothing is left to arrive")
            break
        if t_event <= t_step and t_event <= t_arrival:
            t, _, kind, h = heapq.heappop(events)
            if kind == "ready":
                assert decode_router is not None
                k = decode_router.pick(h.prompt)
                decode_router.started(k, h.weight)
                d = decoders[k]
                d.incoming.append(h)
                try_start(d, t)
            elif kind == "sent":
                if h.hold is not None:
                    src = h.source
                    src.engine.scheduler.block_manager.free(h.hold)
                    h.hold = None
                    if src.stuck:  # it may admit now, from this moment on
                        src.clock.advance_to(t)
                        src.stuck = False
            else:
                land(h, t)
            continue
        if t_arrival <= t_step:
            sp = specs[i]
            i += 1
            t = sp.arrival_s
            rec, req = arrive(sp, records, parse)
            if req is None:
                continue
            k = front_router.pick(req.prompt_token_ids)
            inst = front[k]
            wake(inst, t)
            prompt = req.prompt_token_ids
            weight = len(prompt) + req.max_tokens
            stop_check = req.stop_check()
            try:
                if inst.role == "prefill":
                    decoders[0].engine.scheduler.validate(len(prompt), req.max_tokens, req.min_tokens)
                    rid = inst.engine.add_request(prompt, 1, min_tokens=min(req.min_tokens, 1),
                                                  ignore_eos=req.ignore_eos, sampling=req.sampling,
                                                  stop_check=stop_check, ids_checked=ids_checked)
                else:
                    rid = inst.engine.add_request(prompt, req.max_tokens, min_tokens=req.min_tokens,
                                                  ignore_eos=req.ignore_eos, sampling=req.sampling,
                                                  stop_check=stop_check, ids_checked=ids_checked)
            except RequestRejected as e:
                rec.fail("error", refusal_error(str(e)), t)
                continue
            rec.prompt_tokens = len(prompt)
            rec.replica = inst.index
            handoff = None
            if inst.role == "prefill":
                handoff = _Handoff(rec, list(prompt), -1, req.max_tokens, req.min_tokens, req.ignore_eos,
                                   req.sampling, stop_check, weight, None, inst)
            owned[(inst.index, rid)] = (rec, handoff, weight)
            front_router.started(k, weight)
            continue
        inst = min(busy, key=lambda x: (x.clock.now_s(), x.index))
        eng = inst.engine
        # (a finish ends a run: KV handed over from a prefill instance may be waiting for the blocks it frees)
        ran = decode_run(eng, min(t_arrival, t_event), past_finishes=False) if inst.role != "prefill" else None
        if ran is not None:  # a stretch of plain decode steps, taken at once (slobench.fleet.decode_run)
            times = ran.times_s
            index = inst.index
            inst.num_output_tokens += fold_run(ran, lambda sid: owned[(index, sid)][0])  # noqa: B023 (called at once)
            for seq in ran.finished:
                finish(inst, seq.seq_id, times[-1])
        else:
            steps = eng.num_steps
            evs = eng.step()
            if eng.num_steps == steps and not evs:
                inst.stuck = True
            on_events(inst, evs)
        if inst.role == "decode" and inst.incoming:
            try_start(inst, inst.clock.now_s())
    if info is not None:
        info.update({
            **fleet.to_dict(), "replicas": len(insts),
            "requests_per_replica": [*front_router.sent, *(decode_router.sent if decode_router else [])],
            "output_tokens_per_replica": [x.num_output_tokens for x in insts],
            "kv_handoffs": num_handoffs, "kv_bytes_moved": moved_bytes,
        })
    return records
