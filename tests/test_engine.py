"""The engine loop: virtual-clock timing, the background thread, aborts, stats, metrics names, idle check."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine, TokenEvent, VirtualClock
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.metrics import EngineMetrics
from reference_engine.scheduler import RequestRejected
from slobench.run.clock import Clock

PROFILE = CostProfile("test", step_overhead_s=0.002, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3,
                      per_context_token_s=0.0)
WAIT_S = 10.0  # bounded waits on events; a pass never comes near it


def make(num_blocks: int = 64, profile: CostProfile = PROFILE, clock: object | None = None, **kw: object
         ) -> LLMEngine:
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_model_len=256, prefix_hash_key=b"k", **kw)  # type: ignore[arg-type]
    ex = ModeledExecutor(profile, block_size=4, num_blocks=num_blocks, vocab_size=300)
    return LLMEngine(cfg, ex, VirtualClock() if clock is None else clock)  # type: ignore[arg-type]


def test_generate_on_virtual_clock_takes_exactly_the_modeled_time() -> None:
    engine = make()
    [out] = engine.generate([[1, 2, 3, 4, 5]], max_tokens=3)
    prefill_s = 0.002 + 5 * 1e-4
    decode_s = 0.002 + 1e-3
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert out.ttft_s == pytest.approx(prefill_s)
    assert out.e2e_s == pytest.approx(prefill_s + 2 * decode_s)
    assert engine.clock.now_s() == pytest.approx(prefill_s + 2 * decode_s)
    assert engine.executor.token_at(out.request_id, 5) == out.token_ids[0]  # type: ignore[attr-defined]


def test_generate_is_deterministic_and_counts_tokens() -> None:
    prompts = [[7] * 9, [8] * 13, [7] * 9]
    a = make().generate(prompts, max_tokens=5)
    b = make().generate(prompts, max_tokens=5)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    engine = make()
    engine.generate(prompts, max_tokens=5)
    s = engine.stats()
    assert (s.num_prompt_tokens, s.num_generation_tokens) == (31, 15)
    assert s.num_running == s.num_waiting == s.num_blocks_in_use == 0
    assert s.num_blocks_free + s.num_blocks_cached == s.num_blocks
    assert s.num_idle_check_failures == 0


def test_prefix_cache_counters_after_repeat() -> None:
    engine = make()
    engine.generate([[3] * 12], max_tokens=2)
    engine.generate([[3] * 12], max_tokens=2)
    s = engine.stats()
    assert s.num_prefix_query_tokens == 24 and s.num_prefix_hit_tokens == 8


def test_preemption_under_a_small_cache_still_completes_everything() -> None:
    engine = make(num_blocks=12)
    outs = engine.generate([[i] * 10 for i in range(1, 6)], max_tokens=20)
    assert all(o.finish_reason == "length" and len(o.token_ids) == 20 for o in outs)
    assert engine.stats().num_preemptions > 0
    assert engine.idle_check()


def test_rejected_request_changes_nothing() -> None:
    engine = make(num_blocks=4)
    before = engine.stats()
    with pytest.raises(RequestRejected):
        engine.add_request([1] * 10, max_tokens=10)
    with pytest.raises(RequestRejected, match="vocabulary"):
        engine.add_request([1, 300], max_tokens=1)
    assert engine.stats() == before
    assert not engine.has_work()


def test_idle_check_reports_a_leak_loudly(caplog: pytest.LogCaptureFixture) -> None:
    engine = make()
    bm = engine.scheduler.block_manager
    bm._take_fresh()  # a block taken by nobody: a leak
    assert engine.idle_check() is False
    assert engine.stats().num_idle_check_failures == 1
    assert "KV CACHE ACCOUNTING BROKEN" in caplog.text


def test_metrics_use_vllm_names_verbatim() -> None:
    engine = make()
    metrics = EngineMetrics("m", engine.stats)
    engine.observer = metrics
    engine.generate([[1] * 5, [2] * 6], max_tokens=3)
    text = metrics.render().decode()
    for name in [
        "vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
        "vllm:num_preemptions_total{", "vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{",
        "vllm:prompt_tokens_total{", "vllm:generation_tokens_total{",
        'vllm:request_success_total{finished_reason="length",model_name="m"} 2.0',
        "vllm:time_to_first_token_seconds_bucket{", "vllm:inter_token_latency_seconds_bucket{",
        "vllm:e2e_request_latency_seconds_bucket{", "vllm:request_queue_time_seconds_bucket{",
        "vllm:iteration_tokens_total_bucket{", 'slobench_engine:kv_blocks_in_use{model_name="m"} 0.0',
    ]:
        assert name in text, name
    assert 'vllm:generation_tokens_total{model_name="m"} 6.0' in text
    assert 'vllm:time_to_first_token_seconds_count{model_name="m"} 2.0' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 4.0' in text


def test_cost_profiles_load_and_fit() -> None:
    for name in ("h100-llama-1b", "cpu-tiny"):
        p = CostProfile.load(name)
        assert 0 < p.step_s(0, 1, 100) < 0.05 and "ILLUSTRATIVE" in p.note
    true = CostProfile("x", 0.002, 1e-5, 3e-4, 2e-7)
    rows = [(true.step_s(p, d, c), p, d, c) for p, d, c in [(0, 1, 10), (100, 0, 100), (0, 32, 4000),
                                                              (512, 8, 3000), (0, 8, 200)]]
    fitted = CostProfile.fit("fit", rows)
    assert fitted.step_overhead_s == pytest.approx(0.002, rel=1e-6)
    assert fitted.per_decode_seq_s == pytest.approx(3e-4, rel=1e-6)


def test_modeled_tokens_avoid_eos_unless_configured() -> None:
    ex = ModeledExecutor(PROFILE, block_size=4, num_blocks=4, vocab_size=3, eos_token_id=2)
    assert all(ex.token_at(s, p) != 2 for s in range(20) for p in range(50))
    ex = ModeledExecutor(PROFILE, block_size=4, num_blocks=4, vocab_size=3, eos_token_id=2, eos_probability=1.0)
    assert ex.token_at(0, 0) == 2


# ---- background thread --------------------------------------------------------------------------------
class Collector:
    def __init__(self) -> None:
        self.events: list[TokenEvent] = []
        self.done = threading.Event()

    def __call__(self, ev: TokenEvent) -> None:
        self.events.append(ev)
        if ev.finish_reason is not None:
            self.done.set()


def fast_engine() -> LLMEngine:
    return make(profile=CostProfile("fast", 1e-5, 0.0, 0.0, 0.0), clock=Clock())  # the run's real clock


def test_thread_serves_requests_and_wakes_on_new_work() -> None:
    engine = fast_engine()
    engine.start()
    try:
        for round_ in range(3):  # idle between rounds: each add must wake the sleeping loop
            cols = [Collector() for _ in range(4)]
            for i, c in enumerate(cols):
                engine.add_request([round_ + 1] * (i + 3), max_tokens=5, on_token=c)
            for c in cols:
                assert c.done.wait(WAIT_S)
                assert [e.token_id is not None for e in c.events] == [True] * 5
                assert c.events[-1].finish_reason == "length"
                times = [e.time_s for e in c.events]
                assert times == sorted(times)
    finally:
        engine.stop()
    assert engine.stats().num_blocks_in_use == 0 and engine.idle_check()


def test_thread_abort_frees_blocks_and_ends_the_stream() -> None:
    engine = fast_engine()
    engine.start()
    try:
        got_one = threading.Event()
        col = Collector()

        def on_token(ev: TokenEvent) -> None:
            col(ev)
            got_one.set()

        rid = engine.add_request([1] * 10, max_tokens=200, ignore_eos=True, on_token=on_token)
        assert got_one.wait(WAIT_S)
        engine.abort(rid)
        assert col.done.wait(WAIT_S)
        assert col.events[-1].finish_reason == "abort" and col.events[-1].token_id is None
        assert len(col.events) < 201
        engine.abort(rid)  # a second abort of a finished request is harmless
        probe = Collector()
        engine.add_request([2] * 3, max_tokens=1, on_token=probe)
        assert probe.done.wait(WAIT_S)
    finally:
        engine.stop()
    s = engine.stats()
    assert s.num_blocks_in_use == 0 and s.num_running == 0


def test_broken_callback_aborts_only_its_request() -> None:
    engine = fast_engine()

    def broken(ev: TokenEvent) -> None:
        raise RuntimeError("consumer gone")

    engine.start()
    try:
        engine.add_request([1] * 4, max_tokens=50, on_token=broken)
        good = Collector()
        engine.add_request([2] * 4, max_tokens=5, on_token=good)
        assert good.done.wait(WAIT_S) and good.events[-1].finish_reason == "length"
    finally:
        engine.stop()
    assert engine.is_healthy()


def test_loop_crash_fails_open_requests_and_reports_unhealthy() -> None:
    class Exploding(ModeledExecutor):
        def execute(self, batch: StepBatch) -> StepResult:
            raise ValueError("device lost")

    cfg = EngineConfig(block_size=4, num_blocks=8)
    engine = LLMEngine(cfg, Exploding(PROFILE, block_size=4, num_blocks=8))
    col = Collector()
    engine.start()
    try:
        engine.add_request([1, 2], max_tokens=2, on_token=col)
        assert col.done.wait(WAIT_S)
        assert col.events[-1].finish_reason == "error"
    finally:
        engine.stop()
    assert not engine.is_healthy()
    with pytest.raises(RuntimeError, match="died"):
        engine.add_request([1], max_tokens=1)


def test_generate_refuses_while_thread_runs() -> None:
    engine = fast_engine()
    engine.start()
    try:
        with pytest.raises(RuntimeError):
            engine.generate([[1]], max_tokens=1)
    finally:
        engine.stop()


# ---- property test: the engine API with the modeled executor -------------------------------------------
engine_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 20), st.integers(0, 3)),
        st.tuples(st.just("step"), st.integers(1, 5)),
        st.tuples(st.just("abort"), st.integers(0, 25)),
    ),
    max_size=50,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=engine_ops, num_blocks=st.integers(4, 40), caching=st.booleans(), budget=st.integers(2, 64))
def test_random_engine_ops_balance_blocks(ops: list[tuple], num_blocks: int, caching: bool, budget: int) -> None:
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_num_seqs=6, max_num_batched_tokens=budget,
                       max_model_len=256, enable_prefix_caching=caching, prefix_hash_key=b"k")
    ex = ModeledExecutor(PROFILE, block_size=4, num_blocks=num_blocks, vocab_size=50, eos_token_id=0,
                         eos_probability=0.05)
    engine = LLMEngine(cfg, ex, VirtualClock())
    ended: dict[int, int] = {}

    def on_token(ev: TokenEvent) -> None:
        if ev.finish_reason is not None:
            ended[ev.request_id] = ended.get(ev.request_id, 0) + 1

    added: list[int] = []
    for op in ops:
        if op[0] == "add":
            _, prompt_len, max_tokens, prefix = op
            prompt = [prefix + 1] * 8 + list(range(10, 10 + prompt_len))
            try:
                added.append(engine.add_request(prompt, max_tokens, ignore_eos=prefix == 3, on_token=on_token))
            except RequestRejected:
                assert -(-(len(prompt) + max_tokens - 1) // 4) > num_blocks
        elif op[0] == "step":
            for _ in range(op[1]):
                engine.step()
                engine.scheduler.check()
        else:
            engine.abort(op[1])
    while engine.has_work() or engine._pending_aborts:
        engine.step()
        engine.scheduler.check()
    assert engine.idle_check()
    s = engine.stats()
    assert s.num_blocks_in_use == 0 and s.num_blocks_free + s.num_blocks_cached == s.num_blocks
    assert sorted(ended) == sorted(added)
    assert all(v == 1 for v in ended.values())  # every request ended exactly once


def test_config_and_executor_mismatch_are_named_errors() -> None:
    from slobench.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(EngineConfigError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=True)  # type: ignore[arg-type]
    ex = ModeledExecutor(PROFILE, block_size=4, num_blocks=8)
    with pytest.raises(EngineConfigError, match="num_blocks"):
        LLMEngine(EngineConfig(block_size=4, num_blocks=9), ex)
