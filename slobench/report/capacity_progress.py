"""Where a capacity search is: before each probe, one line of rich's progress columns (probe number of an
estimated total, rate, seed, elapsed time, an estimate of what is left), printed rather than kept live so
it never fights the probe's own live line (sent / finished / in flight) for the terminal."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

SEARCH_PROBES_GUESS = 10  # bracketing from 1 req/s to ~30 doubles 5-6 times, then ~4 bisections to 5%
SEED_PROBES_GUESS = 4  # a replicate seed: the two edges, one widening, one narrowing


def clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


class SearchProgress:
    """A `measure(rate_rps, seed)` that shows the search's progress around another one. `fixed_total`: the
    probe count when it is known (fixed rates); else estimated from the seeds run so far."""

    def __init__(self, measure: Callable[[float, int], Awaitable[Any]], *, search_seed: int, replicates: int,
                 console: Console, show: bool, fixed_total: int | None = None) -> None:
        self.measure = measure
        self.search_seed = search_seed
        self.replicates = replicates
        self.fixed_total = fixed_total
        self.seeds_run: list[int] = []  # the seed of each probe, in order
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
            TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("left ~{task.fields[left]}"),
            console=console, auto_refresh=False, speed_estimate_period=24 * 3600.0, disable=not show,
        )
        self.task: TaskID | None = None

    def estimated_total(self) -> int:
        if self.fixed_total is not None:
            return self.fixed_total
        done = len(self.seeds_run)
        others = [s for s in self.seeds_run if s != self.search_seed]
        if not others:  # still searching
            return max(done + 1, SEARCH_PROBES_GUESS) + self.replicates * SEED_PROBES_GUESS
        started = len(set(others))
        per_seed = len(others) / started if started > 1 else SEED_PROBES_GUESS
        return done + max(1, math.ceil((self.replicates - started + 1) * per_seed - others.count(others[-1])))

    async def __call__(self, rate_rps: float, seed: int) -> Any:
        total = self.estimated_total()
        if self.task is None:
            self.task = self.progress.add_task("", total=total, left="?")
        done = len(self.seeds_run)
        elapsed = self.progress.tasks[0].elapsed or 0.0
        left = "?" if not done else clock(elapsed / done * (total - done))
        self.progress.update(self.task, total=total, completed=done, left=left,
                             description=f"probe {len(self.seeds_run) + 1}: {rate_rps:g} req/s, seed {seed}")
        if not self.progress.disable:
            self.progress.console.print(self.progress.make_tasks_table(self.progress.tasks))
        summary = await self.measure(rate_rps, seed)
        self.seeds_run.append(seed)
        self.progress.update(self.task, completed=len(self.seeds_run))
        return summary
