"""One answer to SIGINT and SIGTERM from a run's first send to its last file written.

While a run sends, a signal stops it: sending ends, requests in flight get their grace, the rest are
cancelled (a second signal cancels them at once). Once sending is over (the warm-up cut, the summary,
requests.parquet, summary.json, and what the CLI adds to the run directory after the runner returns) a signal
changes nothing that is written but the mark: it is noted, every file is finished, summary.json says
`interrupted`, and the verb exits 130. A signal never tears a file, leaves a `.tmp` or skips summary.json.

The handlers are Python-level (`signal.signal`), installed once by the outermost `hold()` and restored when it
ends (then the CLI's own apply: SIGTERM as Ctrl-C). They fire between bytecodes even while the event loop
does not turn (summarising a million records takes seconds), so they never act there: they count the signal,
and hand a stop to the loop with `call_soon_threadsafe` where sending is still going on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slobench.analysis.summary import RunSummary
from slobench.run.rundir import SUMMARY, write_summary

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOTE = b"slobench: interrupted: finishing the run directory's files first (summary.json marked interrupted)\n"


@dataclass(slots=True, eq=False)  # holds are told apart by identity (nested ones may look alike)
class Hold:
    """What one `hold()` saw: the first signal and how many came. `stop_with` names what a signal does while
    the run is still sending (called on the loop); with none set, a signal is only counted."""

    signum: int | None = None
    count: int = 0
    is_noted: bool = False  # the line saying the files are being finished was written
    _on_stop: Callable[[], None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def received(self) -> bool:
        return self.count > 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def stop_with(self, on_stop: Callable[[], None] | None) -> None:
        """`on_stop` runs on the running loop at each signal from now on (and at once where an enclosing
        hold saw one already: the run stops before its first send); None: signals are only counted."""
        self._on_stop = on_stop
        self._loop = asyncio.get_running_loop() if on_stop is not None else None
        if on_stop is not None and self._loop is not None and any(h.received for h in _holds):
            self._loop.call_soon(on_stop)


_holds: list[Hold] = []


def _on_signal(signum: int, _frame: Any) -> None:
    for h in _holds:
        h.count += 1
        if h.signum is None:
            h.signum = signum
    for h in reversed(_holds):
        if h._on_stop is not None and h._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: counted is enough
                h._loop.call_soon_threadsafe(h._on_stop)
            return
    if _holds and not _holds[0].is_noted:
        _holds[0].is_noted = True
        with contextlib.suppress(OSError):
            os.write(2, NOTE)  # async-signal-safe, unlike print


@contextlib.contextmanager
def hold(*, install: bool = True) -> Iterator[Hold]:
    """Hold SIGINT and SIGTERM for the block (see the module doc). Holds nest: an outer one (the CLI's probe)
    sees every signal an inner one (the runner's) saw. Off the main thread, or with `install=False`, nothing is
    installed and the hold counts nothing."""
    h = Hold()
    if not install or threading.current_thread() is not threading.main_thread():
        yield h
        return
    previous = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS} if not _holds else {}
    _holds.append(h)
    try:
        yield h
    finally:
        _holds.remove(h)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def marked(held: Hold, summary: RunSummary, run_dir: Path | None) -> RunSummary:
    """`summary` marked interrupted where `held` saw a signal after it was made, and summary.json (where
    written already) rewritten so: the run directory says what the exit code (130) says."""
    if not held.received or summary.interrupted:
        return summary
    summary = replace(summary, interrupted=True)
    if run_dir is not None and (Path(run_dir) / SUMMARY).exists():
        write_summary(run_dir, summary)
    return summary
