"""The cyclic garbage collector held off while a load is sent, so its pauses are not measured as latency.

CPython's cyclic GC stops the event loop whenever enough container objects have been allocated: a young
collection every ~700, an older one every ten of those, a full one now and then. A run keeps every record
it has taken (each a few containers), so the older generations grow with the run and each collection of
them scans more: at 400 req/s on one core, a 6 s run saw ~150 young and ~13 older collections, the older
ones 3-12 ms each, and every request whose first token arrived during one is stamped that much late. That
is a client artefact in the TTFT tail, the quantity slobench exists to measure.

The send path makes almost no cyclic garbage (2,451 requests at 400 req/s left ~400 unreachable objects,
all from start-up and the summary), so while a load runs the automatic GC is off and what existed
before is frozen (moved out of every collection's reach; garbage among it waits for the end). A safety valve keeps a pathological run (one
that does leak cycles, e.g. every request failing with an exception whose traceback points back at its
frame) from growing without bound: once `budget` tracked objects have been allocated since the last
look, one collection runs and what survives is frozen again, so the next one scans only what is new. Each
such pause is counted and timed, and the run's summary says so (`client.gc`). At the end the GC's state is
given back as it was found; nested and concurrent runs in one process share one hold (a depth count).
A client worker process (`--client-workers`) and a Ray load actor hold it for their whole life, with the
same valve.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BUDGET = 500_000  # tracked allocations between looks; at ~10 a request, ~50,000 requests


@dataclass(slots=True)
class GCStats:
    collections: int = 0
    pauses_s: list[float] = field(default_factory=list)
    collected: int = 0  # unreachable objects the valve's collections found

    def to_dict(self) -> dict[str, Any]:
        return {"held": True, "collections": self.collections, "pause_s_total": round(sum(self.pauses_s), 6),
                "pause_s_max": round(max(self.pauses_s, default=0.0), 6), "collected": self.collected}


class _Hold:
    depth = 0
    was_enabled = True


def hold() -> GCStats:
    """Start holding the GC off (see the module doc); pair every call with `release()`."""
    if _Hold.depth == 0:
        _Hold.was_enabled = gc.isenabled()
        gc.disable()
        gc.freeze()  # O(1): what exists now is out of every collection's reach
    _Hold.depth += 1
    return GCStats()


def check(stats: GCStats, budget: int | None = None) -> bool:
    """Collect once if `budget` (default DEFAULT_BUDGET) tracked objects were allocated since the last
    collection; True if it did."""
    if gc.get_count()[0] < (DEFAULT_BUDGET if budget is None else budget):
        return False
    t0 = time.perf_counter()
    stats.collected += gc.collect()
    gc.freeze()
    stats.pauses_s.append(time.perf_counter() - t0)
    stats.collections += 1
    return True


async def valve(stats: GCStats, every_s: float = 1.0) -> None:
    """`check` once a second for as long as the hold lasts (a task beside the load; cancel it at the end)."""
    while True:
        await asyncio.sleep(every_s)
        check(stats)


def release() -> None:
    if _Hold.depth == 0:
        raise RuntimeError("quiet_gc.release() without hold()")
    _Hold.depth -= 1
    if _Hold.depth == 0:
        gc.unfreeze()
        if _Hold.was_enabled:
            gc.enable()


def is_held() -> bool:
    return _Hold.depth > 0
