"""The engine's public seam for steps a caller takes outside `step()` (a simulator's decode runs): the queue's
head admitted, tokens and counters recorded, each as `step()` leaves them."""

from __future__ import annotations

import pytest

from reference_engine.engine import LLMEngine
from slobench.fleet.simulate import ModeledEngine


def _engine_with_two_waiting() -> tuple[LLMEngine, list[int]]:
    engine = ModeledEngine(kv_blocks=64, block_size=4)()
    ids = [engine.add_request(list(range(1, 9)), 4), engine.add_request(list(range(11, 19)), 4)]
    engine.apply_pending()
    return engine, ids


def test_admit_head_takes_the_queue_head_as_schedule_does() -> None:
    engine, (a, b) = _engine_with_two_waiting()
    sched = engine.scheduler
    head, second = sched.waiting[0], sched.waiting[1]
    with pytest.raises(ValueError, match="not the head"):
        engine.admit_head(second, [], 0.5)
    engine.admit_head(head, [], 0.5)
    assert list(sched.running) == [head] and list(sched.waiting) == [second]
    assert len(head.block_table) == 2  # 8 tokens in blocks of 4
    assert engine.requests[a].first_scheduled_s == 0.5
    assert engine.requests[b].first_scheduled_s is None
    sched.check()


def test_tokens_sampled_counts_a_first_token_once() -> None:
    engine, (a, _) = _engine_with_two_waiting()
    head = engine.scheduler.waiting[0]
    engine.admit_head(head, [], 0.0)
    assert engine.tokens_sampled([head], 1.0, 3.0) == {a: 0}
    assert engine.tokens_sampled([head], 4.0, 5.0) == {}
    req = engine.requests[a]
    assert (req.first_token_s, req.last_token_s) == (1.0, 5.0)
    assert engine.num_prompt_tokens == 8
    engine.steps_taken(3, 2, 6)
    stats = engine.stats()
    assert (stats.num_steps, stats.last_step_num_tokens, stats.num_generation_tokens) == (3, 2, 6)
