"""Runs of pure decode steps on the virtual clock, taken in one go.

Between two events that change a modeled engine's batch (an arrival, a request finishing, a preemption,
an admission), every step decodes one token for each running request, in the same order, and its modeled
time is `profile.step_s(0, B, context)` with the context growing by B a step. Stepping the engine through
such a stretch costs tens of microseconds per token in Python; `decode_run` takes the stretch at once and
leaves the engine exactly as the steps would have: the same step times (the same floating-point
operations, the same jitter draws, in the same order), the same tokens (the executor's hash, vectorised;
a private request's output ids are stand-ins until it is preempted, as nothing reads them: `_extend_tokens`),
the same blocks allocated and registered in the order the scheduler would, and the same counters. It
declines (returns None) whenever the next step could be anything else, and the caller steps the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from weakref import WeakKeyDictionary

from reference_engine.engine import LLMEngine, NullObserver
from reference_engine.executor.modeled_executor import ModeledExecutor
from reference_engine.sequence import NEVER_PRIVATE, Sequence
from slobench.fleet.sim_blocks import SimBlockManager


def _tokens_ahead(ex: ModeledExecutor, seqs: list[Sequence], starts: list[int] | None = None,
                  ends: list[int] | None = None) -> list[list[int]]:
    """`ex.token_at(seq_id, position)` for positions `starts`..`ends` of each seq (by default every position
    it may still sample: from its length to its prompt plus max_tokens), in one vectorised pass."""
    if starts is None:
        starts = [len(s.token_ids) for s in seqs]
    if ends is None:
        ends = [s.num_prompt_tokens + s.max_tokens for s in seqs]
    return ex.tokens_at([s.seq_id for s in seqs], starts, ends)


# Per engine: seq_id -> (the position of its first token there, every token it may still sample from there).
# A request's tokens are drawn once, at its first run, not a run at a time: most runs are short (an arrival or
# a finish ends each), and drawing a few tokens for every request of the batch cost more than the run itself.
_AHEAD: WeakKeyDictionary[LLMEngine, dict[int, tuple[int, list[int]]]] = WeakKeyDictionary()


def _draw_now(ex: ModeledExecutor, seq: Sequence) -> None:
    """`Sequence.draw_tokens`: every output id of `seq` as the executor draws it (stand-ins replaced)."""
    n = seq.num_prompt_tokens
    seq.token_ids[n:] = _tokens_ahead(ex, [seq], [n], [len(seq.token_ids)])[0]


_DRAWERS: WeakKeyDictionary[ModeledExecutor, Callable[[Sequence], None]] = WeakKeyDictionary()


class StandInPrompt:
    """`Sequence.draw_tokens` of a request that came in with stand-in prompt ids (a simulator's, for a prompt
    whose every block is private: nothing reads its ids unless it is preempted): writes its real prompt
    (`draw_prompt()`), then its output ids if a decode run gave them stand-ins too."""

    __slots__ = ("draw_prompt", "draw_outputs")

    def __init__(self, draw_prompt: Callable[[], tuple[int, ...]]) -> None:
        self.draw_prompt = draw_prompt
        self.draw_outputs: Callable[[Sequence], None] | None = None

    def __call__(self, seq: Sequence) -> None:
        prompt = self.draw_prompt()
        if len(prompt) != seq.num_prompt_tokens:
            raise AssertionError(f"seq {seq.seq_id}: a drawn prompt of {len(prompt)} ids for {seq.num_prompt_tokens} stand-ins")
        seq.token_ids[: len(prompt)] = prompt
        if self.draw_outputs is not None:
            self.draw_outputs(seq)


def _extend_tokens(engine: LLMEngine, ex: ModeledExecutor, seqs: list[Sequence], k: int) -> None:
    """Append each seq's next `k` tokens, as the executor draws them; a private request (its blocks past what
    any other prompt shares: slobench.fleet.sim_blocks) gets stand-ins, drawn only if it is ever
    preempted (`Sequence.draw_tokens`): nothing else reads a token of its output, and drawing them was a
    sixth of a simulation."""
    drawer = _DRAWERS.get(ex)
    if drawer is None:
        drawer = _DRAWERS[ex] = partial(_draw_now, ex)
    stand_ins = [ex.token_id_range[0]] * k
    drawn: list[Sequence] = []
    for s in seqs:
        if s.unshared_from != NEVER_PRIVATE:
            s.token_ids += stand_ins
            d = s.draw_tokens
            if d is drawer:
                continue
            if d is None:
                s.draw_tokens = drawer
            elif type(d) is StandInPrompt and d.draw_outputs is not drawer:
                d.draw_outputs = drawer
        else:
            drawn.append(s)
    if not drawn:
        return
    seqs = drawn
    store = _AHEAD.get(engine)
    if store is None:
        store = _AHEAD[engine] = {}
    new = [s for s in seqs if s.seq_id not in store]
    if new:
        if len(store) > 2 * len(engine.scheduler.running) + 256:  # drop the finished (and the preempted)
            keep = {s.seq_id for s in engine.scheduler.running}
            for sid in [sid for sid in store if sid not in keep]:
                del store[sid]
        for s, toks in zip(new, _tokens_ahead(ex, new), strict=True):
            store[s.seq_id] = (len(s.token_ids), toks)
    for s in seqs:
        base, toks = store[s.seq_id]
        a = len(s.token_ids) - base
        s.token_ids += toks[a : a + k]


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__
class DecodeRun:
    """What a run of decode steps did: every request in `seqs` got one token at the end of each step, from
    the step `first_step` names for it (a prompt filled in the run samples its first token at the end of
    its last chunk), else from the first."""

    seqs: list[Sequence]  # batch order
    times_s: list[float]  # the end of each step
    finished: list[Sequence]  # ended ("length"): with the last step, or with the step `ends` says
    first_token_cached: dict[int, int | None]  # seq_id -> its prefix-cache hit, for those whose first token came here
    first_step: dict[int, int] = field(default_factory=dict)  # seq_id -> index of its first token's step, if not 0
    ends: dict[int, int] = field(default_factory=dict)  # seq_id -> its tokens here, if it finished before the last step


THROUGH_STEPS = 256  # the most steps a run going past finishes takes: bounds its count of blocks to be taken


def _head_stays_out(head: Sequence, running: list[Sequence], bm: SimBlockManager, fill: Sequence | None = None) -> bool:
    """The queue's head cannot be admitted now, nor at any step of a decode run: decode steps only take
    blocks (fewer allocatable; a prompt filled chunk by chunk has all of its own already), and evicting a
    cached block its prefix hits on never lowers what the head needs by more than the allocatable pool
    loses. Only a newly registered block could lengthen its hits, and a run registers blocks that end past
    each running request's last computed token, whose parents chain through that request's own tokens: the
    head would have to share them all up to that block."""
    if bm.can_admit(head.num_tokens, bm.match_prefix(head)):
        return False
    bs = bm.block_size
    toks = head.token_ids
    # no block past what the head shares with another prompt can ever be a hit (its private blocks)
    limit = min(len(toks) - bs, head.unshared_from * bs)
    if not bm.enable_prefix_caching or limit <= 0:
        return True
    starts = [(s, (len(s.token_ids) - 1) // bs * bs) for s in running]  # the first block a run of s's steps fills
    if fill is not None:
        starts.append((fill, fill.num_computed_tokens // bs * bs))
    for s, start in starts:
        if start < limit and toks[0] == s.token_ids[0] and toks[:start] == s.token_ids[:start]:
            return False
    return True


def _admissions(sched: Any, decodes: list[Sequence], bm: SimBlockManager, first_alloc: list[int],
                budget: int) -> list[tuple[Sequence, list[int]]] | None:
    """The queue's heads the next step admits, with their prefix hits, if nothing in that step can differ
    from what decode_run replays. The scheduler admits heads while the token budget lasts, max_num_seqs
    leaves room and the blocks do (only the last may be cut into chunks); each must hold no blocks, have no
    stop check and tokens left to sample (a preempted one comes back to recompute what it had). Blocks are
    counted without the hits two of them share (never less than the scheduler needs): where that count says
    a head does not fit, it decides only if no head has hits.
    None of their hits may be among the cached blocks that the step's new blocks may evict (the scheduler
    matches each after the blocks taken before it). None otherwise: the caller steps the engine."""
    room = sched.config.max_num_seqs - len(sched.running)
    bs = bm.block_size
    need = fresh = first_alloc.count(0)
    hit_blocks: set[int] = set()
    out: list[tuple[Sequence, list[int]]] = []
    for head in sched.waiting:
        if budget <= 0 or len(out) == room:
            break  # the rest waits
        num = len(head.token_ids)
        if (head.num_computed_tokens or head.block_table or head.stop_check is not None
                or num - head.num_prompt_tokens >= head.max_tokens):
            return None
        hits = bm.match_prefix(head)
        head_need = bm.num_blocks_to_admit(num, hits)
        if need + head_need > bm.num_allocatable:
            if hits or hit_blocks:
                return None  # with hits the count is only a bound: whether the scheduler admits it is unknown
            break  # no hits: the count is exact, and the head waits for room (FIFO: so does the rest)
        need += head_need
        fresh += -(-num // bs) - len(hits)
        hit_blocks.update(hits)
        budget -= num - len(hits) * bs
        out.append((head, hits))
    if not out or budget < 0 and len(sched.running) + len(out) - 1 >= sched.config.max_num_batched_tokens:
        return None  # (or) the last prompt, cut into chunks, would get no budget from the next step's decodes
    # taking hits out of the LRU list moves later blocks up: look past as many as there are hits
    evicted = fresh - bm.num_free
    if evicted > 0 and hit_blocks and bm.evicts_any(hit_blocks, evicted + len(hit_blocks)):
        return None
    return out


def _filling(seq: Sequence, bs: int) -> bool:
    """A running request whose prompt is still being computed (chunk by chunk), which decode_run can carry:
    its blocks already hold every known token (admission gives them all), no stop check."""
    n = len(seq.token_ids)
    return (seq.num_computed_tokens < n - 1 and seq.stop_check is None and len(seq.block_table) * bs >= n
            and seq.num_tokens - seq.num_prompt_tokens < seq.max_tokens)


def decode_run(engine: LLMEngine, until_s: float, past_finishes: bool = True) -> DecodeRun | None:
    """Take every step up to the next event at once: while the engine's clock is before `until_s` (the next
    arrival), up to and including the step where the first running request samples its last token (those
    that do finish in it, with "length"), and short of any step that would preempt. With no queue and no
    prompt being filled, a finish ends nothing: the run goes on without the finished (`DecodeRun.ends`),
    unless `past_finishes` is False (a caller that has its own requests waiting for the blocks a finish frees).

    The first step may admit the queue's heads (`_admissions`) as the scheduler would, each prompt prefilled
    within the token budget the decodes (and the last chunk of a prompt being filled) leave. A prompt that
    does not fit whole (one at most: the last admitted, or the last running request) is filled chunk by
    chunk over the next steps, samples its first token at the end of its last chunk, and decodes with the
    rest from there. While heads still wait that a step could admit, the run stops short of the first step
    that leaves them budget: the next run admits them. Returns what it did, or None (nothing done) when the
    next step could be anything else, or the engine is not a modeled one with the simulator's block manager."""
    ex = engine.executor
    sched = engine.scheduler
    bm = sched.block_manager
    if (type(ex) is not ModeledExecutor or ex.samples_eos or not isinstance(bm, SimBlockManager)
            or engine.has_pending_aborts() or type(engine.observer) is not NullObserver):
        return None
    engine.apply_pending()  # what step() does first: arrivals join the queue (a full one keeps them out)
    cfg = sched.config
    bs = bm.block_size
    max_tokens = cfg.max_num_batched_tokens
    decodes = list(sched.running)
    fill: Sequence | None = None  # the request filling its prompt, if any: last in the batch
    if decodes and _filling(decodes[-1], bs):
        fill = decodes.pop()
    batch = len(decodes)  # decoding sequences
    if batch >= max_tokens:
        return None  # a budget cut could come next (or, at the budget exactly, no admission: rare, stepped)
    num_steps = 1 << 30
    # step j writes position len-1+j; a new block is taken when that position starts one past the table
    first_alloc: list[int] = []
    firsts0 = 0  # decodes whose prompt's last chunk was one token sample their first token in the first step
    context = 0  # the decodes' tokens in context at the next step
    starts: list[int] = []  # each decode's tokens before the run
    lefts: list[int] = []  # each decode's tokens it may still sample
    for s in decodes:
        n = len(s.token_ids)
        if s.stop_check is not None or s.num_computed_tokens != n - 1:
            return None
        # tokens it may still sample: the step that samples the last one finishes it, and ends the run
        if (left_s := s.max_tokens - (n - s.num_prompt_tokens)) < num_steps:
            num_steps = left_s
        lefts.append(left_s)
        first_alloc.append(len(s.block_table) * bs - n + 1)
        starts.append(n)
        context += n
        if n == s.num_prompt_tokens:
            firsts0 += 1
    if (cfg.scheduler == "vllm-v0" and sched.waiting and len(sched.running) < cfg.max_num_seqs
            and not _head_stays_out(sched.waiting[0], decodes, bm)):
        return None  # vllm-v0: the next step is the queue's prompts (or may be): stepped
    admitted = None
    filled: Sequence | None = None  # a prompt whose last chunk the first step takes, before the admissions
    # heads wait that a later step of the run could admit: the run stops short of that step
    queue_live = False
    if (sched.waiting and len(sched.running) < cfg.max_num_seqs
            and not _head_stays_out(sched.waiting[0], decodes, bm, fill)):
        # the filling prompt's chunk comes first in a step: while it takes the whole budget left, the queue
        # waits; its last chunk leaves the rest of the budget to the queue, in the same step
        rest = max_tokens - batch - (len(fill.token_ids) - fill.num_computed_tokens if fill is not None else 0)
        if rest == 0:
            return None  # its last chunk takes the budget exactly: the queue is admitted a step later (rare)
        if rest < 0:
            queue_live = True
        else:
            admitted = _admissions(sched, decodes, bm, first_alloc, rest)
            if admitted is None:
                return None  # the queue's head could be admitted, in a step not replayed here
            queue_live = len(admitted) < len(sched.waiting) and len(sched.running) + len(admitted) < cfg.max_num_seqs
            if fill is not None:
                filled, fill = fill, None  # its last chunk comes with the first step, then it decodes
    if not batch and fill is None and not admitted:
        return None
    clock, wait = engine.clock, engine.wait_until
    if num_steps < 1 or clock.now_s() >= until_s:
        return None
    profile = ex.profile
    roofline = profile.uses_pairs
    times: list[float] = []
    chunks: dict[int, int] = {}  # the filling prompt's chunk at each step until its last
    events: list[tuple[int, int, int, int]] = []  # (step, phase, index in `every`, computed tokens then)
    fill_from = 0  # the first step at which `fill` (if any) is carried by the loop below
    if admitted:
        # The first step, as the scheduler builds it: the decodes' new blocks, then each admission, its chunk
        # what the budget leaves. Done now (the clock is before until_s: the step is taken, whatever follows).
        grow0 = [s for s, j in zip(decodes, first_alloc, strict=True) if j == 0]
        if grow0:
            bm.grow_each(grow0)
        first_alloc = [j if j else bs for j in first_alloc]  # taken already
        left = max_tokens - batch
        prefill = extra_decodes = 0
        context0 = pairs0 = context
        whole: list[Sequence] = []  # prompts whose last chunk is in the first step, in batch order
        firsts = firsts0
        t0 = clock.now_s()
        # a prompt being filled is running: its last chunk comes before the admissions (hits None: not admitted)
        chunked: list[tuple[Sequence, list[int] | None]] = [(filled, None)] if filled is not None else []
        for head, hits in chunked + admitted:
            if hits is not None:
                engine.admit_head(head, hits, t0)
            start, length = head.num_computed_tokens, len(head.token_ids)
            n = min(length - start, left)
            left -= n
            context0 += start + n
            pairs0 += n * start + n * (n + 1) // 2
            if start + n == length:
                whole.append(head)
                firsts += length == head.num_prompt_tokens  # its first token, unless it was preempted
                if n == 1:
                    extra_decodes += 1  # a one-token chunk that samples: the executor counts it as a decode
                else:
                    prefill += n
            else:
                fill, fill_from = head, 1
                prefill += n
                chunks[0] = n
        step_s = profile.step_s(prefill, batch + extra_decodes, context0, pairs0 if roofline else None, firsts)
        ex.num_steps += 1
        ex.total_modeled_s += step_s
        wait(t0 + step_s)
        times.append(clock.now_s())
        last_tokens = batch + prefill + extra_decodes  # the first step's tokens: every chunk and decode in it
        # the whole prompts sampled their first token: decodes from the second step on
        for h in whole:
            length = len(h.token_ids)
            left_h = h.max_tokens - (length - h.num_prompt_tokens)
            num_steps = min(num_steps, left_h)
            lefts.append(left_h)
            starts.append(length)
            first_alloc.append(-(-length // bs) * bs - length + 1)
            context += length
            if bm.enable_prefix_caching and length % bs:
                events.append((0, 2, len(decodes), length))  # its prompt's full blocks, with the first step
            decodes.append(h)
        batch = len(decodes)
        context += batch
    decodes_end = num_steps  # no decode samples its last token before this step
    # With no queue and no prompt being filled, a request finishing frees what nothing is waiting for: the run
    # goes on with the rest of the batch (each step without those that finished), to the last one's finish,
    # the next arrival or THROUGH_STEPS (the next run goes on from there). Otherwise the first finish ends it.
    through = past_finishes and fill is None and not sched.waiting and batch > 1
    if through:
        by_end = sorted(range(batch), key=lefts.__getitem__)  # the decodes, the first to finish first
        num_steps = min(lefts[by_end[-1]], THROUGH_STEPS)
    room = bm.num_allocatable
    if fill is not None:
        length = len(fill.token_ids)
        pos = fill.num_computed_tokens + chunks.get(0, 0)
        budget = max_tokens - batch  # >= 1: checked above (no admission) or in _admissions
        fresh_fill = length == fill.num_prompt_tokens  # its last chunk samples the request's first token
        last_chunk = fill_from + -(-(length - pos) // budget) - 1
        num_steps = min(num_steps, last_chunk + fill.max_tokens - (length - fill.num_prompt_tokens))
    if queue_live:  # the queue's head may be admitted once a step leaves budget: stop before that step
        num_steps = min(num_steps, last_chunk if fill is not None else 1)
    if fill is not None:  # as a decode after its last chunk: position length-1+(j-last_chunk) at step j
        fill_alloc = last_chunk + 1 + len(fill.block_table) * bs - length
    # each takes at most a block every bs steps: count them only when that many could run out
    if (len(first_alloc) + (fill is not None)) * (num_steps // bs + 1) > room:
        # (through a run: counted as if no finish freed a block, which can only stop it sooner)
        allocs = ([range(j, min(num_steps, left), bs) for j, left in zip(first_alloc, lefts, strict=True)] if through
                  else [range(j, num_steps, bs) for j in first_alloc])
        if fill is not None:
            allocs.append(range(fill_alloc, num_steps, bs))
        if sum(len(r) for r in allocs) > room:  # stop before the step that would preempt
            steps = sorted(j for r in allocs for j in r)
            num_steps = steps[room]
    if num_steps < 1:
        return None  # (never after an admitting first step: its blocks were counted, and later ones start at 1)

    gone = 0  # through a run: by_end[:gone] finished (at the start of step j, those with fewer than j tokens left)
    live = batch
    while through and len(times) < num_steps and clock.now_s() < until_s:
        j = len(times)
        while lefts[by_end[gone]] <= j:  # (never all: num_steps is at most the last one's tokens left)
            i = by_end[gone]
            gone += 1
            live -= 1
            context -= starts[i] + j
        step_s = profile.step_s(0, live, context, None, firsts0 if j == 0 and not admitted else 0)
        ex.num_steps += 1
        ex.total_modeled_s += step_s
        wait(clock.now_s() + step_s)
        times.append(clock.now_s())
        context += live
    while len(times) < num_steps and clock.now_s() < until_s:
        j = len(times)
        firsts = firsts0 if j == 0 and not admitted else 0
        if fill is None:
            step_s = profile.step_s(0, batch, context, None, firsts)  # as ModeledExecutor.execute computes it
        elif j <= last_chunk:
            n = min(length - pos, budget)
            chunks[j] = n
            pairs = context + n * pos + n * (n + 1) // 2 if roofline else None
            if j == last_chunk and fresh_fill:
                firsts += 1
            if n == 1 and j == last_chunk:  # a one-token chunk that samples: the executor counts it as a decode
                step_s = profile.step_s(0, batch + 1, context + length, pairs, firsts)
            else:
                step_s = profile.step_s(n, batch, context + pos + n, pairs, firsts)
            pos += n
        else:
            step_s = profile.step_s(0, batch + 1, context + length + j - last_chunk, None, firsts)
        ex.num_steps += 1
        ex.total_modeled_s += step_s
        wait(clock.now_s() + step_s)
        times.append(clock.now_s())
        context += batch
    k = len(times)
    if not k:
        return None

    _extend_tokens(engine, ex, decodes, k)
    # through a run, those that finished before its last step: each one's tokens in it (all it had left)
    early = {i: lefts[i] for i in by_end[:gone]} if gone else None
    if early:
        for i, m in early.items():
            del decodes[i].token_ids[starts[i] + m:]
    # blocks taken (phase 0, in schedule) and registered (phase 2, in update) in the scheduler's order; the
    # first step's admissions (phase 1) came between, done above
    if k <= bs:  # (most runs: a block at most each)
        events += [(j0, 0, i, 0) for i, j0 in enumerate(first_alloc) if j0 < k]
    else:
        events += [(j, 0, i, 0) for i, j0 in enumerate(first_alloc) if j0 < k for j in range(j0, k, bs)]
    caching = bm.enable_prefix_caching
    if caching:  # a request past its shared blocks registers nothing more: left out (below)
        events += [(j, 2, i, n + j) for i, (s, n) in enumerate(zip(decodes, starts, strict=True))
                   if s.unshared_from > s.num_hashed_blocks for j in range((-n) % bs, k, bs)]
    seqs = decodes
    emitted = 0
    if fill is not None:
        i = batch
        computed = fill.num_computed_tokens
        for j in sorted(chunks):  # each chunk registers what it filled (a no-op when no block filled)
            computed += chunks[j]
            if bm.enable_prefix_caching:
                events.append((j, 2, i, computed))
        emitted = k - last_chunk
        if emitted > 0:
            _extend_tokens(engine, ex, [fill], emitted)
            events += [(j, 0, i, 0) for j in range(fill_alloc, k, bs)]
            if bm.enable_prefix_caching:  # as a decode: position length-1+(j-last_chunk) written at step j
                events += [(j, 2, i, length + j - last_chunk) for j in range(last_chunk + 1, k)
                           if (length + j - last_chunk) % bs == 0]
            seqs = [*decodes, fill]
            computed = length + k - 1 - last_chunk
    every = decodes if fill is None else [*decodes, fill]
    # requests whose last token came in the last step finish there (update() frees each in batch order)
    if through:  # those with no more tokens left than the steps: the first of the decodes sorted by that
        q = gone
        while q < batch and lefts[by_end[q]] <= k:
            q += 1
        finished = sorted(by_end[:q])
    else:
        finished = [i for i, s in enumerate(seqs) if s.max_tokens == len(s.token_ids) - s.num_prompt_tokens] if (
            k >= decodes_end or fill is not None) else []
    if early:  # nothing of theirs after their last step, where they finish
        events = [e for e in events if e[2] not in early or e[0] < early[e[2]]]
        events += [(early.get(i, k) - 1, 3, i, 0) for i in finished]
    else:
        events += [(k - 1, 3, i, 0) for i in finished]
    events.sort()
    first_step: dict[int, int] = {}
    # before any finishes: a finished request's state is gone (a prompt whose last chunk was one token, or came
    # with the first step, samples its first token there)
    first = engine.tokens_sampled(decodes, times[0], times[-1])
    if seqs is not decodes:  # the filled prompt decoded after its last chunk: its tokens from that step on
        assert fill is not None
        first.update(engine.tokens_sampled([fill], times[last_chunk], times[-1]))
        if last_chunk:
            first_step[fill.seq_id] = last_chunk
    ends: dict[int, int] = {}  # seq_id -> its tokens in the run, where fewer than the steps
    if early:
        for i, m in early.items():
            ends[decodes[i].seq_id] = m
            engine.tokens_sampled([decodes[i]], times[0], times[m - 1])
    grow: list[Sequence] = []  # consecutive allocations, taken together in the same order
    for _j, phase, i, computed_then in events:
        s = every[i]
        if phase == 0:
            grow.append(s)
            continue
        if grow:
            bm.grow_each(grow)
            grow = []
        if phase == 2:
            s.num_computed_tokens = computed_then
            bm.register_computed(s)
        else:
            if s.unshared_from <= s.num_hashed_blocks and caching:  # what its left-out registrations counted
                s.num_hashed_blocks = (len(s.token_ids) - 1) // bs
            engine.finish_by_length(s, times[_j])
    if grow:
        bm.grow_each(grow)
    k1 = k - 1
    for s, n in zip(decodes, starts, strict=True):
        s.num_computed_tokens = done_tokens = n + k1
        if caching and s.unshared_from <= s.num_hashed_blocks and s.block_table:
            s.num_hashed_blocks = done_tokens // bs
    if early:
        for i, m in early.items():  # (finished: no blocks left to count hashes of)
            decodes[i].num_computed_tokens = starts[i] + m - 1
    if fill is not None:
        fill.num_computed_tokens = computed
    if k == 1 and admitted:
        last_step_tokens = last_tokens
    elif fill is not None and k - 1 <= last_chunk:
        last_step_tokens = batch + chunks[k - 1]
    else:
        last_step_tokens = live + (fill is not None)
    engine.steps_taken(k, last_step_tokens,
                       batch * k + max(emitted, 0) - (sum(k - m for m in early.values()) if early else 0))
    return DecodeRun(seqs, times, [seqs[i] for i in finished], first, first_step, ends)

