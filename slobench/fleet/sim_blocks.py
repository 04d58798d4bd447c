"""The simulator's block manager (`SimBlockManager`: the engine's `PrivateBlockManager`, which keys blocks by
an unkeyed hash and keeps each request's private blocks without per-block bookkeeping), and
`shared_prefix_blocks`, which tells before the run which blocks of each prompt are private.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC

from reference_engine.private_blocks import PrivateBlockManager

SimBlockManager = PrivateBlockManager  # (the simulator's name for it)


def shared_prefix_blocks(prompts: SequenceABC[SequenceABC[int]], block_size: int) -> list[int]:
    """For each prompt, how many of its leading full blocks some other prompt also holds in full, at the same
    place after the same tokens (the only blocks another request's lookup could ever hit): the longest
    common prefix with any other prompt, in whole blocks. Prompts that share no first block (the usual
    case) cost one slice each; the others are sorted, and each compared with its neighbours, which hold its
    longest common prefix."""
    bs = block_size
    out = [0] * len(prompts)
    by_first: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        if len(p) >= bs:
            by_first.setdefault(tuple(p[:bs]), []).append(i)
    for group in by_first.values():
        if len(group) < 2:
            continue
        group.sort(key=lambda i: tuple(prompts[i]))
        for a, b in zip(group, group[1:], strict=False):
            pa, pb = prompts[a], prompts[b]
            lo, hi = 1, min(len(pa), len(pb)) // bs  # lo blocks are known equal (the same first block)
            while lo < hi:  # the most whole blocks equal in both
                mid = (lo + hi + 1) // 2
                if tuple(pa[: mid * bs]) == tuple(pb[: mid * bs]):
                    lo = mid
                else:
                    hi = mid - 1
            out[a], out[b] = max(out[a], lo), max(out[b], lo)
    return out
