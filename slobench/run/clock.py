"""One monotonic clock per run. Every timestamp in a run is seconds since the run's origin on it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Clock:
    """Monotonic clock anchored at a run origin, plus one wall-clock anchor for the manifest.

    Injected into the runner and targets so tests can substitute a fake.
    """

    origin_ns: int = field(default_factory=time.perf_counter_ns)
    wall_anchor_unix_s: float = field(default_factory=time.time)

    def now_s(self) -> float:
        return (time.perf_counter_ns() - self.origin_ns) * 1e-9

    def reset(self) -> None:
        self.origin_ns = time.perf_counter_ns()
        self.wall_anchor_unix_s = time.time()
