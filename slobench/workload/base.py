"""The one thing every verb that sends load asks of a workload: the requests of one run.

A synthetic `WorkloadSpec`, a `TraceReplay` (a trace loaded whole) and a `StreamingReplay` (a trace read
as the run goes) all implement `Workload`, so the command line, the probes and the searches take their
requests through one call, `specs(RunShape)`, whatever the source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slobench.errors import SpecError
from slobench.run.records import RequestSpec
from slobench.workload.ranges import (
    MAX_NUM_REQUESTS,
    MAX_TOKENS,
    check_count,
    check_duration_s,
    check_rate_rps,
    check_requests_in,
    is_int,
)

APIS = ("completions", "chat")


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
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise SpecError("seed", self.seed, "must be an integer from 0 to 2**63 - 1")
        if self.rate_rps is not None:
            check_rate_rps("rate_rps", self.rate_rps)
        if self.duration_s is not None:
            check_duration_s("duration_s", self.duration_s)
        check_requests_in(self.rate_rps, self.duration_s)
        for name, limit in (("num_requests", MAX_NUM_REQUESTS), ("input_len", MAX_TOKENS), ("output_len", MAX_TOKENS)):
            value = getattr(self, name)
            if value is not None:
                check_count(name, value, limit)
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
