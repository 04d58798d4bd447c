"""The signal policy's holds, in process: a signal while a run sends stops it on the loop; one after is only
counted (and marks the summary); nested holds all see it; the handlers before the outermost hold come back."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from slobench.analysis.summary import summarize
from slobench.report.synthetic import synthetic_records
from slobench.run import interrupts
from slobench.run.rundir import read_summary, write_summary


def _signal(sig: signal.Signals = signal.SIGTERM) -> None:
    os.kill(os.getpid(), sig)  # handled at the next bytecode, on this (the main) thread


def test_a_signal_while_sending_stops_on_the_loop_and_after_it_is_only_counted() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stops: list[str] = []

    async def main() -> tuple[int, int]:
        with interrupts.hold() as outer, interrupts.hold() as inner:
            inner.stop_with(lambda: stops.append("stop"))
            _signal()
            await asyncio.sleep(0)  # the stop runs on the loop, not inside the handler
            inner.stop_with(None)
            _signal(signal.SIGINT)  # finishing: counted, nothing stops
            await asyncio.sleep(0)
        return outer.count, inner.count

    assert asyncio.run(main()) == (2, 2)
    assert stops == ["stop"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_before_the_first_send_stops_the_run_at_once() -> None:
    stops: list[str] = []

    async def main() -> None:
        with interrupts.hold():
            _signal()  # while the probe makes its requests, before the runner's hold
            with interrupts.hold() as runner:
                runner.stop_with(lambda: stops.append("stop"))
                await asyncio.sleep(0)

    asyncio.run(main())
    assert stops == ["stop"]


def test_a_summary_written_before_the_signal_is_marked_and_rewritten(tmp_path: Path) -> None:
    summary = summarize(synthetic_records(2, 20, capacity_rps=10, seed=1), None)
    write_summary(tmp_path, summary)
    with interrupts.hold() as held:
        assert interrupts.marked(held, summary, tmp_path) is summary  # no signal: as it was
        _signal()
        marked = interrupts.marked(held, summary, tmp_path)
    assert marked.interrupted and not summary.interrupted
    saved = read_summary(tmp_path)
    assert saved is not None and saved.interrupted
