"""Where `slobench plan` is: the phase (searching the day's windows, the static fleets, ...), the phase's
evaluations done of its total, the time elapsed and rich's estimate of the time left. On a terminal a live
line; elsewhere (a pipe, CI's log, `--no-progress`) one line a phase on stderr, with the seconds so far."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["PlanProgress"]


class _Since(ProgressColumn):
    """Time since the plan started (rich's TimeElapsedColumn restarts with each batch's bar)."""

    def __init__(self, start_s: float, get_time: Callable[[], float]) -> None:
        super().__init__()
        self.start_s, self.get_time = start_s, get_time

    def render(self, task: Task) -> Text:
        s = int(self.get_time() - self.start_s)
        return Text(f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}", style="progress.elapsed")


class PlanProgress:
    """`phase(text)` for each step of the plan (plan_day's `progress`), `jobs(done, total)` for each job
    the pool finishes (PlanPool's `on_progress`). `console` and `get_time` are for tests."""

    def __init__(self, *, is_live: bool | None = None, console: Console | None = None,
                 get_time: Callable[[], float] = time.perf_counter) -> None:
        self.console = console or Console(stderr=True)
        self.get_time = get_time
        self.start_s = get_time()
        live = self.console.is_terminal if is_live is None else is_live
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.text = "starting"
        if live:
            self.progress = Progress(
                TextColumn("plan: {task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("elapsed"), _Since(self.start_s, get_time), TextColumn("left"), TimeRemainingColumn(),
                console=self.console, get_time=get_time, transient=True)
            self.task = self.progress.add_task(self.text, total=None, start=True)

    def __enter__(self) -> PlanProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.progress is not None:
            self.progress.stop()

    def phase(self, text: str) -> None:
        self.text = text
        if self.progress is None or self.task is None:
            print(f"plan: {text} ({self.get_time() - self.start_s:.0f} s)", file=sys.stderr)
            return
        self.progress.update(self.task, description=text)

    def jobs(self, done: int, total: int) -> None:
        """A batch of evaluations starts (done 0) or one finishes: its own bar, so the estimate left is
        the batch's pace, not the whole run's."""
        if self.progress is None or self.task is None:
            return
        if done == 0:
            self.progress.reset(self.task, total=total, description=self.text)
        else:
            self.progress.update(self.task, completed=done)
