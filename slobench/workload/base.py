"""The one thing every verb that sends load asks of a workload: the requests of one run.

A synthetic `WorkloadSpec`, a `TraceReplay` (a trace loaded whole) and a `StreamingReplay` (a trace read
as the run goes) all implement `Workload`, so the command line, the probes and the searches take their
requests through one call, `specs(RunShape)`, whatever the source.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slobench.errors import SpecError
from slobench.run.records import RequestSpec

APIS = ("completions", "chat")


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_positive(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and float(x) > 0


@dataclass(frozen=True, slots=True)
class RunShape:
    """What one run asks of a workload. `rate_rps` rescales the source to that mean rate; a bound
    (`num_requests`, `duration_s`) cuts it, and giving either replaces both of a spec's own; `seed` draws
    everything random; `input_len` / `output_len` force fixed lengths where the source allows it (a trace
    has its own: SpecError); `api` is the API the requests are for (default: the workload's)."""

    rate_rps: float | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0
    input_len: int | None = None
    output_len: int | None = None
    api: str | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.seed) or self.seed < 0:
            raise SpecError("seed", self.seed, "must be an integer >= 0")
        for name in ("rate_rps", "duration_s"):
            value = getattr(self, name)
            if value is not None and not _is_positive(value):
                raise SpecError(name, value, "must be a finite number > 0")
        for name in ("num_requests", "input_len", "output_len"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise SpecError(name, value, "must be an integer >= 1")
        if self.api is not None and self.api not in APIS:
            raise SpecError("api", self.api, f"must be one of {list(APIS)}")


AS_IT_IS = RunShape()  # the source's own rate, bounds and API, at seed 0


@runtime_checkable
class Workload(Protocol):
    """`name` tags the requests and names the run; `api` is the API it is meant for ("completions" or
    "chat"); `to_dict()` goes into the manifest."""

    @property
    def name(self) -> str: ...

    @property
    def api(self) -> str: ...

    def specs(self, shape: RunShape = ...) -> Iterable[RequestSpec]:
        """The requests of one run of this shape, in arrival order."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def refuse_fixed_lengths(shape: RunShape) -> None:
    """A trace replay's lengths are the trace's: forcing them is bad input, not a silent no-op."""
    for name, value in (("input_len", shape.input_len), ("output_len", shape.output_len)):
        if value is not None:
            raise SpecError(name, value, "does not apply to a trace replay (the trace has the lengths)")
