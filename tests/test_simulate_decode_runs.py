"""Decode runs (slobench.fleet.decode_run) against stepping every step: the same records, bit for bit, wherever
the engine's state could make a run's shortcut wrong: chunked prefills ending in a one-token chunk, a full
batch, preemption, a queue head waiting for blocks, shared prefixes, EOS-free fleets with jitter."""

from __future__ import annotations

from typing import Any

import pytest

from slobench.fleet import simulate
from slobench.fleet.simulate import ModeledEngine, simulate_records
from slobench.workload import generate, load_workload

SCENARIOS = {
    # budget cuts: prefills chunked at 300 tokens, so some end in a one-token chunk
    "small-budget": ("chat", 20.0, 150, ModeledEngine("h100-llama-1b", kv_blocks=1024, max_batched_tokens=300), {}),
    # KV pressure: preemption by recompute and a queue head waiting for blocks
    "preempting": ("chat", 40.0, 150, ModeledEngine("h100-llama-1b", kv_blocks=300), {}),
    # a full batch: the queue waits on max_num_seqs, not on blocks
    "max-seqs": ("chat", 60.0, 150, ModeledEngine("h100-llama-1b", kv_blocks=4096, max_num_seqs=4), {}),
    "no-prefix-cache": ("system-prompts", 10.0, 150,
                        ModeledEngine("h100-llama-1b", kv_blocks=300, enable_prefix_caching=False), {}),
    "shared-prefixes-fleet": ("system-prompts", 12.0, 200, ModeledEngine("h100-llama-1b", kv_blocks=300),
                              {"replicas": 3, "router": "prefix-balanced", "jitter_sd": 0.03, "seed": 4}),
    "sessions": ("sessions", 8.0, 150, ModeledEngine("h100-llama-1b", kv_blocks=600), {}),
    # 33-token prompts through a 32-token budget: the first token comes from a one-token "decode" chunk
    "one-token-last-chunk": ("tiny", 5.0, 60, ModeledEngine("cpu-tiny", kv_blocks=256, max_batched_tokens=32),
                             {"input_len": 33}),
    # arrivals admitted and prefilled whole inside a run (decode_run's first step), with step-time noise
    "lone-admissions-jitter": ("chat", 25.0, 300, ModeledEngine("h100-llama-1b", kv_blocks=2048),
                               {"jitter_sd": 0.05, "seed": 1}),
    # the same under a roofline profile, whose mixed step counts attention pairs
    "lone-admissions-roofline": ("chat", 6.0, 150, ModeledEngine("roofline:h100/llama-3.1-8b", kv_blocks=2048), {}),
    # prompts chunked while others queue: a chunk takes the budget, its last leaves the rest to the queue,
    # the queue is admitted in part (budget, blocks), the rest waits; shared prefixes make hits among them
    "congested-chunking": ("system-prompts", 40.0, 300, ModeledEngine("h100-llama-1b", kv_blocks=700,
                                                                      max_batched_tokens=512), {}),
    "congested-chat": ("chat", 40.0, 300, ModeledEngine("h100-llama-1b", kv_blocks=2048, max_batched_tokens=1024), {}),
    # a fully cached prompt: the admitting step's chunk is one token, which the executor counts as a decode
    "cached-prompt-repeats": ("tiny", 4.0, 80, ModeledEngine("cpu-tiny", kv_blocks=512), {"input_len": 33}),
    # vllm-v0 scheduling: whole-prompt steps between runs of decodes, KV pressure preempting, a full batch
    "v0-preempting": ("chat", 40.0, 200, ModeledEngine("h100-llama-1b", kv_blocks=300, scheduler="vllm-v0"), {}),
    "v0-max-seqs": ("chat", 60.0, 150, ModeledEngine("h100-llama-1b", kv_blocks=4096, max_num_seqs=4,
                                                      scheduler="vllm-v0"), {}),
    "v0-shared-prefixes": ("system-prompts", 12.0, 200, ModeledEngine("h100-llama-1b", kv_blocks=400,
                                                                      scheduler="vllm-v0"), {"jitter_sd": 0.03}),
}
GENERATE_KW = ("input_len", "output_len")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decode_runs_leave_every_record_as_stepping_does(name: str) -> None:
    workload, rate, n, engine, kw = SCENARIOS[name]
    gen = {k: v for k, v in kw.items() if k in GENERATE_KW}
    kw = {k: v for k, v in kw.items() if k not in GENERATE_KW}
    specs = generate(load_workload(workload), rate_rps=rate, num_requests=n, seed=3, **gen)
    fast = simulate_records(specs, engine, **kw)
    slow = simulate_records(specs, engine, decode_runs=False, **kw)
    assert [r.to_json() for r in fast] == [r.to_json() for r in slow]
    assert any(r.output_tokens > 1 for r in fast)


def test_engines_end_in_the_same_state(simulated_engines: list[Any]) -> None:
    built = simulated_engines
    specs = generate(load_workload("system-prompts"), rate_rps=10.0, num_requests=120, seed=2)
    for fast in (True, False):
        simulate_records(specs, ModeledEngine("h100-llama-1b", kv_blocks=300), decode_runs=fast)
    a, b = built[1], built[3]  # each run builds one engine from the factory, then the one it steps
    assert a.stats() == b.stats() and a.stats().num_generation_tokens > 0 and a.stats().num_blocks_cached > 0
    assert a.executor.num_steps == b.executor.num_steps
    assert a.executor.total_modeled_s == b.executor.total_modeled_s  # type: ignore[attr-defined]


