"""Sessions that wait for the server, on the virtual clock: a session's next turn arrives when its previous
turn's answer ended plus its think time (`slobench.run.session_plan`, the live runner's rule), so `--simulate`
offers agent and chat load as a server would see it. `simulate_records` merges these follow-up arrivals with
the open-loop ones; a turn that fails ends its session there as it does live."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

from slobench.run.records import RequestRecord, RequestSpec, with_drawn_ids
from slobench.run.session_plan import SessionPlan

__all__ = ["SimSessions", "mark_session"]


def mark_session(sp: RequestSpec, rec: RequestRecord) -> None:
    """A session turn's record says its session and turn, as the live runner's do."""
    if sp.session_id is not None:
        rec.session_id, rec.turn = sp.session_id, sp.turn


class SimSessions:
    """The follow-up turns waiting for their time, earliest first. `overhead_s`: the simulated request's fixed
    cost after its send, added to every time after it once the run ends (so a turn's end is that much later)."""

    def __init__(self, specs: Sequence[RequestSpec], overhead_s: float) -> None:
        self.plan = SessionPlan(specs)
        self.first = self.plan.first_turns(specs)
        self.overhead_s = overhead_s
        self.heap: list[tuple[float, int, RequestSpec]] = []
        self.sent: dict[int, RequestSpec] = {}  # request id -> the spec as it arrived, until its record ends
        self.estimate: dict[int, float] = {}  # request id -> the precomputed estimate of a follow-up's send

    def next_s(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")

    def pop(self) -> RequestSpec:
        """The earliest follow-up, arriving at its send time."""
        at_s, _, sp = heapq.heappop(self.heap)
        self.estimate[sp.request_id] = sp.arrival_s
        moved = replace(sp, arrival_s=at_s)
        if sp.ids_below is not None:
            with_drawn_ids(moved, (0, sp.ids_below))
        return moved

    def arrived(self, sp: RequestSpec, rec: RequestRecord) -> None:
        mark_session(sp, rec)
        if sp.session_id is not None:
            self.sent[sp.request_id] = sp
            rec.estimated_s = self.estimate.pop(sp.request_id, None)

    def ended(self, rec: RequestRecord) -> None:
        """`rec` is finished (or refused): queue its session's next turn, or end the session."""
        sp = self.sent.pop(rec.request_id, None)
        if sp is None:
            return
        nxt = self.plan.next_turn(sp, rec)
        if nxt is not None:
            follower, at_s = nxt
            shift = self.overhead_s if rec.first_token_s is not None or rec.chunk_times_s else 0.0
            heapq.heappush(self.heap, (at_s + shift, follower.request_id, follower))
