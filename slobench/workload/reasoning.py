"""Reasoning in a workload: a share of each answer's tokens is reasoning, the rest the answer (`[reasoning]`).

A reasoning model's answer has two parts, each streamed on its own channel: the reasoning first, then the
answer (what TTFA and answer TPOT measure, `slobench.analysis.summary`). How much of an answer is reasoning
is the model's; a workload says how much it *plans*: `share` of each request's output tokens,
floor(share × max_tokens), so an answer of n tokens has n − floor(share × n) answer tokens. Each request
asks for that split in its body's `x_reasoning_tokens`, which the token test server (`slobench.testing`,
its reasoning mode) and the simulator (`slobench.fleet.sim_reasoning`) produce exactly, on the chat and
Responses APIs (the completions API has no reasoning channel); a real reasoning model reasons as it
does and ignores the field (vLLM and SGLang accept unknown body fields; a server that refuses them
refuses the workload, by name, in the recorded errors).

A session's next turn carries the conversation's answers without their reasoning, as chat clients
resend a reasoning model's history (`slobench.workload.sessions`, `slobench.run.session_plan`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slobench.errors import SpecError
from slobench.run.records import RequestSpec

__all__ = ["REASONING_FIELD", "ReasoningSpec", "answer_tokens", "planned_reasoning"]

REASONING_FIELD = "x_reasoning_tokens"


@dataclass(frozen=True, slots=True)
class ReasoningSpec:
    """`share`: the fraction of each answer's tokens planned as reasoning, from 0 up to (not including) 1."""

    share: float

    def __post_init__(self) -> None:
        s = self.share
        if isinstance(s, bool) or not isinstance(s, int | float) or not (math.isfinite(s) and 0 <= s < 1):
            raise SpecError("share", s, "the reasoning share of each answer must be a number >= 0 and < 1")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReasoningSpec:
        for key in d:
            if key != "share":
                raise SpecError(str(key), d[key], "unknown key; allowed: ['share']")
        if "share" not in d:
            raise SpecError("share", None, "[reasoning] needs share, e.g. share = 0.6")
        return cls(d["share"])

    def to_dict(self) -> dict[str, Any]:
        return {"share": self.share}

    def tokens(self, max_tokens: int) -> int:
        """The reasoning tokens planned for an answer of `max_tokens`."""
        return math.floor(self.share * max_tokens)

    def body(self, max_tokens: int) -> tuple[tuple[str, Any], ...]:
        """A request's `extra_body` asking for that split (none where it plans no reasoning)."""
        k = self.tokens(max_tokens)
        return ((REASONING_FIELD, k),) if k else ()


def planned_reasoning(spec: RequestSpec) -> int:
    """The reasoning tokens `spec` asks for (0 where it asks for none)."""
    for key, value in spec.extra_body:
        if key == REASONING_FIELD and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, spec.max_tokens)
    return 0


def answer_tokens(spec: RequestSpec) -> int:
    """The answer tokens `spec` plans: its max_tokens less the planned reasoning."""
    return spec.max_tokens - planned_reasoning(spec)
