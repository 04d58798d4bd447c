"""What the simulator's speed rests on, checked by counting rather than timing: each full block of a
sequence is hashed once, however many times its admission is tried."""

from __future__ import annotations

import reference_engine.block_manager as bm_module
from reference_engine.config import EngineConfig
from reference_engine.executor.base import StepResult
from reference_engine.scheduler import Scheduler
from reference_engine.sequence import SeqStatus, Sequence

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
