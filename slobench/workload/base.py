"""The one thing every verb that sends load asks of a workload: the requests of one run.

A synthetic `WorkloadSpec`, a `TraceReplay` (a trace loaded whole) and a `StreamingReplay` (a trace read
as the run goes) all implement `Workload`, so the command line, the probes and the searches take their
requests through one call whatever the source. Before this protocol a capacity search on a trace called
`generate` on the replay and died (issue 12).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from slobench.errors import SpecError
from slobench.run.records import RequestSpec


@runtime_checkable
class Workload(Protocol):
    """`name` tags the requests and names the run; `api` is the API it is meant for ("completions" or
    "chat"); `to_dict()` goes into the manifest."""

    @property
    def name(self) -> str: ...

    @property
    def api(self) -> str: ...

    def specs(
        self,
        *,
        rate_rps: float | None = None,
        num_requests: int | None = None,
        duration_s: float | None = None,
        seed: int = 0,
        input_len: int | None = None,
        output_len: int | None = None,
        api: str | None = None,
    ) -> Iterable[RequestSpec]:
        """The requests of one run, in arrival order. `rate_rps` rescales the source to that mean rate;
        a bound (num_requests, duration_s) cuts it; `input_len` / `output_len` force fixed lengths where
        the source allows it (a trace has its own lengths: SpecError)."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def refuse_fixed_lengths(input_len: int | None, output_len: int | None) -> None:
    """A trace replay's lengths are the trace's: forcing them is bad input, not a silent no-op."""
    for name, value in (("input_len", input_len), ("output_len", output_len)):
        if value is not None:
            raise SpecError(name, value, "does not apply to a trace replay (the trace has the lengths)")
