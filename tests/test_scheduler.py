"""Scheduler + block manager: chunked prefill, budgets, preemption, admission gates, the NOTES bugs, and a
hypothesis property test over random add / step / abort sequences.

`KVEcho` is an executor that keeps a fake KV cache (one token id per slot), writes each chunk's tokens to the
slots its block table names, and samples the next token as a hash of the *context it reads back from the
cache*. Any scheduling bug that serves wrong or unwritten KV (a bad prefix hit, a stale computed count after
a preemption, attending past what was written) changes the tokens, which are compared with a dense
reference computed straight from the token list.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.block_manager import cdiv
from reference_engine.config import EngineConfig
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.scheduler import RequestRejected, Scheduler
from reference_engine.sequence import SeqStatus, Sequence

VOCAB = 1000
EOS = 999


def next_token(context: list[int], eos_every: int = 0, allow_eos: bool = True) -> int:
    """The dense reference: a deterministic function of the whole context. `allow_eos` False masks EOS (a
    request short of its min_tokens): the id it would have been otherwise comes instead."""
    h = 1469598103934665603
    for t in context:
        h = ((h ^ t) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    if allow_eos and eos_every and h % eos_every == 0:
        return EOS
    return h % (VOCAB - 1)


class KVEcho:
    def __init__(self, num_blocks: int, block_size: int, eos_every: int = 0) -> None:
        self.block_size, self.num_blocks, self.vocab_size = block_size, num_blocks, VOCAB
        self.eos_token_id = EOS
        self.eos_every = eos_every
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.batches: list[StepBatch] = []

    def _slot(self, table: list[int], pos: int) -> int:
        bs = self.block_size
        assert pos // bs < len(table), f"position {pos} has no block in {table}"
        return table[pos // bs] * bs + pos % bs

    def execute(self, batch: StepBatch) -> StepResult:
        self.batches.append(batch)
        tokens: list[int | None] = []
        for c in batch.chunks:
            for i, t in enumerate(c.token_ids):
                self.slots[self._slot(c.block_table, c.start_pos + i)] = t
        for c in batch.chunks:
            end = c.start_pos + len(c.token_ids)
            context = [self.slots[self._slot(c.block_table, p)] for p in range(end)]
            assert None not in context, f"seq {c.seq_id} read unwritten KV"
            allow_eos = c.num_generated >= c.sampling.min_tokens
            tokens.append(next_token(context, self.eos_every, allow_eos) if c.sample else None)  # type: ignore[arg-type]
        return StepResult(tokens)


def reference_output(prompt: list[int], max_tokens: int, eos_every: int = 0, ignore_eos: bool = False,
                     min_tokens: int = 0) -> list[int]:
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        t = next_token(ctx, eos_every, allow_eos=len(out) >= min_tokens)
        ctx.append(t)
        out.append(t)
        if t == EOS and not ignore_eos:
            break
    return out


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(block_size=4, num_blocks=32, max_num_seqs=8, max_num_batched_tokens=64,
                                   max_model_len=512, prefix_hash_key=b"k")
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def setup(eos_every: int = 0, **kw: object) -> tuple[Scheduler, KVEcho]:
    cfg = config(**kw)
    return Scheduler(cfg, eos_token_id=EOS), KVEcho(cfg.num_blocks, cfg.block_size, eos_every)


def step(s: Scheduler, ex: KVEcho) -> StepBatch:
    batch = s.schedule()
    s.update(batch, ex.execute(batch))
    s.check()
    return batch


def run_all(s: Scheduler, ex: KVEcho, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        if not s.has_work():
            return
        step(s, ex)
    raise AssertionError("did not drain")


def seq(sid: int, prompt: list[int], max_tokens: int = 4, **kw: object) -> Sequence:
    return Sequence(sid, list(prompt), max_tokens, **kw)  # type: ignore[arg-type]


# ---- chunked prefill and budgets ----------------------------------------------------------------------
def test_chunked_prefill_attends_only_to_written_kv() -> None:
    """NOTES bug 3: each chunk's attention length is num_computed + num_scheduled, never the prompt length."""
    s, ex = setup(max_num_batched_tokens=5)
    a = seq(0, list(range(1, 14)), max_tokens=2)
    s.add(a)
    starts = []
    while a.status is not SeqStatus.FINISHED:
        batch = step(s, ex)
        c = batch.chunks[0]
        starts.append((c.start_pos, len(c.token_ids), c.sample))
        assert len(c.block_table) == cdiv(c.start_pos + len(c.token_ids), 4)
    assert starts == [(0, 5, False), (5, 5, False), (10, 3, True), (13, 1, True)]
    assert a.output_token_ids == reference_output(list(range(1, 14)), 2)


