"""Prefix reuse in a trace with Mooncake-style `hash_ids`, measured (`trace_reuse`, `prompt_reuse`) and
fitted as shared-prefix groups (`fit_prefix_groups`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from slobench.run.records import RequestSpec
from slobench.workload.sessions import SystemPrompts
from slobench.workload.traces import TraceEntry

__all__ = ["PrefixFit", "fit_prefix_groups", "prompt_reuse", "trace_reuse"]

MAX_GROUPS = 1024  # the most popular groups kept; the rest are counted as requests without a group


@dataclass(frozen=True, slots=True)
class Reuse:
    reused_tokens: int
    prompt_tokens: int
    num_requests_reusing: int
    num_requests: int

    @property
    def share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _leading_seen(ids: Sequence[int], seen: set[int]) -> int:
    k = 0
    for h in ids:
        if h not in seen:
            break
        k += 1
    return k


def trace_reuse(entries: Iterable[TraceEntry], block_tokens: int) -> Reuse:
    """Prefix reuse of a trace's requests in arrival order.

    A request reuses the leading blocks of its prompt that some earlier request already had (what a
    prefix cache without evictions could serve): the longest leading run of its `hash_ids` seen before, times
    the block size, at most its input length. Mooncake's ids hash each block with the blocks before it, so a
    repeated id means its whole prefix repeats. The share is reused tokens over all prompt tokens. Generated
    prompts are measured the same way, their token blocks hashed in a chain (`prompt_reuse`).
    """
    seen: set[int] = set()
    reused = total = num_reusing = n = 0
    for e in entries:
        k = _leading_seen(e.hash_ids, seen)
        seen.update(e.hash_ids)
        r = min(k * block_tokens, e.input_tokens)
        reused += r
        total += e.input_tokens
        num_reusing += r > 0
        n += 1
    return Reuse(reused, total, num_reusing, n)


def prompt_reuse(specs: Iterable[RequestSpec], block_tokens: int) -> Reuse:
    """The same measure on generated token-id prompts: each prompt cut in blocks, each block hashed
    with the hash of the blocks before it."""
    seen: set[int] = set()
    reused = total = num_reusing = n = 0
    for s in specs:
        p = s.prompt
        ids: list[int] = []
        h = 0
        for i in range(0, len(p), block_tokens):
            h = hash((h, p[i : i + block_tokens]))
            ids.append(h)
        k = _leading_seen(ids, seen)
        seen.update(ids)
        r = min(k * block_tokens, len(p))
        reused += r
        total += len(p)
        num_reusing += r > 0
        n += 1
    return Reuse(reused, total, num_reusing, n)


@dataclass(frozen=True, slots=True)
class PrefixFit:
    trace: Reuse
    prompts: SystemPrompts
    own_tokens: np.ndarray  # each trace request's input less its group's prefix (>= 1), in entry order
    num_groups_found: int  # groups of two or more requests, before MAX_GROUPS

    def __str__(self) -> str:
        lost = self.num_groups_found - self.prompts.num_groups
        tail = f" (the {lost} least popular left without a group)" if lost > 0 else ""
        lengths = np.array(self.prompts.lengths())
        return (f"prefix reuse: {self.trace.share:.1%} of prompt tokens reused, {self.trace.num_requests_reusing} "
                f"of {self.trace.num_requests} requests; model: {self.prompts.num_groups} shared-prefix groups"
                f"{tail}, prefix p50 {np.median(lengths):.0f} / max {lengths.max()} tokens, "
                f"{self.prompts.share:.1%} of requests in a group")


def fit_prefix_groups(entries: Sequence[TraceEntry], block_tokens: int) -> PrefixFit | None:
    """Shared-prefix groups from the entries' hash_ids; None when no request reuses a prefix.

    Requests whose first block is the same form a group (a system prompt,
    or one conversation's turns); each group of two or more requests becomes one `system_prompts` group with
    its popularity (its request count) and a prefix of the mean tokens its later requests reused, so a
    generated run reuses about as many tokens per group as the trace. Requests alone in their group take
    none (`share`). The input lengths the spec draws are then each request's own part: its input less its
    group's prefix. Prefixes are whole blocks (the mean rounded), as the reuse is counted. What it does
    not keep: a conversation's prefix growing turn by turn (each group has one prefix length) and which
    groups come when; `fit` prints the trace's share against a generated run's.
    """
    reuse = trace_reuse(entries, block_tokens)
    if reuse.reused_tokens == 0:
        return None
    seen: set[int] = set()
    members: dict[int, list[int]] = {}  # first block -> entry indexes
    reused = np.zeros(len(entries), dtype=np.int64)
    for i, e in enumerate(entries):
        reused[i] = min(_leading_seen(e.hash_ids, seen) * block_tokens, e.input_tokens)
        seen.update(e.hash_ids)
        if e.hash_ids:
            members.setdefault(e.hash_ids[0], []).append(i)
    groups = sorted((m for m in members.values() if len(m) >= 2), key=len, reverse=True)
    kept = groups[:MAX_GROUPS]
    # whole blocks: a prefix that ended inside a block would share none of that block's tokens (a prefix
    # cache, like this measure, reuses whole blocks)
    lengths = [block_tokens * max(1, round(float(reused[m[1:]].mean()) / block_tokens)) for m in kept]
    own = np.array([e.input_tokens for e in entries], dtype=np.int64)
    for m, length in zip(kept, lengths, strict=True):
        own[m] = np.maximum(own[m] - length, 1)
    in_group = sum(len(m) for m in kept)
    prompts = SystemPrompts(len(kept), tuple(lengths), weights=tuple(float(len(m)) for m in kept),
                            share=round(in_group / len(entries), 6))
    return PrefixFit(reuse, prompts, own, len(groups))
