"""The cyclic garbage collector held off while a load is sent, so its pauses are not measured as latency.

A run keeps every record it has taken, so CPython's older GC generations grow with it and each collection
scans more: at 400 req/s on one core a 6 s run saw ~13 older collections of 3-12 ms each, every one
stamped onto the TTFT of the requests it delayed. The send path makes almost no cyclic garbage, so while
a load runs the automatic GC is off and what existed before is frozen. A safety valve (`check`, `valve`)
bounds a run that does leak cycles: past `budget` allocations one timed collection runs and the survivors
are frozen again; the summary reports such pauses (`client.gc`). Holds nest (a depth count) and the GC's
state is given back as found; client worker processes and Ray load actors hold it for their whole life.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Any

# The send path's garbage: 2,451 requests at 400 req/s left ~400 unreachable objects, all from start-up and
# the summary. A leaking run (every request failing with an exception whose traceback points back at its
# frame) is what the valve is for; a young collection comes every ~700 allocations, an older one every ten.
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
