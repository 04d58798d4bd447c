"""The runner's follow-up hook with a target that answers at once: a session's next turn waits for its
predecessor's end plus its think time, and once the run stops, a turn still waiting for its time is never sent
(the stop does not wait out its think time either)."""

from __future__ import annotations

import asyncio

from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import Dispatcher, RunOptions, run
from slobench.run.session_plan import SessionPlan
from slobench.targets.base import TargetBase


class Instant(TargetBase):
    """Answers every request at once, with its asked length."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.sent: list[RequestSpec] = []

    async def send(self, spec: RequestSpec, rec: RequestRecord) -> None:
        self.sent.append(spec)
        rec.sent_s = rec.first_token_s = rec.done_s = self.clock.now_s()
        rec.chunk_times_s, rec.chunk_tokens, rec.output_tokens = [rec.done_s], [spec.max_tokens], spec.max_tokens


def two_turn_sessions(num: int, think_s: float) -> list[RequestSpec]:
    specs = []
    for s in range(num):
        specs.append(RequestSpec(2 * s, 0.001 * s, (1, 2), 2, 3, session_id=s, turn=0))
        specs.append(RequestSpec(2 * s + 1, 0.001 * s, (1, 2, 5, 6, 7, 9), 6, 3, session_id=s, turn=1,
                                 think_s=think_s))
    return specs


async def test_a_stopping_run_drops_the_turns_still_waiting() -> None:
    clock = Clock()
    target = Instant(clock)
    specs = two_turn_sessions(3, think_s=3600.0)
    plan = SessionPlan(specs)
    disp = Dispatcher(target, clock, RunOptions(progress=False), follow_up=plan.next_turn)
    clock.reset()
    await disp.open_loop(plan.first_turns(specs))
    while len(disp.waiting) < 3:  # the first turns end at once; their follow-ups then wait an hour
        await asyncio.sleep(0)
    await asyncio.wait_for(disp.drain(None), timeout=60)  # drain(None) would wait for every task it left
    assert [sp.turn for sp in target.sent] == [0, 0, 0] and not disp.tasks and len(disp.records) == 3


async def test_a_waiting_run_sends_each_turn_after_the_last_ended() -> None:
    clock = Clock()
    target = Instant(clock)
    res = await run(two_turn_sessions(5, think_s=0.02), target, opts=RunOptions(progress=False), handle_sigint=False)
    by_turn = {(r.session_id, r.turn): r for r in res.records}
    assert len(by_turn) == 10 and res.summary.num_scheduled == 10
    for s in range(5):
        first, second = by_turn[(s, 0)], by_turn[(s, 1)]
        assert second.scheduled_s == first.done_s + 0.02 and second.sent_s >= second.scheduled_s
        assert second.estimated_s == 0.001 * s and first.estimated_s is None
    assert [sp.input_tokens for sp in target.sent if sp.turn == 1] == [6] * 5  # the asked answer length came
