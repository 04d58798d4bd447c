"""The one discrete-event loop of every simulated fleet: co-located replicas (`slobench.fleet.simulate`) and
prefill/decode fleets (`slobench.fleet.disagg`) are the same loop over instances in roles, the second with a
handoff policy that moves each prefilled request to a decode instance.

Each instance has its own virtual clock (the end of its last step). The next thing to happen is the earliest
of: a handoff's event (the policy's), an arrival (the open-loop stream's, or a waiting session's next turn),
and the step of the instance whose clock is earliest (ties: the lowest index). An event goes first on a tie,
then an arrival: a request is routed once every busy instance's clock has reached it. A step is a stretch of
plain decode steps taken at once where `decode_run` takes one, else one engine step; what it did is folded
into the records (`slobench.fleet.fold`). With one co-located instance this is exactly the single-engine loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from reference_engine.engine import TokenEvent
from reference_engine.scheduler import RequestRejected
from slobench.errors import SpecError
from slobench.fleet.decode_run import DecodeRun, StandInPrompt
from slobench.fleet.engine_limits import EngineLimits
from slobench.fleet.fold import fold_event, fold_run
from slobench.fleet.replica import PREFILL, Instance, RecordSink, RequestParser, arrive, wake
from slobench.fleet.routing import Router
from slobench.fleet.sim_reasoning import plan_reasoning
from slobench.fleet.sim_sessions import SimSessions, mark_session
from slobench.run.columnar import StepTimes
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.engine import refusal_error

DecodeRunner = Callable[..., DecodeRun | None]  # `slobench.fleet.decode_run.decode_run`'s signature


class Handoff(Protocol):
    """How a fleet with prefill instances moves a prefilled request on (`slobench.fleet.disagg.KVHandoff`)."""

    def next_s(self) -> float:
        """The time of its next event (inf: none)."""

    def take_event(self) -> None:
        """Do its next event."""

    def is_pending(self) -> bool:
        """Whether a request still waits on it with no event to come."""

    def check(self, num_prompt_tokens: int, max_tokens: int, min_tokens: int) -> None:
        """Raise RequestRejected for a request no instance after the prefill could ever run."""

    def ticket(self, rec: RequestRecord, req: Any, stop_check: Any, weight: int, source: Instance) -> Any:
        """What it keeps of a request a prefill instance took."""

    def prefilled(self, inst: Instance, rec: RequestRecord, ticket: Any, ev: TokenEvent) -> bool:
        """The prefill instance `inst` sampled the request's first token (`ev`): True when that ended it."""

    def stepped(self, inst: Instance) -> None:
        """`inst` has taken a step (or a run of them)."""


