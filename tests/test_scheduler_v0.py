"""The vllm-v0 scheduling policy: a step is whole prompts (FIFO, under the token budget, max_num_seqs and free
blocks) or one decode token for every running request, never both, prompts first; preemption by recompute.
The KV-echo executor of test_scheduler checks that every token still reads the right KV."""

from __future__ import annotations

import pytest

from reference_engine.config import EngineSpec
from reference_engine.errors import ConfigError
from reference_engine.scheduler import RequestRejected
from reference_engine.sequence import SeqStatus
from tests.test_scheduler import reference_output, run_all, seq, setup, step


def v0(**kw: object):  # type: ignore[no-untyped-def]
    return setup(scheduler="vllm-v0", **kw)


def kinds(batch) -> str:  # type: ignore[no-untyped-def]
    """'P' for a step of whole prompts, 'D' for a step of decodes."""
    decode = [c.sample and len(c.token_ids) == 1 for c in batch.chunks]
    assert all(decode) or not any(decode), "a vllm-v0 step mixes prompts and decodes"
    return "D" if all(decode) else "P"


def test_prompts_first_never_mixed_never_chunked() -> None:
    s, ex = v0(max_num_batched_tokens=16)
    s.add(seq(0, list(range(1, 11)), max_tokens=3))
    b = step(s, ex)
    assert kinds(b) == "P" and [len(c.token_ids) for c in b.chunks] == [10]
    s.add(seq(1, list(range(20, 26)), max_tokens=3))
    b = step(s, ex)  # the new prompt goes first: seq 0 does not decode in this step
    assert kinds(b) == "P" and [c.seq_id for c in b.chunks] == [1]
    b = step(s, ex)
    assert kinds(b) == "D" and [c.seq_id for c in b.chunks] == [0, 1]
    run_all(s, ex)


def test_whole_prompts_admitted_fifo_while_the_budget_lasts() -> None:
    s, ex = v0(max_num_batched_tokens=16)
    for i, n in enumerate((6, 8, 3)):
        s.add(seq(i, [i + 1] * n, max_tokens=2))
    b = step(s, ex)
    assert [c.seq_id for c in b.chunks] == [0, 1]  # 6 + 8 fit; + 3 would pass 16: the third waits (FIFO)
    assert all(c.sample and c.start_pos == 0 for c in b.chunks)
    b = step(s, ex)
    assert [c.seq_id for c in b.chunks] == [2]  # prompts before decodes
    b = step(s, ex)
    assert kinds(b) == "D" and [c.seq_id for c in b.chunks] == [0, 1, 2]


def test_max_num_seqs_bounds_admission() -> None:
    s, ex = v0(max_num_seqs=2)
    for i in range(3):
        s.add(seq(i, [i + 1] * 4, max_tokens=5))
    assert [c.seq_id for c in step(s, ex).chunks] == [0, 1]
    assert kinds(step(s, ex)) == "D"  # seq 2 waits for a slot: decodes go on
    assert s.num_waiting == 1


def test_no_room_means_decodes_and_the_head_waits() -> None:
    s, ex = v0(num_blocks=6, max_num_batched_tokens=64)
    s.add(seq(0, [1] * 12, max_tokens=4))  # 3 blocks
    s.add(seq(1, [2] * 16, max_tokens=4))  # 4 blocks: does not fit beside seq 0
    b = step(s, ex)
    assert [c.seq_id for c in b.chunks] == [0]
    assert kinds(step(s, ex)) == "D"
    run_all(s, ex)
    assert s.num_preemptions == 0


def test_preempts_the_newest_by_recompute_and_outputs_stay_exact() -> None:
    s, ex = v0(num_blocks=8, max_num_batched_tokens=64)
    prompts = {0: [1] * 8, 1: [2] * 8, 2: [3] * 8}
    seqs = {i: seq(i, p, max_tokens=12) for i, p in prompts.items()}
    for q in seqs.values():
        s.add(q)
    run_all(s, ex)
    assert s.num_preemptions > 0
    for i, q in seqs.items():
        assert q.status is SeqStatus.FINISHED
        assert q.output_token_ids == reference_output(prompts[i], 12)


def test_outputs_match_the_dense_reference_under_load() -> None:
    s, ex = v0(num_blocks=24, max_num_batched_tokens=24, max_num_seqs=4)
    prompts = {i: [(7 * i + j) % 50 + 1 for j in range(3 + (5 * i) % 17)] for i in range(12)}
    seqs = {i: seq(i, p, max_tokens=1 + i % 6) for i, p in prompts.items()}
    for q in seqs.values():
        s.add(q)
    for _ in range(10_000):
        if not s.has_work():
            break
        kinds(step(s, ex))
    for i, q in seqs.items():
        assert q.output_token_ids == reference_output(prompts[i], 1 + i % 6)


def test_a_prompt_over_the_budget_is_rejected() -> None:
    s, _ = v0(max_num_batched_tokens=8)
    with pytest.raises(RequestRejected, match="budget"):
        s.add(seq(0, [1] * 9))
    chunked, _ = setup(max_num_batched_tokens=8)
    chunked.add(seq(0, [1] * 9))  # chunked prefill cuts it instead


def test_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="scheduler"):
        setup(scheduler="fcfs")
    with pytest.raises(ConfigError, match="scheduler"):
        EngineSpec(scheduler="v0")
