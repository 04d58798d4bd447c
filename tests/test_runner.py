"""Runner tests with an in-process fake target (simulated service time; no network)."""

import asyncio
import json
import os
import signal

import pytest

from slobench.analysis.slo import SLO
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.rundir import load_run
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase


class FakeTarget(TargetBase):
    """Answers after `service_s` with `n` chunks; tracks the peak number in flight."""

    def __init__(self, clock=None, service_s=0.02, fail_ids=(), raise_ids=()):
        self.clock = clock or Clock()
        self.service_s = service_s
        self.fail_ids = set(fail_ids)
        self.raise_ids = set(raise_ids)
        self.in_flight = 0
        self.peak = 0
        self.peak_reached = {}  # n -> Event set once n requests were in flight together

    async def send(self, spec, rec):
        rec.sent_s = self.clock.now_s()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight in self.peak_reached:
            self.peak_reached[self.in_flight].set()
        try:
            if spec.request_id in self.raise_ids:
                raise RuntimeError("bug in target")
            await asyncio.sleep(self.service_s)
            if spec.request_id in self.fail_ids:
                rec.fail("error", "HTTP 500: boom", self.clock.now_s())
                return
            t = self.clock.now_s()
            rec.first_token_s = t
            rec.chunk_times_s = [t, t]
            rec.chunk_tokens = [1, 1]
            rec.output_tokens = 2
            rec.done_s = t
        finally:
            self.in_flight -= 1


def specs(n, gap_s):
    return [RequestSpec(i, i * gap_s, (1, 2, 3), 3, 2) for i in range(n)]


async def test_open_loop_sends_on_schedule_regardless_of_in_flight(tmp_path):
    clock = Clock()
    t = FakeTarget(clock, service_s=0.2)  # 10x the gap: many in flight at once
    res = await run(specs(40, 0.02), t, clock=clock, opts=RunOptions(progress=False), run_dir=tmp_path / "r",
                    manifest={"x": 1})
    assert len(res.records) == 40 and t.peak >= 8
    lates = [r.sent_s - r.scheduled_s for r in res.records]
    # a closed loop would send ~0.2 s late (one service time); 50 ms leaves room for a loaded CI machine
    assert max(lates) < 0.05, max(lates)
    run_back = load_run(tmp_path / "r")
    assert len(run_back.records) == 40 and run_back.summary.num_requests == 40
    assert run_back.manifest["x"] == 1 and "wall_anchor_unix_s" in run_back.manifest["clock"]


async def test_max_in_flight_cap_counts_the_wait():
    clock = Clock()
    t = FakeTarget(clock, service_s=0.05)
    res = await run(specs(10, 0.0), t, clock=clock, opts=RunOptions(max_in_flight=2, progress=False))
    assert t.peak == 2
    queued = sorted(r.queued_s for r in res.records)
    assert queued[-1] > 0.15  # the last waited ~4 service times
    # the wait is not the client's lateness, but it does count in the from-scheduled latency
    assert res.summary.client.lateness_s["p99"] < 0.01
    assert res.summary.ttft_from_scheduled.max > 0.15


async def test_failures_and_target_bugs_become_records():
    clock = Clock()
    t = FakeTarget(clock, service_s=0.001, fail_ids={1}, raise_ids={2})
    res = await run(specs(4, 0.0), t, clock=clock, opts=RunOptions(progress=False), slo=SLO(ttft_s=1.0))
    by_id = {r.request_id: r for r in res.records}
    assert by_id[1].status == "error" and "500" in by_id[1].error
    assert by_id[2].status == "error" and "internal: RuntimeError" in by_id[2].error
    assert res.summary.attainment.value == 0.5


async def test_warmup_excluded_from_summary():
    clock = Clock()
    res = await run(specs(6, 0.0), FakeTarget(clock, 0.001), clock=clock,
                    opts=RunOptions(warmup_requests=2, progress=False))
    assert res.summary.num_requests == 4 and res.summary.num_warmup == 2


async def test_duration_bound_stops_sending():
    clock = Clock()
    res = await run(specs(100, 0.01), FakeTarget(clock, 0.001), clock=clock,
                    opts=RunOptions(duration_s=0.2, progress=False))
    assert 18 <= len(res.records) <= 21


async def test_closed_loop_never_exceeds_users():
    clock = Clock()
    t = FakeTarget(clock, service_s=0.01)
    res = await run(specs(30, 0.0), t, clock=clock, opts=RunOptions(closed_loop_users=3, progress=False))
    assert t.peak == 3 and len(res.records) == 30


async def test_closed_loop_rate_cap():
    clock = Clock()
    t = FakeTarget(clock, service_s=0.001)
    res = await run(specs(20, 0.0), t, clock=clock,
                    opts=RunOptions(closed_loop_users=4, closed_loop_rate_rps=100.0, progress=False))
    sent = sorted(r.sent_s for r in res.records)
    assert (sent[-1] - sent[0]) == pytest.approx(0.19, abs=0.03)


async def test_sigint_stops_sending_and_leaves_valid_run_dir(tmp_path):
    clock = Clock()
    t = FakeTarget(clock, service_s=5.0)  # nothing finishes before the grace runs out
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, os.kill, os.getpid(), signal.SIGINT)
    res = await run(specs(1000, 0.01), t, clock=clock, opts=RunOptions(grace_s=0.1, progress=False),
                    run_dir=tmp_path / "r")
    assert res.interrupted
    assert 20 < len(res.records) < 60
    assert all(r.status == "cancelled" and r.sent_s is not None for r in res.records)
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["interrupted"] is True and s["status_counts"] == {"cancelled": len(res.records)}
    assert len((tmp_path / "r" / "requests.jsonl").read_text().splitlines()) == len(res.records)


async def test_runner_uses_the_targets_clock_across_runs():
    # Regression: a sweep called run() without a clock, so the dispatcher and the target disagreed
    # by the length of the previous run (client "lateness" of 20 s).
    t = FakeTarget(Clock(), service_s=0.001)
    for _ in range(2):
        res = await run(specs(5, 0.05), t, opts=RunOptions(progress=False))
        assert max(r.sent_s - r.scheduled_s for r in res.records) < 0.02
    with pytest.raises(ValueError, match="target's own clock"):
        await run(specs(1, 0.0), t, clock=Clock(), opts=RunOptions(progress=False))


async def test_sigint_after_everything_was_sent_still_stops_after_grace(tmp_path):
    clock = Clock()
    t = FakeTarget(clock, service_s=30.0)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, os.kill, os.getpid(), signal.SIGINT)  # all 5 were sent long before
    t0 = loop.time()
    res = await run(specs(5, 0.01), t, clock=clock, opts=RunOptions(grace_s=0.1, progress=False),
                    run_dir=tmp_path / "r")
    assert loop.time() - t0 < 5
    assert res.interrupted and [r.status for r in res.records] == ["cancelled"] * 5


async def test_cancelled_from_outside_cancels_in_flight_and_keeps_run_dir(tmp_path):
    clock = Clock()
    t = FakeTarget(clock, service_s=30.0)
    t.peak_reached[5] = asyncio.Event()
    task = asyncio.ensure_future(run(specs(5, 0.01), t, clock=clock, opts=RunOptions(progress=False),
                                     run_dir=tmp_path / "r", handle_sigint=False))
    await asyncio.wait_for(t.peak_reached[5].wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert t.in_flight == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["interrupted"] is True and s["status_counts"] == {"cancelled": 5}
