"""Block manager: accounting, prefix caching (capped, keyed, collision-proof), LRU eviction, counters."""

from __future__ import annotations

import pytest

from reference_engine import block_manager as bm_module
from reference_engine.block_manager import BlockAccountingError, BlockManager, block_hash
from reference_engine.sequence import Sequence

BS = 4
KEY = b"test-key"


def make(num_blocks: int = 16, caching: bool = True, key: bytes | None = KEY) -> BlockManager:
    return BlockManager(num_blocks, BS, enable_prefix_caching=caching, hash_key=key)


_next_id = iter(range(10**9))


def run_prefill(bm: BlockManager, tokens: list[int]) -> Sequence:
    """Admit a sequence, pretend its whole prompt was computed, register its blocks."""
    seq = Sequence(next(_next_id), list(tokens), max_tokens=8)
    hits = bm.match_prefix(seq.token_ids)
    bm.admit(seq, hits)
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed(seq)
    bm.check()
    return seq


def test_admit_and_free_balance() -> None:
    bm = make()
    seq = run_prefill(bm, list(range(10)))  # 3 blocks
    assert len(seq.block_table) == 3 and bm.num_in_use == 3
    assert bm.num_free + bm.num_cached + bm.num_in_use == bm.num_blocks
    bm.free(seq)
    bm.check()
    assert bm.num_in_use == 0
    assert bm.num_cached == 2  # the two full blocks stay findable; the partial one is plain free
    assert bm.num_free + bm.num_cached == bm.num_blocks


def test_full_prompt_hit_is_capped_below_100_percent() -> None:
    """NOTES bug 1: a prompt that is a multiple of the block size, sent twice, must still compute a token."""
    bm = make()
    prompt = list(range(100, 100 + 3 * BS))
    bm.free(run_prefill(bm, prompt))
    hits = bm.match_prefix(prompt)
    assert len(hits) == 2  # not 3: (12 - 1) // 4
    seq = Sequence(1000, list(prompt), max_tokens=4)
    bm.admit(seq, hits)
    assert seq.num_computed_tokens == 2 * BS < seq.num_tokens
    assert len(seq.block_table) == 3
    bm.check()


def test_hit_rounds_down_to_block_boundary() -> None:
    bm = make()
    prompt = list(range(50, 50 + 2 * BS + 1))
    bm.free(run_prefill(bm, prompt))
    assert len(bm.match_prefix(prompt)) == 2  # 9 tokens: both full blocks, the last token computed
    assert len(bm.match_prefix(prompt[: 2 * BS - 1])) == 1  # 7 tokens: block 0 only
    assert bm.match_prefix(prompt[:BS]) == []  # exactly one block: a full hit is never allowed


def test_prefix_diverging_mid_chain_stops_matching() -> None:
    bm = make()
    a = [1] * BS + [2] * BS + [3] * BS + [9]
    bm.free(run_prefill(bm, a))
    b = [1] * BS + [7] * BS + [3] * BS + [9]
    assert len(bm.match_prefix(b)) == 1


def test_shared_blocks_are_refcounted() -> None:
    bm = make()
    prompt = list(range(2 * BS + 1))
    s1 = run_prefill(bm, prompt)
    s2 = run_prefill(bm, prompt)
    assert s2.block_table[:2] == s1.block_table[:2]
    assert bm.blocks[s1.block_table[0]].ref_count == 2
    bm.free(s1)
    bm.check()
    assert bm.blocks[s2.block_table[0]].ref_count == 1
    bm.free(s2)
    bm.check()
    assert bm.num_in_use == 0


def test_double_free_raises() -> None:
    bm = make()
    seq = run_prefill(bm, list(range(5)))
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(BlockAccountingError, match="freed twice"):
        bm.free(seq)


def test_check_detects_a_leak_and_negative_refcount() -> None:
    bm = make()
    bm.blocks[3].ref_count = 1  # held by nobody, not on any list
    bm._free.remove(3)
    with pytest.raises(BlockAccountingError):
        bm.check()
    bm2 = make()
    bm2.blocks[0].ref_count = -1
    with pytest.raises(BlockAccountingError, match="ref_count -1"):
        bm2.check()


