"""One clock across machines: NTP-style offset estimates from round trips, and a map between two clocks.

A load actor on another machine stamps its records on its own monotonic clock. The driver asks it for its
clock a few times, keeps the round trip with the smallest RTT, and estimates
    offset = remote_stamp - (driver_sent + driver_received) / 2      (remote - driver, seconds)
whose error is at most RTT/2 whatever the split into one-way delays (a bound, not a standard deviation).
Two estimates (a run's start and end) give the drift; `ClockMap` maps remote times onto the driver's
clock linearly between them, its bound growing past them (`ClockMap.bound_at`). Pure: no Ray, no
sockets; the probe and the clock are handed in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slobench.errors import SpecError

DEFAULT_NUM_SAMPLES = 24
# A run is flagged when the clocks' uncertainty exceeds this share of the TTFT SLO: past it, a send time
# or the order of two actors' requests is uncertain by a visible part of what is being judged.
CLOCK_LIMIT_OF_TTFT = 0.05


@dataclass(frozen=True, slots=True)
class OffsetEstimate:
    """The remote clock minus the driver's, at driver time `at_s`, within ±`uncertainty_s`."""

    offset_s: float
    uncertainty_s: float  # RTT/2 of the chosen (minimum-RTT) round trip
    at_s: float  # driver time of the chosen round trip's midpoint
    rtt_s: float
    num_samples: int

    def __post_init__(self) -> None:
        if not self.uncertainty_s >= 0:
            raise SpecError("uncertainty_s", self.uncertainty_s, "must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_offset(samples: Sequence[tuple[float, float, float]]) -> OffsetEstimate:
    """`samples`: round trips (driver_sent_s, remote_stamp_s, driver_received_s). The minimum-RTT one wins:
    queueing only ever adds delay, so the fastest round trip is the one least skewed by it."""
    valid = [s for s in samples if s[2] >= s[0]]
    if not valid:
        raise SpecError("samples", len(samples), "need at least one round trip with received >= sent")
    t0, tr, t3 = min(valid, key=lambda s: s[2] - s[0])
    mid = (t0 + t3) / 2
    rtt = t3 - t0
    return OffsetEstimate(offset_s=tr - mid, uncertainty_s=rtt / 2, at_s=mid, rtt_s=rtt, num_samples=len(valid))


async def measure_offset(
    probe: Callable[[], Awaitable[float]], now: Callable[[], float], num_samples: int = DEFAULT_NUM_SAMPLES
) -> OffsetEstimate:
    """`num_samples` sequential round trips: `probe()` returns the remote clock's reading, `now()` reads
    the driver's."""
    if num_samples < 1:
        raise SpecError("num_samples", num_samples, "must be >= 1")
    samples = []
    for _ in range(num_samples):
        t0 = now()
        tr = await probe()
        samples.append((t0, tr, now()))
    return estimate_offset(samples)


@dataclass(frozen=True, slots=True)
class ClockMap:
    """Maps a remote clock onto the driver's: the offset is linear in driver time through `start` and
    `end` (constant at `start`'s while there is no `end`)."""

    start: OffsetEstimate
    end: OffsetEstimate | None = None

    @property
    def drift(self) -> float:
        """d(offset)/d(driver time): remote seconds gained per driver second (1e-6 is 1 ppm)."""
        e = self.end
        if e is None or e.at_s == self.start.at_s:
            return 0.0
        return (e.offset_s - self.start.offset_s) / (e.at_s - self.start.at_s)

    @property
    def uncertainty_s(self) -> float:
        """The bound on the map's error between the two estimates."""
        return max(self.start.uncertainty_s, self.end.uncertainty_s if self.end else 0.0)

    def with_end(self, end: OffsetEstimate) -> ClockMap:
        return ClockMap(self.start, end)

    def offset_at(self, driver_s: float) -> float:
        return self.start.offset_s + self.drift * (driver_s - self.start.at_s)

    def to_remote(self, driver_s: float) -> float:
        return driver_s + self.offset_at(driver_s)

    def to_driver(self, remote_s: float) -> float:
        # remote = d + o0 + drift * (d - a0), solved for d
        k = self.drift
        return (remote_s - self.start.offset_s + k * self.start.at_s) / (1.0 + k)

    def bound_at(self, driver_s: float) -> float:
        """The error bound at a driver time: the estimates' uncertainty between them, growing outside by
        the drift's own uncertainty ((u0 + u1) / span) times the distance to the nearer estimate."""
        e = self.end
        if e is None or e.at_s == self.start.at_s:
            return self.uncertainty_s  # no drift known: valid only for clocks that do not drift
        lo, hi = sorted((self.start.at_s, e.at_s))
        beyond = max(0.0, lo - driver_s, driver_s - hi)
        return self.uncertainty_s + beyond * (self.start.uncertainty_s + e.uncertainty_s) / (hi - lo)

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.to_dict(),
            "end": self.end.to_dict() if self.end else None,
            "drift_ppm": self.drift * 1e6,
            "uncertainty_s": self.uncertainty_s,
        }
