"""The sweep's progress line: the rate in progress and its index of N, the time elapsed and an estimate of
what is left, on a fake clock and a console that records; nothing at all with --no-progress."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from slobench.analysis.summary import RunSummary
from slobench.experiments.probe import ProbeResult
from slobench.experiments.sweep import run_sweep
from slobench.report.sweep_progress import SweepProgress, planned_s, point_label


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rendered(show: SweepProgress) -> str:
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    console.print(show.progress.get_renderable())
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_the_line_names_the_rate_its_index_and_the_time_left() -> None:
    clock = Clock()
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)

    async def go() -> str:
        async with SweepProgress(True, console=console, get_time=clock) as show:
            for _ in range(4):
                show.add(10.0)
            show.start(point_label(8, 1, 4), 10.0)
            clock.now += 11.5
            show.done()
            show.start(point_label(16, 2, 4), 10.0)
            clock.now += 5.75
            show.refresh()
            return rendered(show)

    text = asyncio.run(go())
    assert "rate 16 req/s (2/4)" in text
    # 46 planned seconds (4 x 10 s and a 15% drain) of which 17.25 done in 17.25 s: 28.75 s left
    assert "elapsed 0:00:17  left ~0:00:29" in text, text


def test_the_estimate_runs_at_the_pace_of_what_is_done() -> None:
    # a simulated sweep: 20 planned seconds done in 2 s of wall time, 20 left: 2 s more
    clock = Clock()
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)

    async def go() -> str:
        async with SweepProgress(True, console=console, get_time=clock) as show:
            show.add(20 / 1.15)
            show.add(20 / 1.15)
            show.start(point_label(8, 1, 2), 20 / 1.15)
            clock.now += 2.0
            show.done()
            return rendered(show)

    assert "elapsed 0:00:02  left ~0:00:02" in asyncio.run(go())


def test_no_progress_shows_nothing() -> None:
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)

    async def go() -> None:
        async with SweepProgress(False, console=console) as show:
            show.add(5.0)
            show.start("rate 1 req/s (1/1)", 5.0)
            show.done()

    asyncio.run(go())
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]
    assert planned_s(4.0, 80, None) == 20.0 and planned_s(4.0, 80, 7.5) == 7.5


def test_run_sweep_tells_each_rate_its_index_before_it_runs(tmp_path: Path) -> None:
    heard: list[tuple[float, int, int]] = []

    async def probe(rate: float, seed: int, run_dir: Path | None, manifest: dict[str, Any]) -> ProbeResult:
        assert heard[-1][0] == rate  # told before it runs
        return ProbeResult(RunSummary.from_dict({"num_requests": 1, "num_ok": 1}))

    asyncio.run(run_sweep([2.0, 4.0, 8.0], probe, out_dir=tmp_path, slo=None, manifest={},
                          on_start=lambda r, i, n: heard.append((r, i, n))))
    assert heard == [(2.0, 1, 3), (4.0, 2, 3), (8.0, 3, 3)]