def test_vectorised_tokens_are_the_executors() -> None:
    from reference_engine.executor.modeled_executor import ModeledExecutor
    from reference_engine.sequence import Sequence
    from slobench.fleet.decode_run import _tokens_ahead

    ex = ModeledExecutor(ModeledEngine().cost_profile(), block_size=16, num_blocks=8, vocab_size=300,
                         eos_token_id=100, token_id_range=(32, 127), seed=5)
    seqs = [Sequence(sid, [40] * n, m) for sid, n, m in ((0, 1, 200), (7, 30, 1), (2**40, 5, 64))]
    seqs[2].token_ids += [41] * 10  # ten sampled already: the rest comes from its position on
    got = _tokens_ahead(ex, seqs)
    assert [len(t) for t in got] == [200, 1, 54]
    for s, toks in zip(seqs, got, strict=True):
        assert toks == [ex.token_at(s.seq_id, len(s.token_ids) + j) for j in range(len(toks))]
    assert 100 not in {t for toks in got for t in toks}


@pytest.mark.parametrize(("rate", "engine", "most"), [
    (10.0, ModeledEngine("h100-llama-1b", kv_blocks=2048), 400 // 3),
    # chunked prompts with a queue behind them: 1,344 steps were stepped before runs took the queue; now 85
    (20.0, ModeledEngine("h100-llama-1b", kv_blocks=1024, max_batched_tokens=300), 400 // 4),
])
def test_admissions_are_taken_inside_runs(monkeypatch: pytest.MonkeyPatch, rate: float, engine: ModeledEngine,
                                          most: int) -> None:
    """The fast path is not a dead branch: most arrivals are admitted inside a run, so the engine is
    stepped for far fewer steps than there are requests (stepping admits each in a step of its own), at a
    light load and with long prompts chunked while others queue."""
    from reference_engine.engine import LLMEngine

    stepped = 0
    step = LLMEngine.step

    def counted(self: LLMEngine) -> object:
        nonlocal stepped
        stepped += 1
        return step(self)

    monkeypatch.setattr(LLMEngine, "step", counted)
    specs = generate(load_workload("chat"), rate_rps=rate, num_requests=400, seed=5)
    simulate_records(specs, engine)
    # what is left to step: preempted requests coming back, queues whose hits make the block count a bound
    assert stepped < most, stepped


def test_a_request_cost_inside_the_server_is_charged_once_at_its_first_token() -> None:
    """CostProfile.per_request_s (r): the step that samples a request's first token takes r longer for each
    such request; no other step does. A lone request's TTFT grows by r exactly and its TPOT not at all."""
    from dataclasses import replace

    from reference_engine.executor.modeled_executor import CostProfile

    base = CostProfile.load("cpu-tiny")
    specs = generate(load_workload("tiny"), rate_rps=0.2, num_requests=5, seed=1)  # one at a time
    plain = simulate_records(specs, ModeledEngine(base))
    costly = simulate_records(specs, ModeledEngine(replace(base, per_request_s=0.005)))
    for p, c in zip(plain, costly, strict=True):
        assert c.first_token_s == pytest.approx(p.first_token_s + 0.005, abs=1e-12)
        gaps_p = [b - a for a, b in zip(p.chunk_times_s, p.chunk_times_s[1:], strict=False)]
        gaps_c = [b - a for a, b in zip(c.chunk_times_s, c.chunk_times_s[1:], strict=False)]
        assert gaps_c == pytest.approx(gaps_p, abs=1e-12)
    # and decode runs replay it exactly, under load too (admissions, chunked prompts, first tokens together)
    heavy = generate(load_workload("chat"), rate_rps=30.0, num_requests=200, seed=2)
    engine = ModeledEngine(replace(CostProfile.load("h100-llama-1b"), per_request_s=0.003), kv_blocks=1024,
                           max_batched_tokens=600)
    fast = simulate_records(heavy, engine)
    slow = simulate_records(heavy, engine, decode_runs=False)
    assert [r.to_json() for r in fast] == [r.to_json() for r in slow]


@pytest.mark.parametrize(("workload", "engine", "kw"), [
    ("chat", ModeledEngine("h100-llama-1b", kv_blocks=2048), {}),
    # shared prefixes register blocks as they fill; a tight pool makes the run stop short of a preemption
    ("system-prompts", ModeledEngine("h100-llama-1b", kv_blocks=400), {"jitter_sd": 0.03}),
    ("chat", ModeledEngine("roofline:h100/llama-3.1-8b", kv_blocks=2048, scheduler="vllm-v0"), {}),
])
def test_a_run_with_no_queue_goes_on_past_each_finish(monkeypatch: pytest.MonkeyPatch, workload: str,
                                                      engine: ModeledEngine, kw: dict[str, Any]) -> None:
    """With nothing queued, a request finishing ends no run: the rest of the batch decodes on (each step
    without those that finished), and every record is still what stepping makes."""
    through = 0
    run = simulate.decode_run

    def counted(engine: Any, until_s: float) -> Any:
        nonlocal through
        ran = run(engine, until_s)
        through += ran is not None and bool(ran.ends)
        return ran

    specs = generate(load_workload(workload), rate_rps=4.0, num_requests=120, seed=6)
    slow = simulate_records(specs, engine, decode_runs=False, **kw)
    monkeypatch.setattr(simulate, "decode_run", counted)
    fast = simulate_records(specs, engine, **kw)
    assert [r.to_json() for r in fast] == [r.to_json() for r in slow]
    assert through > 10, through
