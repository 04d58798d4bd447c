"""Runs of pure decode steps on the virtual clock, taken in one go.

Between two events that change a modeled engine's batch (an arrival, a request finishing, a preemption,
an admission), every step decodes one token for each running request, in the same order, and its modeled
time is `profile.step_s(0, B, context)` with the context growing by B a step. Stepping the engine through
such a stretch costs tens of microseconds per token in Python; `decode_run` takes the stretch at once and
leaves the engine exactly as the steps would have: the same step times (the same floating-point
operations, the same jitter draws, in the same order), the same tokens (the executor's hash, vectorised),
the same blocks allocated and registered in the order the scheduler would, and the same counters. It
declines (returns None) whenever the next step could be anything else, and the caller steps the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from reference_engine.block_manager import BlockManager
from reference_engine.engine import LLMEngine, _NullObserver
from reference_engine.executor.modeled_executor import ModeledExecutor, _mix64
from reference_engine.sequence import FinishReason, Sequence

_C0, _C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """`modeled_executor._mix64` on uint64 arrays (numpy's uint64 arithmetic wraps as the mask does)."""
    x = x + _C0
    x = (x ^ (x >> _S30)) * _C1
    x = (x ^ (x >> _S27)) * _C2
    return x ^ (x >> _S31)


@lru_cache(maxsize=1 << 14)
def _head(x: int) -> int:
    return _mix64(x)  # a request's first hash, the same for each of its steps


def _tokens(ex: ModeledExecutor, seqs: list[Sequence], num_steps: int) -> list[list[int]]:
    """`ex.token_at(seq_id, position)` for each seq's next `num_steps` positions (EOS never drawn)."""
    seed = ex._seed << 32
    heads = np.array([_head(s.seq_id ^ seed) for s in seqs], dtype=np.uint64)
    first = np.array([len(s.token_ids) for s in seqs], dtype=np.uint64)
    pos = first[:, None] + np.arange(num_steps, dtype=np.uint64)[None, :]
    r = _mix64_array(heads[:, None] ^ pos)
    lo, span = np.uint64(ex._lo), np.uint64(ex._span)
    tok = lo + (r >> _S32) % span
    if ex.eos_token_id is not None and ex._lo <= ex.eos_token_id < ex._lo + ex._span:
        eos = np.uint64(ex.eos_token_id)
        tok = np.where(tok == eos, lo + (tok - lo + np.uint64(1)) % span, tok)
    out: list[list[int]] = tok.tolist()
    return out


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """What a run of decode steps did: every request in `seqs` got one token at the end of each step."""

    seqs: list[Sequence]  # batch order
    times_s: list[float]  # the end of each step
    finished: list[Sequence]  # ended ("length") with the last step
    first_token_cached: dict[int, int | None]  # seq_id -> its prefix-cache hit, for those whose first token came here


def _head_stays_out(head: Sequence, running: list[Sequence], bm: BlockManager) -> bool:
    """The queue's head cannot be admitted now, nor at any step of a decode run: decode steps only take
    blocks (fewer allocatable), and evicting a cached block its prefix hits on never lowers what the head
    needs by more than the allocatable pool loses. Only a newly registered block could lengthen its hits,
    and a run registers blocks that end past each running request's last token, whose parents chain through
    that request's own tokens: the head would have to share them all up to that block."""
    if bm.can_admit(head.num_tokens, bm.match_prefix(head)):
        return False
    if not bm.enable_prefix_caching:
        return True
    bs = bm.block_size
    toks = head.token_ids
    for s in running:
        start = (len(s.token_ids) - 1) // bs * bs  # first block a run of s's steps fills
        if start + bs < len(toks) and toks[0] == s.token_ids[0] and toks[:start] == s.token_ids[:start]:
            return False
    return True


def decode_run(engine: LLMEngine, until_s: float) -> DecodeRun | None:
    """Take every step up to the next event at once: while the engine's clock is before `until_s` (the next
    arrival), up to and including the step where the first running request samples its last token (those
    that do finish in it, with "length"), and short of any step that would preempt. Returns what it did, or None (nothing
    done) when the next step is not a plain decode step of a modeled engine."""
    ex = engine.executor
    if (type(ex) is not ModeledExecutor or ex._eos_threshold or engine._pending_aborts
            or type(engine.observer) is not _NullObserver):
        return None
    if engine._pending_adds:
        engine._apply_pending()  # what step() does first: arrivals join the queue (a full one keeps them out)
    sched = engine.scheduler
    cfg = sched.config
    running = list(sched.running)
    batch = len(running)
    if not batch or batch >= cfg.max_num_batched_tokens:
        return None  # a budget cut could come next (or, at the budget exactly, no admission: rare, stepped)
    bm = sched.block_manager
    if sched.waiting and batch < cfg.max_num_seqs and not _head_stays_out(sched.waiting[0], running, bm):
        return None  # the queue's head could be admitted
    num_steps = 1 << 30
    for s in running:
        n = len(s.token_ids)
        if s.stop_check is not None or s.num_computed_tokens != n - 1:
            return None
        # tokens it may still sample: the step that samples the last one finishes it, and ends the run
        num_steps = min(num_steps, s.max_tokens - (n - s.num_prompt_tokens))
    if num_steps < 1:
        return None
    bs = bm.block_size
    # step j writes position len-1+j; a new block is taken when that position starts one past the table
    first_alloc = [len(s.block_table) * bs - (len(s.token_ids) - 1) for s in running]
    allocs = [range(j, num_steps, bs) for j in first_alloc]
    if sum(len(r) for r in allocs) > bm.num_allocatable:  # stop before the step that would preempt
        steps = sorted(j for r in allocs for j in r)
        num_steps = steps[bm.num_allocatable]
    if num_steps < 1:
        return None

    clock, wait = engine.clock, engine._wait_until
    profile = ex.profile
    context = sum(len(s.token_ids) for s in running)
    times: list[float] = []
    while len(times) < num_steps and clock.now_s() < until_s:
        step_s = profile.step_s(0, batch, context)  # as ModeledExecutor.execute computes it
        ex.num_steps += 1
        ex.total_modeled_s += step_s
        wait(clock.now_s() + step_s)
        times.append(clock.now_s())
        context += batch
    k = len(times)
    if not k:
        return None

    tokens = _tokens(ex, running, k)
    starts = [len(s.token_ids) for s in running]
    for s, toks in zip(running, tokens, strict=True):
        s.token_ids.extend(toks)
    # blocks taken (phase 0, in schedule) and registered (phase 1, in update) in the scheduler's order
    events: list[tuple[int, int, int]] = [(j, 0, i) for i, j0 in enumerate(first_alloc) for j in range(j0, k, bs)]
    if bm.enable_prefix_caching:
        events += [(j, 1, i) for i, n in enumerate(starts) for j in range((-n) % bs, k, bs)]
    # requests whose last token came in the last step finish there (update() frees each in batch order)
    finished = [i for i, s in enumerate(running) if s.max_tokens == len(s.token_ids) - s.num_prompt_tokens]
    events += [(k - 1, 2, i) for i in finished]
    events.sort()
    grow: list[Sequence] = []  # consecutive allocations, taken together in the same order
    for j, phase, i in events:
        s = running[i]
        if phase == 0:
            grow.append(s)
            continue
        if grow:
            bm.grow_each(grow)
            grow = []
        s.num_computed_tokens = starts[i] + j
        if phase == 1:
            bm.register_computed(s)
        else:
            sched._finish(s, FinishReason.LENGTH)
    if grow:
        bm.grow_each(grow)
    for s, n in zip(running, starts, strict=True):
        s.num_computed_tokens = n + k - 1
    engine.num_steps += k
    engine.last_step_num_tokens = batch
    engine.num_generation_tokens += batch * k
    requests = engine._requests
    t_end = times[-1]
    first: dict[int, int | None] = {}
    for s in running:
        req = requests[s.seq_id]
        if req.first_token_s is None:  # its prefill's last chunk was one token: this run samples its first
            req.first_token_s = times[0]
            engine.num_prompt_tokens += s.num_prompt_tokens
            first[s.seq_id] = req.cached_tokens
        req.last_token_s = t_end
    for i in finished:
        engine._finished(requests[running[i].seq_id], FinishReason.LENGTH, t_end)
    return DecodeRun(running, times, [running[i] for i in finished], first)