@dataclass(slots=True)
class FleetLoop:
    """One run's loop: `instances` (co-located and prefill ones routed to by `router`, decode ones by the
    handoff's), its requests (`stream`, in arrival order, and `sessions`' follow-up turns), and where each
    record goes when its request arrives (`sink`; `release` is called before each event, to hand finished
    ones on). `run_decodes`: the decode-run fast path (None: every step is the engine's). `unshared_of` and
    `stand_in_of`: the private blocks and stand-in prompts of a request by its place in the arrivals
    (`slobench.fleet.simulate`). `label_replicas`: each record names the instance that took it."""

    instances: list[Instance]
    router: Router
    stream: Iterator[RequestSpec]
    parse: RequestParser
    ids_checked: bool
    sink: RecordSink
    within: EngineLimits | None = None
    sessions: SimSessions | None = None
    handoff: Handoff | None = None
    run_decodes: DecodeRunner | None = None
    unshared_of: Callable[[int, RequestSpec], int | None] | None = None
    stand_in_of: Callable[[int, int], StandInPrompt] | None = None
    step_times: StepTimes | None = None
    label_replicas: bool = False
    release: Callable[[], None] | None = None
    api: str = "completions"  # the API requests are parsed as: none but completions asks for reasoning

    def run(self) -> None:
        insts, sessions, handoff, release = self.instances, self.sessions, self.handoff, self.release
        run_decodes, took_run, step, arrive_one = self.run_decodes, self._took_run, self._step, self._arrive
        front = [x for x in insts if x.router is self.router]
        stream = self.stream
        # (a finish may send a session's next turn, or free blocks a handoff waits for: a run then stops there)
        past_finishes = sessions is None and handoff is None
        inf = math.inf
        t_event = inf
        upcoming = next(stream, None)
        num_arrived = 0
        lone = insts[0] if len(insts) == 1 else None
        while True:
            if release is not None:
                release()
            if lone is not None:  # (the same, without the lists)
                busy = [lone] if not lone.stuck and lone.engine.has_work() else []
                t_step = lone.clock.now_s() if busy else inf
            else:
                busy = [x for x in insts if x.engine.has_work() and not x.stuck]
                t_step = min((x.clock.now_s() for x in busy), default=inf)
            t_arrival = upcoming.arrival_s if upcoming is not None else inf
            if sessions is not None:
                t_arrival = min(t_arrival, sessions.next_s())
            if handoff is not None:
                t_event = handoff.next_s()
            if t_arrival == inf and t_step == inf and t_event == inf:
                if any(x.engine.has_work() for x in insts) or handoff is not None and handoff.is_pending():
                    raise RuntimeError("an instance has work but schedules nothing, and nothing is left to arrive")
                return
            if t_event <= t_step and t_event <= t_arrival:
                assert handoff is not None
                handoff.take_event()
                continue
            if t_arrival <= t_step:
                if sessions is not None and sessions.next_s() < (upcoming.arrival_s if upcoming is not None else inf):
                    raw = sessions.pop()
                else:
                    assert upcoming is not None
                    raw, upcoming = upcoming, next(stream, None)
                num_arrived += 1
                arrive_one(raw, front, num_arrived - 1)
                continue
            inst = busy[0] if lone is not None else min(busy, key=lambda x: (x.clock.now_s(), x.index))
            ran = None
            if run_decodes is not None and inst.role != PREFILL:
                until = min(t_arrival, t_event)
                ran = (run_decodes(inst.engine, until) if past_finishes
                       else run_decodes(inst.engine, until, past_finishes=False))
            if ran is not None:
                took_run(inst, ran)
            else:
                step(inst)
            if handoff is not None:
                handoff.stepped(inst)

    def _arrive(self, raw: RequestSpec, front: list[Instance], place: int) -> None:
        """`raw` arrives (the `place`-th arrival): its record, its route, its engine request."""
        sessions = self.sessions
        sp = self.within.bound(raw) if self.within is not None else raw
        t = sp.arrival_s
        rec, req = arrive(sp, self.sink, self.parse)
        plan_reasoning(sp, rec, self.api)  # the reasoning/answer split, as live (slobench.fleet.sim_reasoning)
        if sessions is not None:
            sessions.arrived(raw, rec)  # (as planned: its next turn extends the conversation, not the sized text)
        else:
            mark_session(sp, rec)
        if req is None:
            if sessions is not None:
                sessions.ended(rec)
            return
        prompt = req.prompt_token_ids
        inst = front[self.router.pick(prompt)]
        wake(inst, t)
        stop_check = req.stop_check()
        try:
            if inst.role == PREFILL:  # its prompt here, its first token the only one: the rest after the handoff
                assert self.handoff is not None
                self.handoff.check(len(prompt), req.max_tokens, req.min_tokens)
                rid = inst.engine.add_request(prompt, 1, min_tokens=min(req.min_tokens, 1), ignore_eos=req.ignore_eos,
                                              sampling=req.sampling, stop_check=stop_check, ids_checked=self.ids_checked)
            else:
                private = None if self.unshared_of is None else self.unshared_of(place, sp)
                stand_in = (self.stand_in_of(place, sp.input_tokens) if self.stand_in_of is not None and private == 0
                            else None)
                rid = inst.engine.add_request(prompt, req.max_tokens, min_tokens=req.min_tokens,
                                              ignore_eos=req.ignore_eos, sampling=req.sampling, stop_check=stop_check,
                                              ids_checked=self.ids_checked, unshared_from=private, draw_tokens=stand_in)
        except RequestRejected as e:
            rec.fail("error", refusal_error(str(e)), t)
            if sessions is not None:
                sessions.ended(rec)
            return
        rec.prompt_tokens = len(prompt)
        if self.label_replicas:
            rec.replica = inst.index
        weight = len(prompt) + req.max_tokens
        inst.records[rid] = rec
        inst.weights[rid] = weight
        if inst.role == PREFILL:
            assert self.handoff is not None
            inst.handoffs[rid] = self.handoff.ticket(rec, req, stop_check, weight, inst)
        self.router.started(inst.slot, weight)

    def _took_run(self, inst: Instance, ran: DecodeRun) -> None:
        """A stretch of plain decode steps, taken at once (`slobench.fleet.decode_run`), into the records."""
        if self.step_times is not None:
            self.step_times.table(inst.index).extend(ran.times_s)
        records, weights, sessions = inst.records, inst.weights, self.sessions
        inst.num_output_tokens += fold_run(ran, records.__getitem__)
        for seq in ran.finished:
            ended = records.pop(seq.seq_id)
            inst.router.finished(inst.slot, weights.pop(seq.seq_id))
            if sessions is not None:
                sessions.ended(ended)

    def _step(self, inst: Instance) -> None:
        """One engine step, into the records (a prefill instance's first tokens to the handoff)."""
        eng = inst.engine
        steps, waits = eng.num_steps, inst.wait.num_waits
        events = eng.step()
        if eng.num_steps > steps and inst.wait.num_waits == waits:
            raise SpecError("executor", type(eng.executor).__name__,
                            "reports no modeled step time: a virtual-clock run needs a modeled executor")
        if eng.num_steps == steps and not events:
            inst.stuck = True  # nothing could be scheduled: only an arrival (or freed blocks) can help
        records, weights, sessions = inst.records, inst.weights, self.sessions
        if inst.role == PREFILL:
            assert self.handoff is not None
            for ev in events:
                rid = ev.request_id
                inst.router.finished(inst.slot, weights.pop(rid))
                rec = records.pop(rid)
                if self.handoff.prefilled(inst, rec, inst.handoffs.pop(rid), ev) and sessions is not None:
                    sessions.ended(rec)
            return
        table = self.step_times.table(inst.index) if self.step_times is not None else None
        for ev in events:
            rec = records[ev.request_id]
            if fold_event(rec, ev):
                if table is not None and (not table or table[-1] != ev.time_s):
                    table.append(ev.time_s)
                inst.num_output_tokens += 1
            if ev.finish_reason is not None:
                del records[ev.request_id]
                inst.router.finished(inst.slot, weights.pop(ev.request_id))
                if sessions is not None:
                    sessions.ended(rec)
