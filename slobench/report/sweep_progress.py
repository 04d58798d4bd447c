"""A sweep's progress line: the rate in progress, its index of N, the time elapsed and an estimate of what
is left (rich's Progress columns).

The estimate counts planned seconds: each point's arrivals (its duration, or its request count over its
rate) plus a drain of `DRAIN_SHARE` of it, so a sweep of long low-rate points and short high-rate ones is
not estimated as N equal steps; what is left is the planned seconds left at the pace the planned seconds
so far took. The bar advances with the clock while a point runs, and jumps to the point's planned end
when it finishes. rich keeps one live display per console, so while this line shows,
each run's own line (sent / finished / in flight) is left off (`sweep` passes the runner no progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

DRAIN_SHARE = 0.15  # a point's drain after its last arrival, as a share of its arrivals' span
TICK_S = 0.25


class SweepProgress:
    """`start(label, planned_s)` before each point, `done()` after it; `add(planned_s)` when more work is
    planned (the sweep's rates, once the bracket chose them). Shows nothing unless `enabled` and the
    console is a terminal."""

    def __init__(self, enabled: bool, *, console: Console | None = None,
                 get_time: Callable[[], float] = time.monotonic) -> None:
        console = console or Console(stderr=True)
        self.enabled = enabled and console.is_terminal
        self.get_time = get_time
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(),
            TextColumn("elapsed {task.fields[elapsed]}  left ~{task.fields[left]}"),
            console=console, transient=True, get_time=get_time,
        )
        self.started = get_time()
        self.task: TaskID | None = None
        self.finished_s = 0.0  # planned seconds of the points done
        self.current: tuple[float, float] | None = None  # (started at, planned seconds) of the point running
        self.ticker: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> SweepProgress:
        if self.enabled:
            self.progress.start()
            self.started = self.get_time()
            self.task = self.progress.add_task("sweep", total=0.0, elapsed=clock_text(0.0), left="?")
            self.ticker = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.ticker
        if self.enabled:
            self.progress.stop()

    def add(self, planned_s: float) -> None:
        if self.task is not None:
            total = self.progress.tasks[0].total or 0.0
            self.progress.update(self.task, total=total + planned_s * (1 + DRAIN_SHARE))

    def start(self, label: str, planned_s: float) -> None:
        self.current = (self.get_time(), planned_s * (1 + DRAIN_SHARE))
        if self.task is not None:
            self.progress.update(self.task, description=label)

    def done(self) -> None:
        if self.current is not None:
            self.finished_s += self.current[1]
            self.current = None
        self.refresh()

    def refresh(self) -> None:
        if self.task is None:
            return
        running = 0.0
        if self.current is not None:
            started, planned = self.current
            running = min(planned, self.get_time() - started)
        done = self.finished_s + running
        elapsed = self.get_time() - self.started
        left_planned = max(0.0, (self.progress.tasks[0].total or 0.0) - done)
        # planned seconds run as fast as those done ran (a simulated sweep runs them far faster than real time)
        left = left_planned * elapsed / done if done > 0 else None
        self.progress.update(self.task, completed=done, elapsed=clock_text(elapsed),
                             left="?" if left is None else clock_text(left))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.refresh()


def clock_text(seconds: float) -> str:
    """`0:01:05`."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def point_label(rate_rps: float, index: int, total: int, stage: str = "rate") -> str:
    """`rate 24 req/s (3/6)`: the rate in progress and its index of N."""
    return f"{stage} {rate_rps:g} req/s ({index}/{total})"


def planned_s(rate_rps: float, num_requests: int | None, duration_s: float | None) -> float:
    """A point's arrivals in seconds: its duration, or its request count at its rate."""
    if duration_s is not None:
        return duration_s
    return (num_requests or 0) / rate_rps
