"""Fault injection for the engine's server: rehearse a client, a gate or an SLO against a flaky server.

    slobench serve --faults error=0.02,reset=0.01,stall=0.005,slow-headers=0.01 --fault-seed 1

Each generation request draws at most one fault, in arrival order from one seeded generator:
  error         HTTP 500 with an OpenAI error body, before the engine sees the request
  reset         the TCP connection is reset (RST) after a few streamed chunks (a whole response: before it)
  stall         the stream stops sending for `stall_s` after a few chunks (a whole response: before it), then goes on
  slow-headers  the response (its status line and headers) is held back for `slow_headers_s`
Injected faults are counted in /metrics as `slobench_engine:faults_injected_total{kind}`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields

KINDS = ("error", "reset", "stall", "slow-headers")
MAX_CHUNKS_BEFORE = 4  # reset and stall strike after 1..4 chunks of a stream


@dataclass(frozen=True, slots=True)
class FaultSpec:
    error: float = 0.0
    reset: float = 0.0
    stall: float = 0.0
    slow_headers: float = 0.0
    stall_s: float = 60.0
    slow_headers_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "seed":
                continue
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{f.name.replace('_', '-')} must be a finite number >= 0 (got {v!r})")
        if self.total() > 1:
            raise ValueError(f"fault probabilities add up to {self.total():g}; at most 1")

    def total(self) -> float:
        return self.error + self.reset + self.stall + self.slow_headers

    @property
    def is_active(self) -> bool:
        return self.total() > 0


def parse_faults(text: str, *, stall_s: float = 60.0, slow_headers_s: float = 5.0, seed: int = 0) -> FaultSpec:
    """`error=0.02,reset=0.01,stall=0.005,slow-headers=0.01` (probabilities); ValueError names what is wrong."""
    probs: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in KINDS:
            raise ValueError(f"{item.strip()!r}: expected KIND=PROBABILITY with KIND one of {', '.join(KINDS)}")
        if name in probs:
            raise ValueError(f"{name} given twice")
        try:
            p = float(value)
        except ValueError:
            raise ValueError(f"{name}={value.strip()!r}: not a number") from None
        if not 0 <= p <= 1:  # NaN fails too
            raise ValueError(f"{name}={value.strip()}: a probability must be from 0 to 1")
        probs[name] = p
    if not probs:
        raise ValueError("no faults given (e.g. error=0.02,reset=0.01)")
    return FaultSpec(error=probs.get("error", 0.0), reset=probs.get("reset", 0.0), stall=probs.get("stall", 0.0),
                     slow_headers=probs.get("slow-headers", 0.0), stall_s=stall_s, slow_headers_s=slow_headers_s,
                     seed=seed)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    after_chunks: int  # for reset and stall on a stream


class FaultInjector:
    """One seeded draw per request: the same seed and arrival order give the same faults."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._edges = []
        edge = 0.0
        for kind, p in zip(KINDS, (spec.error, spec.reset, spec.stall, spec.slow_headers), strict=True):
            edge += p
            self._edges.append((edge, kind))

    def draw(self) -> Fault | None:
        u = self._rng.random()
        after = self._rng.randint(1, MAX_CHUNKS_BEFORE)  # drawn always, so one fault never shifts the others
        for edge, kind in self._edges:
            if u < edge:
                return Fault(kind, after)
        return None
