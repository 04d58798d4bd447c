"""Arrival processes: when each request is sent, computed up front as absolute times.

Convention: the schedule is a renewal process started at t = 0, so the first arrival is at the first gap
(t[0] = gap[0] > 0), not at 0. With that choice a duration bound D at rate r holds r·D arrivals on
average and n / t[-1] estimates the rate without bias. The cost is an idle first gap (1/r on average).

Gaps are drawn from a unit-rate distribution and divided by the rate, so for a fixed seed a sweep over
rates sees the same schedule stretched or squeezed (common random numbers across the sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import numpy as np

from slobench.errors import SpecError
from slobench.workload.ranges import (
    MAX_NUM_REQUESTS,
    check_count,
    check_duration_s,
    check_rate_rps,
    check_requests_in,
)

__all__ = [
    "ArrivalProcess",
    "ConstantArrivals",
    "GammaArrivals",
    "PoissonArrivals",
    "make_arrivals",
]


class ArrivalProcess(Protocol):
    @property
    def rate_rps(self) -> float: ...

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray: ...

    def schedule(
        self, rng: np.random.Generator, *, num_requests: int | None = None, duration_s: float | None = None
    ) -> np.ndarray: ...

    def with_rate(self, rate_rps: float) -> ArrivalProcess: ...

    def to_dict(self) -> dict[str, object]: ...


def _check_bounds(num_requests: int | None, duration_s: float | None, rate_rps: float) -> None:
    if num_requests is None and duration_s is None:
        raise SpecError("num_requests", None, "set num_requests and/or duration_s to bound the schedule")
    if num_requests is not None:
        check_count("num_requests", num_requests, MAX_NUM_REQUESTS, low=0)
    if duration_s is not None:
        check_duration_s("duration_s", duration_s)
        if num_requests is None:
            check_requests_in(rate_rps, duration_s)


class _Renewal:
    """Shared schedule logic: cumulative sums of i.i.d. gaps, bounded by a count and/or a duration."""

    __slots__ = ()
    rate_rps: float

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _gap_cv(self) -> float:
        return 1.0

    def schedule(
        self, rng: np.random.Generator, *, num_requests: int | None = None, duration_s: float | None = None
    ) -> np.ndarray:
        """Absolute arrival times in seconds (float64), ascending; arrivals at or after `duration_s` are cut."""
        _check_bounds(num_requests, duration_s, self.rate_rps)
        if duration_s is None:
            assert num_requests is not None
            return np.cumsum(self.gaps(num_requests, rng))
        # Draw in chunks sized to the expected count plus a generous margin, so one draw nearly always
        # suffices; a later chunk continues the same random stream, so the times do not depend on chunking.
        expected = self.rate_rps * duration_s
        cap = num_requests if num_requests is not None else math.inf
        times: list[np.ndarray] = []
        t_end = 0.0
        drawn = 0
        while drawn < cap:
            cv = self._gap_cv()
            chunk = int(expected + 6.0 * cv * math.sqrt(expected) + 16)
            chunk = int(min(chunk, cap - drawn))
            t = t_end + np.cumsum(self.gaps(chunk, rng))
            times.append(t)
            drawn += chunk
            t_end = float(t[-1])
            if t_end >= duration_s:
                break
        out = np.concatenate(times) if times else np.empty(0)
        return out[out < duration_s]


@dataclass(frozen=True, slots=True)
class PoissonArrivals(_Renewal):
    """Exponential gaps: memoryless traffic from many independent users."""

    rate_rps: float

    name: ClassVar[str] = "poisson"

    def __post_init__(self) -> None:
        check_rate_rps("rate_rps", self.rate_rps)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_exponential(n) / self.rate_rps

    def with_rate(self, rate_rps: float) -> PoissonArrivals:
        return replace(self, rate_rps=rate_rps)

    def to_dict(self) -> dict[str, object]:
        return {"process": self.name, "rate_rps": self.rate_rps}

    def __str__(self) -> str:
        return f"poisson@{self.rate_rps:.2f}rps"


@dataclass(frozen=True, slots=True)
class GammaArrivals(_Renewal):
    """Gamma gaps with coefficient of variation `cv`: cv > 1 is burstier than Poisson, cv < 1 smoother.

    Shape k = 1/cv², mean gap 1/rate. vLLM's `--burstiness` is k, so burstiness = 1/cv².
    """

    rate_rps: float
    cv: float

    name: ClassVar[str] = "gamma"

    def __post_init__(self) -> None:
        check_rate_rps("rate_rps", self.rate_rps)
        if isinstance(self.cv, bool) or not isinstance(self.cv, int | float):
            raise SpecError("cv", self.cv, "must be a number")
        if not (math.isfinite(self.cv) and self.cv > 0):
            raise SpecError("cv", self.cv, "must be a finite number > 0 (1 is Poisson)")

    @classmethod
    def from_burstiness(cls, rate_rps: float, burstiness: float) -> GammaArrivals:
        if not burstiness > 0:
            raise SpecError("burstiness", burstiness, "must be > 0")
        return cls(rate_rps, 1.0 / math.sqrt(burstiness))

    @property
    def burstiness(self) -> float:
        return 1.0 / (self.cv * self.cv)

    def _gap_cv(self) -> float:
        return self.cv

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        # standard_gamma has mean `shape`; dividing by shape*rate gives mean gap 1/rate.
        return rng.standard_gamma(shape, n) / (shape * self.rate_rps)

    def with_rate(self, rate_rps: float) -> GammaArrivals:
        return replace(self, rate_rps=rate_rps)

    def to_dict(self) -> dict[str, object]:
        return {"process": self.name, "rate_rps": self.rate_rps, "cv": self.cv}

    def __str__(self) -> str:
        cv = f"{self.cv:.3g}"
        return f"gamma(cv={cv if '.' in cv or 'e' in cv else cv + '.0'})@{self.rate_rps:.2f}rps"


@dataclass(frozen=True, slots=True)
class ConstantArrivals(_Renewal):
    """Evenly spaced arrivals at 1/rate, 2/rate, ...: no randomness (the rng is accepted and unused)."""

    rate_rps: float

    name: ClassVar[str] = "constant"

    def __post_init__(self) -> None:
        check_rate_rps("rate_rps", self.rate_rps)

    def _gap_cv(self) -> float:
        return 0.0

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, 1.0 / self.rate_rps)

    def schedule(
        self, rng: np.random.Generator, *, num_requests: int | None = None, duration_s: float | None = None
    ) -> np.ndarray:
        # Multiply instead of summing gaps, so t[i] is exactly (i+1)/rate with no accumulated rounding.
        _check_bounds(num_requests, duration_s, self.rate_rps)
        n_dur = None if duration_s is None else int(math.ceil(duration_s * self.rate_rps)) + 1
        n = min(x for x in (num_requests, n_dur) if x is not None)
        t = np.arange(1, n + 1, dtype=np.float64) / self.rate_rps
        return t if duration_s is None else t[t < duration_s]

    def with_rate(self, rate_rps: float) -> ConstantArrivals:
        return replace(self, rate_rps=rate_rps)

    def to_dict(self) -> dict[str, object]:
        return {"process": self.name, "rate_rps": self.rate_rps}

    def __str__(self) -> str:
        return f"constant@{self.rate_rps:.2f}rps"


_PROCESSES = {"poisson": PoissonArrivals, "gamma": GammaArrivals, "constant": ConstantArrivals}


def make_arrivals(process: str, rate_rps: float, cv: float | None = None) -> ArrivalProcess:
    """Build an arrival process by name. `cv` applies to gamma only (cv = 1 turns gamma into Poisson)."""
    if process not in _PROCESSES:
        raise SpecError("process", process, f"unknown arrival process; choose one of {sorted(_PROCESSES)}")
    if process == "gamma":
        return GammaArrivals(rate_rps, 1.0 if cv is None else cv)
    if cv is not None:
        raise SpecError("cv", cv, f"only the gamma process takes a cv, not {process!r}")
    return _PROCESSES[process](rate_rps)