def test_forced_hash_collision_never_serves_another_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTES bug 8: every block of every prompt gets the same hash; no wrong KV may be served."""
    monkeypatch.setattr(bm_module, "block_hash", lambda key, parent, toks: b"same")
    bm = make()
    bm.free(run_prefill(bm, [1] * BS + [2] * BS + [0]))
    assert bm.match_prefix([5] * BS + [2] * BS + [0]) == []
    assert bm.match_prefix([2] * BS + [2] * BS + [0]) == []
    bm.check()


def test_collision_on_a_child_with_another_parent_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hash that ignores the parent makes block [Y] after [W] look like block [Y] after [X]: the stored
    token ids agree, so only the parent identity check stops the wrong hit."""
    monkeypatch.setattr(bm_module, "block_hash", lambda key, parent, toks: bytes(str(tuple(toks)), "ascii"))
    bm = make()
    x, w, y, v = [1] * BS, [2] * BS, [3] * BS, [4] * BS
    bm.free(run_prefill(bm, x + v + [0]))
    bm.free(run_prefill(bm, w + y + [0]))
    hits = bm.match_prefix(x + y + [0])
    assert len(hits) == 1  # X is genuinely cached; Y-after-W must not be served after X
    bm.check()


def test_hash_is_keyed() -> None:
    toks = list(range(BS))
    assert block_hash(b"k1", None, toks) == block_hash(b"k1", None, toks)
    assert block_hash(b"k1", None, toks) != block_hash(b"k2", None, toks)
    assert make(key=None)._key != make(key=None)._key  # a fresh random key per instance


def test_lru_evicts_oldest_and_frees_tail_first() -> None:
    bm = make(num_blocks=6)
    a = run_prefill(bm, [1] * BS + [2] * BS + [3] * BS + [0])  # 4 blocks: 3 full
    bm.free(a)
    assert bm.num_cached == 3 and bm.num_free == 3
    # Need 4 fresh blocks: 3 free ones, then one eviction, which must be A's tail (block 2), not its head.
    b = run_prefill(bm, [9] * (3 * BS + 1))
    assert len(bm.match_prefix([1] * BS + [2] * BS + [3] * BS + [0])) == 2
    bm.free(b)
    bm.check()


def test_recently_used_cached_blocks_survive_eviction() -> None:
    bm = make(num_blocks=4)
    a = [1] * BS + [0]
    b = [2] * BS + [0]
    bm.free(run_prefill(bm, a))
    bm.free(run_prefill(bm, b))
    bm.free(run_prefill(bm, a))  # touch A again: B's block is now least recently used
    run_prefill(bm, [3] * (3 * BS))  # 3 blocks: 2 free (the partial tails) + 1 eviction
    assert bm.match_prefix(b) == []
    assert len(bm.match_prefix(a)) == 1


def test_queries_and_hits_counted_separately_in_tokens() -> None:
    bm = make()
    prompt = list(range(2 * BS + 2))
    bm.free(run_prefill(bm, prompt))
    assert (bm.num_prefix_query_tokens, bm.num_prefix_hit_tokens) == (10, 0)
    run_prefill(bm, prompt)
    assert (bm.num_prefix_query_tokens, bm.num_prefix_hit_tokens) == (20, 8)


def test_caching_disabled_never_hits_nor_counts() -> None:
    bm = make(caching=False)
    prompt = list(range(3 * BS))
    bm.free(run_prefill(bm, prompt))
    assert bm.match_prefix(prompt) == []
    assert bm.num_cached == 0 and bm.num_free == bm.num_blocks
    assert bm.num_prefix_query_tokens == 0


def test_duplicate_blocks_share_identity_so_children_still_match() -> None:
    """Two requests compute the same prefix side by side; the second's blocks are duplicates that are not
    registered, but a later request must still find the whole chain."""
    bm = make()
    prompt = [1] * BS + [2] * BS + [3] * BS + [0]
    s1 = Sequence(900, list(prompt), max_tokens=4)
    s2 = Sequence(901, list(prompt), max_tokens=4)
    for s in (s1, s2):
        bm.admit(s, [])
    for s in (s1, s2):
        s.num_computed_tokens = s.num_tokens
        bm.register_computed(s)
    bm.free(s2)
    bm.free(s1)
    bm.check()
    assert len(bm.match_prefix(prompt)) == 3


def test_admit_refuses_without_room() -> None:
    bm = make(num_blocks=2)
    seq = Sequence(5, list(range(3 * BS)), max_tokens=1)
    assert not bm.can_admit(seq.num_tokens, [])
    with pytest.raises(BlockAccountingError):
        bm.admit(seq, [])
    bm.check()
    assert bm.num_in_use == 0
