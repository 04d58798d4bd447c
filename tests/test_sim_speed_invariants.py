"""What the simulator's speed rests on, checked by counting rather than timing: each full block of a
sequence is hashed once, however many times its admission is tried."""

from __future__ import annotations

from dataclasses import replace

import pytest

import reference_engine.block_manager as bm_module
from reference_engine.block_manager import BlockAccountingError, BlockManager
from reference_engine.config import EngineConfig
from reference_engine.executor.base import StepResult
from reference_engine.scheduler import Scheduler
from reference_engine.sequence import SeqStatus, Sequence
from slobench.fleet.sim_blocks import SimBlockManager
from slobench.fleet.simulate import ModeledEngine, simulate_records
from slobench.run.records import RequestSpec, with_drawn_ids
from slobench.workload import generate, load_workload

BS = 4


def run_to_end(sched: Scheduler) -> int:
    """Step with token 7 for every sampled chunk until idle; returns the steps where the queue's head waited."""
    waited = 0
    while sched.has_work():
        batch = sched.schedule()
        waited += bool(sched.waiting)
        sched.update(batch, StepResult([7 if c.sample else None for c in batch.chunks]))
    return waited


def test_each_full_block_of_a_sequence_is_hashed_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[tuple[int, ...]] = []
    real = bm_module.block_hash

    def counting(key: bytes, parent: bytes | None, toks: list[int]) -> bytes:
        calls.append(tuple(toks))
        return real(key, parent, toks)

    monkeypatch.setattr(bm_module, "block_hash", counting)
    sched = Scheduler(EngineConfig(block_size=BS, num_blocks=6, max_num_seqs=4, max_num_batched_tokens=64,
                                   prefix_hash_key=b"k" * 32))
    a = Sequence(0, list(range(100, 120)), max_tokens=4, ignore_eos=True)  # 5 blocks of prompt, grows to 6
    b = Sequence(1, list(range(100, 108)) + list(range(200, 205)), max_tokens=2, ignore_eos=True)  # shares 2
    sched.add(a)
    sched.add(b)
    waited = run_to_end(sched)
    assert a.status is SeqStatus.FINISHED and b.status is SeqStatus.FINISHED
    assert waited >= 3  # b's prefix was looked up step after step while a held the cache
    full_blocks = sum((len(s.token_ids) - 1) // BS for s in (a, b))  # the last sampled token has no KV
    assert len(calls) == full_blocks


def test_generated_token_prompts_say_their_id_range_and_a_changed_prompt_forgets_it() -> None:
    wl = load_workload("tiny")
    specs = generate(wl, rate_rps=5.0, num_requests=5, seed=1)
    assert all(type(s.prompt) is tuple and s.ids_below == wl.token_ids[1] for s in specs)
    assert all(min(s.prompt) >= wl.token_ids[0] and max(s.prompt) < wl.token_ids[1] for s in specs)
    assert replace(specs[0], prompt=(-1,)).ids_below is None  # not an argument: a new prompt is unvouched
    assert specs[0] == replace(specs[0])  # compare=False: equality and hashing see the request only
    text = generate(wl, rate_rps=5.0, num_requests=2, seed=1, api="chat")
    assert all(s.ids_below is None for s in text)


def test_a_drawn_range_past_the_vocabulary_gets_the_protocols_exact_check() -> None:
    engine = ModeledEngine("cpu-tiny", kv_blocks=64)
    vocab = engine().executor.vocab_size
    good = with_drawn_ids(RequestSpec(0, 0.0, (5, 6, 7), 3, 2), (0, vocab))
    bad = with_drawn_ids(RequestSpec(1, 0.1, (5, vocab), 2, 2), (0, vocab + 1))  # a range the engine cannot take
    ok, refused = simulate_records([good, bad], engine)
    assert ok.status == "ok" and ok.output_tokens == 2
    assert refused.status == "error" and f"prompt token id {vocab} is outside the vocabulary" in refused.error


def test_the_unkeyed_hash_finds_the_same_prefixes_as_the_keyed_one() -> None:
    def hits(bm: BlockManager) -> list[list[int]]:
        out = []
        prompts = [list(range(100, 117)), list(range(100, 108)) + [1, 2, 3], list(range(100, 117)) + [9]]
        for i, toks in enumerate(prompts):
            seq = Sequence(i, toks, max_tokens=1)
            found = bm.match_prefix(seq)
            out.append(found)
            bm.admit(seq, found)
            seq.num_computed_tokens = len(toks)
            bm.register_computed(seq)
            bm.free(seq)
            bm.check()
        return out

    unkeyed = SimBlockManager(8, BS)
    unkeyed.use_unkeyed_hash()
    assert hits(unkeyed) == hits(BlockManager(8, BS, hash_key=b"k" * 32)) == [[], [0, 1], [0, 1, 2, 3]]
    with pytest.raises(BlockAccountingError):
        unkeyed.use_unkeyed_hash()  # the cache already holds blocks keyed the other way