def test_running_first_then_waiting_fifo_under_one_budget() -> None:
    s, ex = setup(max_num_batched_tokens=8)
    s.add(seq(0, [1] * 6))
    step(s, ex)  # seq 0 prefilled, decoding now
    s.add(seq(1, [2] * 10))
    s.add(seq(2, [3] * 3))
    batch = step(s, ex)
    assert [(c.seq_id, len(c.token_ids)) for c in batch.chunks] == [(0, 1), (1, 7)]
    batch = step(s, ex)
    assert [(c.seq_id, len(c.token_ids)) for c in batch.chunks] == [(0, 1), (1, 3), (2, 3)]


def test_max_num_seqs_caps_the_batch() -> None:
    s, ex = setup(max_num_seqs=2)
    for i in range(4):
        s.add(seq(i, [i + 1] * 3))
    batch = step(s, ex)
    assert [c.seq_id for c in batch.chunks] == [0, 1]
    assert s.num_running == 2 and s.num_waiting == 2


# ---- block boundaries (NOTES bug 4) --------------------------------------------------------------------
@pytest.mark.parametrize("prompt_len", [3, 4, 5, 8])
def test_decode_across_block_boundaries(prompt_len: int) -> None:
    s, ex = setup()
    a = seq(0, list(range(10, 10 + prompt_len)), max_tokens=9)
    s.add(a)
    while a.status is not SeqStatus.FINISHED:
        batch = step(s, ex)
        c = batch.chunks[0]
        end = c.start_pos + len(c.token_ids)
        assert len(c.block_table) == cdiv(end, 4)  # exactly the blocks holding KV: no more, no less
    assert a.output_token_ids == reference_output(list(range(10, 10 + prompt_len)), 9)
    assert s.block_manager.num_in_use == 0


def test_request_exactly_filling_the_cache_completes() -> None:
    """NOTES bugs 4 and 7: prompt + max_tokens - 1 KV slots == the whole cache fits; one more never can."""
    s, ex = setup(num_blocks=4)  # 16 slots
    a = seq(0, list(range(1, 9)), max_tokens=9)  # 8 + 9 - 1 = 16
    s.add(a)
    run_all(s, ex)
    assert a.finish_reason == "length" and len(a.output_token_ids) == 9
    assert a.output_token_ids == reference_output(list(range(1, 9)), 9)
    assert s.num_preemptions == 0


def test_request_bigger_than_the_cache_is_rejected_at_admission() -> None:
    s, _ = setup(num_blocks=4)
    with pytest.raises(RequestRejected, match="could never complete") as info:
        s.add(seq(0, list(range(1, 9)), max_tokens=10))  # 17 slots
    assert info.value.param == "max_tokens"
    assert not s.has_work()
    s.check()


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "match"),
    [(0, 4, "empty"), (3, 0, "max_tokens"), (500, 100, "maximum context length")],
)
def test_invalid_requests_rejected_without_state_change(prompt_len: int, max_tokens: int, match: str) -> None:
    s, _ = setup(num_blocks=400)
    with pytest.raises(RequestRejected, match=match):
        s.add(seq(0, [1] * prompt_len, max_tokens=max_tokens))
    assert not s.has_work()


