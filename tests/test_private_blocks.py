"""Private blocks (slobench.fleet.sim_blocks.SimBlockManager's doc): a simulation that knows every prompt keeps
blocks no other prompt shares without per-block bookkeeping, and must see exactly what keeping every block
in full sees: the same hits, the same evictions, the same records, preemptions included."""

from __future__ import annotations

import pytest

from reference_engine import block_manager as bm_module
from reference_engine.block_manager import BlockAccountingError, BlockManager
from reference_engine.engine import LLMEngine
from reference_engine.sequence import NEVER_PRIVATE, Sequence
from slobench.fleet.sim_blocks import SimBlockManager, shared_prefix_blocks
from slobench.fleet.simulate import simulate_records
from slobench.workload import generate, load_workload

BS = 4


def test_shared_prefix_blocks_counts_whole_blocks_shared_with_any_other_prompt() -> None:
    a = list(range(100, 120))  # 5 blocks
    b = a[:10] + [1, 2, 3, 4, 5, 6]  # shares 10 tokens with a: 2 whole blocks
    c = a[:3] + [9] * 10  # shares part of the first block: nothing
    d = [7] * 20
    e = list(d)  # a duplicate: everything shared
    f = a[:8]  # a's first two blocks exactly, and nothing after them
    g = [5, 5]  # shorter than a block
    out = shared_prefix_blocks([tuple(p) for p in (a, b, c, d, e, f, g)], BS)
    assert out == [2, 2, 0, 5, 5, 2, 0]
    assert shared_prefix_blocks([], BS) == []


def test_shared_prefix_blocks_finds_the_longest_share_among_many() -> None:
    base = list(range(1000, 1064))  # 16 blocks
    prompts = [tuple(base[: 4 * k] + [k] * 8) for k in range(1, 10)]  # each diverges after k blocks
    prompts.append(tuple(base))
    out = shared_prefix_blocks(prompts, BS)
    # prompt k shares k blocks with the base and with every longer one; its own tail is unique, and the
    # base shares 9 (with the prompt that diverges latest)
    assert out == [*range(1, 10), 9]


def _finish(bm: SimBlockManager, seq: Sequence, unshared_from: int) -> Sequence:
    seq.unshared_from = unshared_from
    bm.admit(seq, bm.match_prefix(seq))
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed(seq)
    bm.check()
    return seq


def test_a_finished_private_tail_is_one_unreachable_run_evicted_in_block_order() -> None:
    bm = SimBlockManager(12, BS)
    bm.use_unkeyed_hash()
    shared = list(range(100, 108))  # 2 blocks another prompt shares
    a = _finish(bm, Sequence(0, shared + list(range(200, 213)), max_tokens=1), 2)  # 6 blocks, 5 full
    assert bm._num_private == 4 and bm.num_in_use == 6
    assert len(bm._by_hash) == 2  # only the shared blocks were hashed and registered
    table = list(a.block_table)
    bm.free(a, finished=True)
    bm.check()
    # the partial block goes free; the 3 registered private blocks are one run, tail first; then the prefix
    assert bm.num_cached == 5 and bm.num_free == 7 and bm._num_private == 0
    runs = [run for run in bm._cached.values() if run is not None]
    assert runs == [[table[4], table[3], table[2]]]
    # another request with the shared prefix hits it, and its new blocks come from the free list
    b = _finish(bm, Sequence(1, shared + [1, 2, 3, 4, 5], max_tokens=1), 2)
    assert b.num_cached_tokens == 8
    # taking more than the free list holds evicts from the run's head, one block at a time, in order
    c = Sequence(2, list(range(300, 324)), max_tokens=1)  # 6 blocks: the 5 left free, then 1 from the run
    _finish(bm, c, 0)
    assert c.block_table[-1] == table[4] and bm.num_cached == 2
    assert list(bm._cached.values()) == [[table[3], table[2]]]
    b_table = list(b.block_table)
    bm.free(b, finished=True)  # its private run (1 registered block), then the shared prefix, tail first
    bm.check()
    assert list(bm._cached.values())[1] == [b_table[2]] and b_table[3] in bm._free
    assert list(bm._cached)[2:] == [table[1], table[0]]
    assert bm.evicts_any({table[0]}, 4) is False and bm.evicts_any({table[0]}, 5) is True


def test_a_preempted_private_sequence_is_registered_and_hits_its_own_blocks() -> None:
    private = SimBlockManager(10, BS)
    full = SimBlockManager(10, BS)
    found = []
    for bm, unshared in ((private, 0), (full, NEVER_PRIVATE)):
        bm.use_unkeyed_hash()
        seq = _finish(bm, Sequence(0, list(range(100, 118)), max_tokens=4), unshared)
        bm.free(seq)  # a preemption: it comes back
        bm.check()
        assert seq.unshared_from == NEVER_PRIVATE and bm._num_private == 0
        hits = bm.match_prefix(seq)
        found.append(len(hits))
        bm.admit(seq, hits)
        bm.check()
    assert found == [4, 4]  # (18 - 1) // 4: every registered block, found again, either way


def test_check_counts_private_blocks() -> None:
    bm = SimBlockManager(8, BS)
    seq = _finish(bm, Sequence(0, list(range(9)), max_tokens=1), 1)
    bm._num_private += 1  # a private block said to be held that nothing holds
    with pytest.raises(BlockAccountingError, match="private"):
        bm.check()
    bm._num_private -= 1
    bm.free(seq, finished=True)
    bm.check()
    bm._free.pop()  # a block lost from the free list now looks held privately
    with pytest.raises(BlockAccountingError, match="leak"):
        bm.check()


