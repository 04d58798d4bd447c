"""The reasoning/answer split on the virtual clock, as the token test server's reasoning mode streams it live.

A request that asks for k reasoning tokens (`x_reasoning_tokens`, `slobench.workload.reasoning`) on the chat
or Responses API streams its first k tokens as reasoning and the rest as the answer; its usage says k. Its
simulated record says the same: `first_reasoning_s` its first token's time, `first_answer_s` the time of
token k + 1 (None where every token was reasoning: a completed request with no answer), `reasoning_tokens`
min(k, tokens produced) from "usage". The completions API has no reasoning channel, live or simulated: its
records carry no split. The planned k rides on the record's `reasoning_tokens` from the arrival until the
record is finished (`split_reasoning`), so the session plan reads the answer's length as the live runner does.
"""

from __future__ import annotations

from slobench.run.records import RequestRecord, RequestSpec
from slobench.workload.reasoning import planned_reasoning

__all__ = ["plan_reasoning", "split_reasoning"]


def plan_reasoning(sp: RequestSpec, rec: RequestRecord, api: str) -> None:
    """At `sp`'s arrival: the reasoning it asks for, on its record (none on the completions API)."""
    if api != "completions" and (k := planned_reasoning(sp)):
        rec.reasoning_tokens = k


def split_reasoning(rec: RequestRecord) -> None:
    """A finished record's reasoning and answer split, from its chunk times (one token a chunk)."""
    k = rec.reasoning_tokens
    if k is None or rec.reasoning_tokens_source is not None:
        return
    times = rec.chunk_times_s
    if not times:  # refused, or failed before a token: nothing streamed on either channel
        rec.reasoning_tokens = None
        return
    k = min(k, len(times))
    rec.reasoning_tokens, rec.reasoning_tokens_source = k, "usage"
    rec.first_reasoning_s = times[0]
    rec.first_answer_s = times[k] if k < len(times) else None