# ---- admission gate (NOTES bug 6) ----------------------------------------------------------------------
def test_admission_needs_the_whole_prompt_to_fit_not_just_a_chunk() -> None:
    s, ex = setup(num_blocks=8, max_num_batched_tokens=4)
    s.add(seq(0, [1] * 20, max_tokens=8))  # 5 blocks for its prompt
    step(s, ex)
    s.add(seq(1, [2] * 16, max_tokens=2))  # 4 blocks: its first chunk (1 block) would fit, the whole not
    for _ in range(3):
        batch = step(s, ex)
        assert all(c.seq_id == 0 for c in batch.chunks)
    assert s.num_waiting == 1
    run_all(s, ex)
    assert s.num_preemptions == 0


# ---- preemption ---------------------------------------------------------------------------------------
def test_preemption_evicts_newest_to_front_of_queue_and_admits_nobody_that_step() -> None:
    s, ex = setup(num_blocks=6, enable_prefix_caching=False)
    a, b, c = seq(0, [1] * 8, max_tokens=12), seq(1, [2] * 8, max_tokens=12), seq(2, [3] * 2, max_tokens=2)
    s.add(a)
    s.add(b)
    step(s, ex)  # both admitted: 4 blocks in use, 2 free
    s.add(c)
    for _ in range(20):
        before = s.num_preemptions
        batch = step(s, ex)
        if s.num_preemptions > before:
            assert b.status is SeqStatus.WAITING and s.waiting[0] is b
            assert b.num_computed_tokens == 0 and b.block_table == []
            assert [ch.seq_id for ch in batch.chunks] == [0]  # no admission in a step that preempted
            break
    else:
        raise AssertionError("no preemption happened")
    run_all(s, ex)
    for x, p in ((a, [1] * 8), (b, [2] * 8), (c, [3] * 2)):
        assert x.output_token_ids == reference_output(p, x.max_tokens)
    assert b.num_preemptions >= 1
    assert s.block_manager.num_in_use == 0


def test_preempted_request_rehits_its_own_blocks_with_fresh_counts() -> None:
    """NOTES bugs 2 and 10: after preemption the request finds its own orphaned blocks in the prefix cache;
    its computed count comes from that allocation, and the hits are visible apart from the queries."""
    s, ex = setup(num_blocks=8)
    a, b = seq(0, [1] * 9, max_tokens=14), seq(1, [2] * 13, max_tokens=6)
    s.add(a)
    s.add(b)
    bm = s.block_manager
    hits_before = None
    while s.num_preemptions == 0:
        step(s, ex)
        hits_before = bm.num_prefix_hit_tokens
    assert b.status is SeqStatus.WAITING
    while b.status is SeqStatus.WAITING:
        step(s, ex)
    assert b.num_cached_tokens >= 8  # re-hit its own full prompt blocks
    assert bm.num_prefix_hit_tokens > (hits_before or 0)
    assert bm.num_prefix_query_tokens > bm.num_prefix_hit_tokens
    assert b.num_computed_tokens <= len(b.block_table) * 4
    run_all(s, ex)
    assert a.output_token_ids == reference_output([1] * 9, 14)
    assert b.output_token_ids == reference_output([2] * 13, 6)


def test_prefix_hit_of_block_multiple_prompt_sent_twice() -> None:
    """NOTES bug 1 end to end: the second identical prompt (a block multiple) hits all but its last block."""
    s, ex = setup()
    p = list(range(1, 13))
    a = seq(0, p, max_tokens=3)
    s.add(a)
    run_all(s, ex)
    b = seq(1, p, max_tokens=3)
    s.add(b)
    batch = step(s, ex)
    assert b.num_cached_tokens == 8
    assert (batch.chunks[0].start_pos, len(batch.chunks[0].token_ids)) == (8, 4)
    run_all(s, ex)
    assert b.output_token_ids == a.output_token_ids == reference_output(p, 3)


