"""The one seam every target implements: fill a RequestRecord for a RequestSpec."""

from __future__ import annotations

from typing import Protocol

from slobench.clock import Clock
from slobench.records import RequestRecord, RequestSpec


class Target(Protocol):
    """A kind of server slobench can load.

    `send` stamps `record.sent_s` immediately before the request leaves, every content chunk's arrival
    (`chunk_times_s`, `chunk_tokens`), `first_token_s`, `done_s`, token counts, and on failure
    `record.fail(status, reason)`. It never raises for a failed request; `asyncio.CancelledError`
    propagates (the runner then marks the record cancelled, keeping the times already stamped).
    """

    clock: Clock

    async def start(self) -> None: ...

    async def preflight(self) -> str:
        """One cheap request that proves the target is reachable and serves the model.

        Returns a one-line description (e.g. the model name served). Raises TargetUnreachable.
        """
        ...

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None: ...

    async def close(self) -> None: ...
