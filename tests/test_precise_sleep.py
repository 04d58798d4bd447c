"""slobench.run.precise_sleep: a timerfd wakes sleepers at (never before) their deadlines, in deadline order,
however they were queued, and a cancelled sleeper takes nobody down with it. No assertion on how soon
after the deadline a wake comes: that is the machine's load (benchmarks/client_overhead.py measures it)."""

from __future__ import annotations

import asyncio
import select
import sys
import time

import pytest

from slobench.run.clock import Clock
from slobench.run.precise_sleep import PreciseSleep, sleep_until

needs_timerfd = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
MS = 1_000_000
# the first deadline, this far ahead: the sleepers must be queued before their deadlines (one past already
# returns at once), and a loaded machine can hold the loop for tens of ms between reading the clock and that
AHEAD_NS = 100 * MS


ROUNDS = 10  # a round whose loop was held past its first deadline is run again, up to this many times


@needs_timerfd
async def test_sleepers_wake_at_their_deadlines_in_order() -> None:
    sleeper = PreciseSleep.for_running_loop()
    assert sleeper is not None and PreciseSleep.for_running_loop() is sleeper  # one per loop

    async def one(k: int, base: int, woke: list[tuple[int, int]], late: list[int]) -> None:
        if time.perf_counter_ns() >= base + k * MS // 4 - MS:
            late.append(k)  # came within 1 ms of its deadline before sleeping
        await sleeper.until_ns(base + k * MS // 4)
        woke.append((k, time.perf_counter_ns()))

    for _ in range(ROUNDS):
        base = time.perf_counter_ns() + AHEAD_NS
        woke: list[tuple[int, int]] = []
        late: list[int] = []
        # queued latest first, so each new one re-arms the timer for an earlier deadline
        await asyncio.wait_for(asyncio.gather(*(one(k, base, woke, late) for k in reversed(range(12)))), 10)
        if not late:  # else the loop was held ~100 ms before the sleepers ran: what is tested did not happen
            break
    else:
        pytest.fail(f"the loop was held past the first deadline, {AHEAD_NS // MS} ms ahead, in {ROUNDS} rounds")
    assert [k for k, _ in woke] == list(range(12))
    assert all(t >= base + k * MS // 4 for k, t in woke)


@needs_timerfd
async def test_a_cancelled_sleeper_leaves_the_others_alone() -> None:
    sleeper = PreciseSleep.for_running_loop()
    assert sleeper is not None
    for _ in range(ROUNDS):
        base = time.perf_counter_ns() + AHEAD_NS
        first = asyncio.ensure_future(sleeper.until_ns(base))  # the earliest: the timer is armed for it
        later = asyncio.ensure_future(sleeper.until_ns(base + 2 * MS))
        await asyncio.sleep(0)
        if not first.done():  # else the loop was held past its deadline before it slept: run it again
            break
        await later
    else:
        pytest.fail(f"the loop was held past the first deadline, {AHEAD_NS // MS} ms ahead, in {ROUNDS} rounds")
    first.cancel()
    await asyncio.wait_for(later, 10)
    assert time.perf_counter_ns() >= base + 2 * MS and first.cancelled()
    await sleeper.until_ns(time.perf_counter_ns() - 1)  # a deadline already past returns at once


@pytest.mark.parametrize("spin_s", [0.0015, 0.0])
async def test_sleep_until_on_a_run_clock_with_and_without_precision(spin_s: float) -> None:
    clock = Clock(origin_ns=time.perf_counter_ns() - 3_600 * 10**9)  # a run an hour old
    t_s = clock.now_s() + 0.004
    await asyncio.wait_for(sleep_until(clock, t_s, spin_s), 10)
    assert clock.now_s() >= t_s


async def test_a_clock_that_is_not_perf_counter_is_never_given_to_the_timerfd() -> None:
    class Fake(Clock):
        def now_s(self) -> float:
            self.t += 0.001  # every reading advances a ms: the fallback's yield loop ends by itself
            return self.t

    clock = Fake(origin_ns=0)
    clock.t = 0.0  # type: ignore[attr-defined]
    await asyncio.wait_for(sleep_until(clock, 0.01, 0.02), 10)  # a timerfd at ~10 ms after boot: long past
    assert clock.now_s() >= 0.01


@needs_timerfd
async def test_a_fired_timer_is_cleared_by_the_next_poll_and_never_spins_the_loop() -> None:
    sleeper = PreciseSleep.for_running_loop()
    assert sleeper is not None
    fires = 0

    def counting() -> None:
        nonlocal fires
        fires += 1
        sleeper._fire()

    loop = asyncio.get_running_loop()
    loop.remove_reader(sleeper._fd)
    loop.add_reader(sleeper._fd, counting)
    try:
        for _ in range(3):
            await sleeper.until_ns(time.perf_counter_ns() + MS)
        assert 3 <= fires <= 6  # a sleep's wake, and perhaps a call queued by a poll before the timer was set
        fired = fires
        for _ in range(50):  # nobody asleep: the fd, still readable, is read at the next poll and no more
            await asyncio.sleep(0)
        assert fires - fired <= 1 and not select.select([sleeper._fd], [], [], 0)[0]
    finally:
        loop.remove_reader(sleeper._fd)
        loop.add_reader(sleeper._fd, sleeper._fire)