# 150 requests a case: 20 to 100 preemptions and (but chat) prefix hits, while the stepped run, which
# checks every invariant after each of its ~10,000 steps, stays near a second
CASES = [("chat", 60, 150, 250), ("system-prompts", 60, 150, 160), ("sessions", 40, 150, 160)]


@pytest.mark.parametrize(("workload", "rate", "n", "kv"), CASES)
def test_private_blocks_change_no_record_under_preemption(workload: str, rate: float, n: int, kv: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Small caches at high rates: preemptions, evictions and prefix hits all happen; stepped with every
    invariant checked after each step, and with decode runs, the records equal keeping every block in full."""
    real_step = LLMEngine.step
    preemptions: list[int] = []

    def checked_step(self: LLMEngine):  # type: ignore[no-untyped-def]
        out = real_step(self)
        self.scheduler.check()
        preemptions.append(self.scheduler.num_preemptions)
        return out

    specs = generate(load_workload(workload), rate_rps=rate, num_requests=n, seed=3)
    knobs = {"profile": "h100-llama-1b", "kv_blocks": kv}
    full = simulate_records(specs, knobs, private_blocks=False)
    runs = simulate_records(specs, knobs)
    monkeypatch.setattr(LLMEngine, "step", checked_step)
    stepped = simulate_records(specs, knobs, decode_runs=False)
    assert max(preemptions) > 0
    if workload != "chat":
        assert sum(r.cached_tokens or 0 for r in full) > 0

    def seen(records):  # type: ignore[no-untyped-def]
        return [(r.request_id, r.status, r.first_token_s, r.done_s, r.chunk_times_s, r.cached_tokens,
                 r.output_tokens) for r in records]

    assert seen(runs) == seen(full) == seen(stepped)


def test_a_chat_run_registers_no_private_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed this rests on: prompts that share nothing hash and register nothing (but a preempted one)."""
    registered: list[int] = []
    real = bm_module.BlockManager._register

    def counting(self: BlockManager, seq: Sequence, first: int, end: int) -> None:
        registered.append(end - first)
        real(self, seq, first, end)

    monkeypatch.setattr(bm_module.BlockManager, "_register", counting)
    specs = generate(load_workload("chat"), rate_rps=10, num_requests=100, seed=1)
    simulate_records(specs, {"profile": "h100-llama-1b", "kv_blocks": 2048})
    assert registered == []
    simulate_records(specs, {"profile": "h100-llama-1b", "kv_blocks": 2048}, private_blocks=False)
    assert sum(registered) > 100 * 30


def test_a_preempted_private_request_gets_its_real_output_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private request's output ids are stand-ins until it is preempted; then (before its blocks are
    hashed) they are the executor's, exactly those keeping every block in full gives it."""
    from reference_engine.scheduler import Scheduler

    seen: list[tuple[int, int, list[int]]] = []
    real_preempt = Scheduler._preempt

    def recording(self: Scheduler, seq: Sequence) -> None:
        real_preempt(self, seq)
        seen.append((seq.seq_id, seq.num_prompt_tokens, list(seq.token_ids)))

    monkeypatch.setattr(Scheduler, "_preempt", recording)
    specs = generate(load_workload("chat"), rate_rps=60, num_requests=300, seed=3)
    knobs = {"profile": "h100-llama-1b", "kv_blocks": 250}
    simulate_records(specs, knobs)
    private = list(seen)
    seen.clear()
    simulate_records(specs, knobs, private_blocks=False)
    assert len(private) > 10 and sum(len(t) > n + 1 for _, n, t in private) > 5  # with output ids to redraw
    assert private == seen


@pytest.mark.parametrize("caching", [True, False])
def test_engines_end_alike_with_private_blocks(simulated_engines: list[LLMEngine], caching: bool) -> None:
    """Decode runs leave registrations of private blocks out and count them: the engine's counters (blocks
    free and cached among them) end as keeping every block in full, and as stepping, leave them."""
    from slobench.fleet.simulate import ModeledEngine

    built = simulated_engines
    specs = generate(load_workload("system-prompts"), rate_rps=30, num_requests=300, seed=2)
    engine = ModeledEngine("h100-llama-1b", kv_blocks=400, enable_prefix_caching=caching)
    ends = []
    for kw in ({}, {"private_blocks": False}, {"decode_runs": False}):
        simulate_records(specs, engine, **kw)  # type: ignore[arg-type]
        ends.append(built[-1].stats())
    assert ends[0] == ends[1] == ends[2]
    assert (ends[0].num_blocks_cached > 0) is caching


def test_a_fleet_behind_a_prefix_router_sees_the_same_with_private_blocks() -> None:
    """Each replica's block manager keeps its own private blocks; what another prompt shares is judged over
    every prompt of the run, so a replica never sees a hit that full bookkeeping would not."""
    specs = generate(load_workload("system-prompts"), rate_rps=40, num_requests=300, seed=3)
    knobs = {"profile": "h100-llama-1b", "kv_blocks": 300}
    kw = {"replicas": 3, "router": "prefix-balanced", "jitter_sd": 0.03, "seed": 4}
    private = simulate_records(specs, knobs, **kw)  # type: ignore[arg-type]
    full = simulate_records(specs, knobs, private_blocks=False, **kw)  # type: ignore[arg-type]
    assert [r.to_json() for r in private] == [r.to_json() for r in full]
    assert sum(r.cached_tokens or 0 for r in private) > 0 and {r.replica for r in private} >= {0, 1, 2}
