"""`slobench plan` says where it is: the phase, evaluations done of the batch's, elapsed, estimate left."""

from __future__ import annotations

import io

from rich.console import Console

from slobench.fleet import plan_pool
from slobench.fleet.plan_pool import PlanPool
from slobench.fleet.plan_progress import PlanProgress


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_live_line_shows_phase_count_elapsed_and_time_left() -> None:
    out = io.StringIO()
    clock = Clock()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    shown = PlanProgress(is_live=True, console=console, get_time=clock)
    shown.phase("searching 24 windows")
    shown.jobs(0, 24)
    for done in range(1, 7):
        clock.now_s += 5.0
        shown.jobs(done, 24)
    assert shown.progress is not None
    line = Console(file=io.StringIO(), width=160, color_system=None, record=True)
    line.print(shown.progress.get_renderable())
    text = line.export_text()
    assert "plan: searching 24 windows" in text
    assert "6/24" in text
    assert "0:00:30" in text  # elapsed since the plan started
    assert "0:01:30" in text  # left: 18 more at the batch's 5 s each


def test_off_a_terminal_one_line_a_phase(capsys) -> None:
    clock = Clock()
    shown = PlanProgress(is_live=False, get_time=clock)
    clock.now_s += 12.0
    shown.phase("the best static colocated fleet")
    shown.jobs(0, 3)
    assert capsys.readouterr().err == "plan: the best static colocated fleet (12 s)\n"


def test_the_pool_reports_each_batch_and_each_job(monkeypatch) -> None:
    monkeypatch.setattr(plan_pool, "run_job", lambda recipe, setup, job: job[1] * 2)
    heard: list[tuple[int, int]] = []
    with PlanPool(None, None, on_progress=lambda done, total: heard.append((done, total))) as pool:  # type: ignore[arg-type]
        assert pool.map([("eval", 1), ("eval", 2), ("eval", 3)]) == [2, 4, 6]
    assert heard == [(0, 3), (1, 3), (2, 3), (3, 3)]
