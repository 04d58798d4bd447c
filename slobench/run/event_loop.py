"""The event loop a load runs on: uvloop where it is installed (Linux and macOS; a dependency there), else
asyncio's own. uvloop's loop and socket transports in C take about a quarter off the client's CPU a
request, which is how many requests one core can send on schedule. `SLOBENCH_EVENT_LOOP=asyncio` picks
asyncio's loop even so (to tell a loop's quirk from slobench's own); the manifest records which ran.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from slobench.errors import UsageError

T = TypeVar("T")
ENV = "SLOBENCH_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's `new_event_loop` (auto, where uvloop is installed, or asked for), or None: asyncio's own."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise UsageError(f"{ENV}: expected one of {', '.join(CHOICES)} (got {choice!r})")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise UsageError(f"{ENV}=uvloop: uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop `loop_factory` picks."""
    try:
        factory = loop_factory()
    except BaseException:
        coro.close()  # never started: no "never awaited" warning on top of the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def loop_name() -> str:
    """The running loop's kind, for the manifest: "uvloop" or "asyncio"."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
