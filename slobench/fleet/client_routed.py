"""Several replicas loaded as one target, routed by the client: `--url A,B,C --router least-outstanding`.

For replicas with no load balancer in front (a few vLLM or SGLang processes on one node, say), or to test
a routing policy before building it into a balancer. Routing uses `slobench.fleet.routing`, the code the
simulated fleet (`--simulate --replicas N`) uses, so a simulated fleet and a real one are routed alike;
`benchmarks/http_overhead.py --replicas 2` compares the two on the bundled engine.

Every replica's target stamps on the one run clock. The records are one run; the manifest and the
summary's `fleet` entry say how many requests each replica got.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slobench.errors import SpecError
from slobench.fleet.routing import Router
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.base import Target, TargetBase


class FleetTarget(TargetBase):
    def __init__(self, targets: Sequence[Target], router: str = "least-outstanding") -> None:
        if len(targets) < 1:
            raise SpecError("replicas", len(targets), "a fleet needs at least one target")
        clocks = {id(t.clock) for t in targets}
        if len(clocks) != 1:
            raise SpecError("targets", len(targets), "every replica's target must share one clock (the run's)")
        self.targets = list(targets)
        self.clock: Clock = targets[0].clock
        self.router = Router(router, len(targets))
        self.send_lead_s = min(float(t.send_lead_s) for t in targets)
        self.records_live = all(t.records_live for t in targets)

    @property  # the first replica's, read through (as a pool's is)
    def model(self) -> str:  # type: ignore[override]
        return str(self.targets[0].model)

    def describe(self) -> dict[str, Any]:
        fleet = {"replicas": len(self.targets), "router": self.router.policy,
                 "targets": [t.describe() for t in self.targets]}
        return {**self.targets[0].describe(), "fleet": fleet}

    def fleet_summary(self) -> dict[str, Any]:
        return {"replicas": len(self.targets), "router": self.router.policy,
                "requests_per_replica": list(self.router.sent)}

    def negotiation_notes(self) -> list[str]:
        notes: list[str] = []
        for t in self.targets:
            for n in t.negotiation_notes():
                if n not in notes:
                    notes.append(n)
        return notes

    def check_compatible(self, spec: RequestSpec) -> None:
        for t in self.targets:
            t.check_compatible(spec)

    async def start(self) -> None:
        for t in self.targets:
            await t.start()

    async def close(self) -> None:
        for t in self.targets:
            await t.close()

    async def preflight(self) -> str:
        lines = [await t.preflight() for t in self.targets]
        return f"{len(lines)} replicas behind {self.router.policy}: " + "; ".join(lines)

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        i = self.router.pick(spec.prompt)
        weight = spec.input_tokens + spec.max_tokens
        self.router.started(i, weight)
        record.replica = i
        try:
            await self.targets[i].send(spec, record)
        finally:
            self.router.finished(i, weight)
