"""The one seam every target implements: fill a RequestRecord for a RequestSpec.

`Target` is the whole contract, the optional parts included: the runner, the CLI and the fleet read every
member directly, never probing with `hasattr`. `TargetBase` gives the optional parts their defaults, so a
target (a test's fake included) writes only `clock`, `send` and what it does differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Self

from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from slobench.targets.capabilities import Capabilities


class Target(Protocol):
    """A kind of server slobench can load.

    `send` stamps `record.sent_s` immediately before the request leaves, every content chunk's arrival
    (`chunk_times_s`, `chunk_tokens`), `first_token_s`, `done_s`, token counts, and on failure
    `record.fail(status, reason)`. It never raises for a failed request; `asyncio.CancelledError`
    propagates (the runner then marks the record cancelled, keeping the times already stamped).
    """

    clock: Clock
    """The run's one clock: the target stamps on it and the runner dispatches on this very object."""

    send_lead_s: float
    """How long before its scheduled time the runner hands a request over; the target then holds it until
    that time itself (client worker processes, Ray actors). 0: the runner sends on time."""

    records_live: bool
    """Each time is written on the record the moment it is stamped, so a record read while its request runs
    is true up to now (the early stop's in-flight rules need it); False: stamps queued or made elsewhere."""

    @property
    def model(self) -> str:
        """The model name requests carry ("" where none applies)."""
        ...

    @property
    def caps(self) -> Capabilities | None:
        """What preflight settled about what the server accepts; None for a target that negotiates nothing."""
        ...

    async def start(self) -> None: ...

    async def preflight(self) -> str:
        """One cheap request that proves the target is reachable and serves the model.

        Returns a one-line description (e.g. the model name served). Raises TargetUnreachable.
        """
        ...

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None: ...

    async def close(self) -> None: ...

    def check_compatible(self, spec: RequestSpec) -> None:
        """Raise a clear error, before anything is sent, if requests like `spec` cannot be sent at all."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this target: never a key or a header value."""
        ...

    def fleet_summary(self) -> dict[str, Any] | None:
        """For several replicas behind one target: the summary's `fleet` entry (how many requests each got)."""
        ...

    def negotiation_notes(self) -> list[str]:
        """What preflight settled about the server (fallbacks, counted usage), each note once."""
        ...


class TargetBase:
    """The optional parts of `Target`, with their defaults. A subclass sets `clock` and writes `send` (and
    `preflight` where there is something to reach)."""

    clock: Clock
    send_lead_s: float = 0.0
    records_live: bool = False
    model: str = ""
    caps: Capabilities | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def check_compatible(self, spec: RequestSpec) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__}

    def fleet_summary(self) -> dict[str, Any] | None:
        return None

    def negotiation_notes(self) -> list[str]:
        return list(self.caps.notes) if self.caps is not None else []