# ---- finishing ----------------------------------------------------------------------------------------
def test_eos_finishes_unless_ignored_and_min_tokens_is_honoured() -> None:
    prompt = [5, 6, 7]
    ref = reference_output(prompt, 200, eos_every=7, ignore_eos=True)
    first_eos = ref.index(EOS)
    s, ex = setup(eos_every=7, num_blocks=128)
    stop = seq(0, prompt, max_tokens=200)
    ignore = seq(1, prompt, max_tokens=first_eos + 3, ignore_eos=True)
    late = seq(2, prompt, max_tokens=200, min_tokens=first_eos + 2)
    for x in (stop, ignore, late):
        s.add(x)
    run_all(s, ex)
    assert stop.finish_reason == "stop" and stop.output_token_ids == ref[: first_eos + 1]
    assert ignore.finish_reason == "length" and ignore.output_token_ids == ref[: first_eos + 3]
    assert late.output_token_ids == reference_output(prompt, 200, eos_every=7, min_tokens=first_eos + 2)
    assert late.num_output_tokens > first_eos + 2 and EOS not in late.output_token_ids[: first_eos + 2]
    assert late.finish_reason == "stop" or late.num_output_tokens == 200


def test_abort_frees_at_once_running_or_waiting() -> None:
    s, ex = setup(max_num_seqs=1)
    a, b = seq(0, [1] * 9, max_tokens=50), seq(1, [2] * 9, max_tokens=50)
    s.add(a)
    s.add(b)
    step(s, ex)
    assert s.block_manager.num_in_use == 3
    assert s.abort(0) is a and a.finish_reason == "abort"
    assert s.block_manager.num_in_use == 0
    assert s.abort(1) is b and not s.has_work()
    assert s.abort(1) is None
    s.check()


def test_modeled_executor_drives_the_scheduler() -> None:
    cfg = config(num_blocks=16)
    ex = ModeledExecutor(CostProfile("t", 0.001, 1e-5, 1e-4, 1e-7), block_size=4, num_blocks=16, vocab_size=VOCAB)
    s = Scheduler(cfg)
    for i in range(5):
        s.add(seq(i, [i + 1] * 7, max_tokens=6))
    total_s = 0.0
    while s.has_work():
        batch = s.schedule()
        result = ex.execute(batch)
        assert result.modeled_s is not None and result.modeled_s > 0.001
        total_s += result.modeled_s
        s.update(batch, result)
        s.check()
    assert ex.total_modeled_s == pytest.approx(total_s)
    assert s.block_manager.num_in_use == 0


# ---- property test ------------------------------------------------------------------------------------
PREFIXES = [[1] * 8, [2] * 4 + [3] * 4, [1] * 4 + [3] * 3]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 9), st.integers(1, 12)),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops,
    num_blocks=st.integers(6, 24),
    budget=st.integers(3, 32),
    max_num_seqs=st.integers(1, 6),
    caching=st.booleans(),
)
def test_random_add_step_abort_keeps_accounting_and_outputs_exact(
    ops: list[tuple], num_blocks: int, budget: int, max_num_seqs: int, caching: bool
) -> None:
    s, ex = setup(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                  enable_prefix_caching=caching)
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prefix, extra, max_tokens = op
            prompt = PREFIXES[prefix] + list(range(100 + len(seqs), 100 + len(seqs) + extra))
            x = seq(len(seqs), prompt, max_tokens=max_tokens)
            try:
                s.add(x)
            except RequestRejected:
                assert cdiv(len(prompt) + max_tokens - 1, 4) > num_blocks
                continue
            seqs.append(x)
        elif op[0] == "step":
            for _ in range(op[1]):
                if s.has_work():
                    step(s, ex)
        else:
            s.abort(op[1])
            s.check()
    run_all(s, ex)
    bm = s.block_manager
    bm.check()
    assert bm.num_in_use == 0 and bm.num_free + bm.num_cached == bm.num_blocks
    for x in seqs:
        assert x.status is SeqStatus.FINISHED
        expected = reference_output(x.token_ids[: x.num_prompt_tokens], x.max_tokens)
        if x.finish_reason == "abort":
            assert x.output_token_ids == expected[: x.num_output_tokens]
        else:
            assert x.output_token_ids == expected
