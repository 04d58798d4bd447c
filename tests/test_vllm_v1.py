"""The vllm-v1 policy: today's vLLM. Its steps are chunked's (running requests first, decodes and continuing
prompt chunks, then waiting prompts cut to the token budget; preemption of the newest by recompute); its
sizes left unset are vLLM V1's; its KV blocks come from the GPU's memory as vLLM sizes them; and its host
work overlaps the forward pass (the overlap rule)."""

from __future__ import annotations

import argparse

import pytest

from reference_engine.config import EngineSpec, vllm_v1_defaults
from reference_engine.errors import ConfigError
from reference_engine.executor.kv_sizing import estimated_activation_peak_bytes
from reference_engine.executor.modeled_executor import overlapped_step_s
from reference_engine.sequence import SeqStatus
from reference_engine.serve_args import add_engine_spec_arguments, engine_spec_from_args
from slobench.fleet.simulate import ModeledEngine, simulate_records
from slobench.profiles import GPUS, get_model
from slobench.profiles.roofline import vllm_kv_blocks
from slobench.run.records import RequestSpec
from tests.test_scheduler import reference_output, run_all, seq, setup, step

MIB = 1 << 20


def composition(batch) -> list[tuple[int, int, bool]]:  # type: ignore[no-untyped-def]
    """(seq_id, tokens, is_decode) of each chunk, in the step's order."""
    return [(c.seq_id, len(c.token_ids), c.start_pos > 0 and len(c.token_ids) == 1 and c.sample) for c in batch.chunks]


def test_decodes_first_then_prompt_chunks_under_the_budget() -> None:
    s, ex = setup(scheduler="vllm-v1", max_num_batched_tokens=10, max_num_seqs=4)
    prompts = {0: list(range(1, 7)), 1: list(range(10, 16)), 2: list(range(20, 40))}
    s.add(seq(0, prompts[0], max_tokens=5))
    s.add(seq(1, prompts[1], max_tokens=5))
    assert composition(step(s, ex)) == [(0, 6, False), (1, 4, False)]  # the second prompt cut at the budget
    s.add(seq(2, prompts[2], max_tokens=5))
    # seq 0 decodes first, seq 1's prompt goes on, the new prompt takes what is left of the 10 tokens
    assert composition(step(s, ex)) == [(0, 1, True), (1, 2, False), (2, 7, False)]
    assert composition(step(s, ex)) == [(0, 1, True), (1, 1, True), (2, 8, False)]
    for _ in range(3):
        b = step(s, ex)
        assert sum(n for _, n, _ in composition(b)) <= 10
        kinds = [d for _, _, d in composition(b)]
        assert kinds == sorted(kinds, reverse=True)  # no decode after a prompt chunk
    run_all(s, ex)


def test_steps_are_chunked_ones_token_for_token() -> None:
    traces = []
    for policy in ("chunked", "vllm-v1"):
        s, ex = setup(scheduler=policy, max_num_batched_tokens=7, num_blocks=12)
        seqs = [seq(i, [i + 1] * (5 + 3 * i), max_tokens=6) for i in range(4)]
        for x in seqs:
            s.add(x)
        trace = []
        while s.has_work():
            trace.append([(c.seq_id, c.start_pos, len(c.token_ids)) for c in step(s, ex).chunks])
        traces.append((trace, [x.output_token_ids for x in seqs], s.num_preemptions))
        assert [x.output_token_ids for x in seqs] == [reference_output(x.token_ids[: x.num_prompt_tokens], 6) for x in seqs]
    assert traces[0] == traces[1]


def test_preemption_is_by_recompute_of_the_newest() -> None:
    s, ex = setup(scheduler="vllm-v1", block_size=4, num_blocks=4, max_num_batched_tokens=64)
    a, b = seq(0, [1] * 7, max_tokens=8), seq(1, [2] * 7, max_tokens=8)
    s.add(a)
    s.add(b)
    step(s, ex)  # both prompts whole: 2 blocks each, the cache full
    step(s, ex)  # each decodes its 8th token into its second block
    step(s, ex)  # the 9th needs a third block for a: b, the newest, gives its blocks back
    assert b.status is SeqStatus.WAITING and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert list(s.waiting) == [b] and s.num_preemptions == 1
    run_all(s, ex)
    assert b.output_token_ids == reference_output([2] * 7, 8)


def test_vllm_v1_defaults_by_gpu() -> None:
    def memory(name: str) -> int:
        return GPUS[name].memory_bytes

    assert vllm_v1_defaults(memory("h100"), "h100") == (8192, 1024)
    assert vllm_v1_defaults(memory("mi300x"), "mi300x") == (8192, 1024)
    assert vllm_v1_defaults(memory("a100"), "a100") == (2048, 256)  # 80 GiB, but vLLM keeps the A100 small
    assert vllm_v1_defaults(memory("l40s"), "l40s") == (2048, 256)
    assert vllm_v1_defaults(None) == (2048, 256)


def spec_of(*argv: str) -> EngineSpec:
    p = argparse.ArgumentParser()
    add_engine_spec_arguments(p)
    return engine_spec_from_args(p.parse_args(list(argv)))


def test_the_policy_takes_vllm_sizes_only_where_none_is_given() -> None:
    h100 = ("--profile", "roofline:h100/llama-3.1-8b")
    v1 = spec_of("--scheduler", "vllm-v1", *h100)
    assert (v1.scheduler, v1.max_batched_tokens, v1.max_num_seqs) == ("vllm-v1", 8192, 1024)
    given = spec_of("--scheduler", "vllm-v1", "--max-batched-tokens", "4096", "--max-num-seqs", "32", *h100)
    assert (given.max_batched_tokens, given.max_num_seqs) == (4096, 32)
    l40s = spec_of("--scheduler", "vllm-v1", "--profile", "roofline:l40s/llama-3.1-8b")
    assert (l40s.max_batched_tokens, l40s.max_num_seqs) == (2048, 256)
    chunked = spec_of(*h100)  # the default policy's sizes are as they were
    assert (chunked.scheduler, chunked.max_batched_tokens, chunked.max_num_seqs) == ("chunked", 2048, 64)


def test_kv_blocks_of_llama_8b_on_an_h100_as_vllm_derives_them() -> None:
    # by hand: the driver's 81,559 MiB x 0.9; the weights, 8.03B parameters x 2 bytes (the model card's count);
    # the profiling pass's peak, the sampler's 1,024 rows x 128,256 logits x 4 bytes x 2 (above the forward's
    # 8,192 tokens x (2 x 4,096 + 3 x 14,336) x 2 bytes = 0.84 GB); a block, 16 tokens x 128 KiB of K and V
    budget = 0.9 * 81_559 * MIB - 8.03e9 * 2 - 1024 * 128_256 * 4 * 2
    hand = budget / (16 * 128 * 1024)
    assert hand == pytest.approx(28_542, abs=1)
    # the parameter count rounded to 8.03B is the only loose figure: 0.5% holds it with room
    derived = vllm_kv_blocks("llama-3.1-8b", "h100", max_num_batched_tokens=8192, max_num_seqs=1024)
    assert derived == pytest.approx(hand, rel=0.005)
    m = get_model("llama-3.1-8b")
    peak = estimated_activation_peak_bytes(max_num_batched_tokens=8192, max_num_seqs=1024, hidden_size=m.hidden_size,
                                           mlp_width=m.intermediate_size, mlp_matrices=3, vocab_size=m.vocab_size,
                                           dtype_bytes=2)
    assert peak == 1024 * 128_256 * 4 * 2
    # a larger step budget makes the forward the peak, and leaves fewer blocks
    assert vllm_kv_blocks("llama-3.1-8b", "h100", max_num_batched_tokens=65_536, max_num_seqs=1024) < derived


def test_a_gpu_too_small_for_the_weights_is_refused_naming_the_terms() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization.*weights|in use"):
        vllm_kv_blocks("llama-3.1-70b", "l4", max_num_batched_tokens=2048, max_num_seqs=256)


def test_the_simulator_sizes_the_kv_cache_as_vllm_does_under_the_policy() -> None:
    knobs = {"profile": "roofline:h100/llama-3.1-8b", "scheduler": "vllm-v1", "max_batched_tokens": 8192,
             "max_num_seqs": 1024}
    derived = vllm_kv_blocks("llama-3.1-8b", "h100", max_num_batched_tokens=8192, max_num_seqs=1024)
    assert ModeledEngine.from_knobs(knobs).kv_blocks == derived
    assert ModeledEngine.from_knobs({**knobs, "kv_blocks": 500}).kv_blocks == 500  # --kv-blocks wins
    assert ModeledEngine.from_knobs({**knobs, "scheduler": "chunked"}).kv_blocks == 2048  # as it was
    assert ModeledEngine.from_knobs({**knobs, "profile": "cpu-tiny"}).kv_blocks == 2048  # no GPU named
    tp4 = ModeledEngine.from_knobs({**knobs, "profile": "roofline:h100/llama-3.1-70b/tp4"}).kv_blocks
    assert tp4 == vllm_kv_blocks("llama-3.1-70b", "h100", 4, max_num_batched_tokens=8192, max_num_seqs=1024)


def test_a_simulated_run_under_the_policy_is_chunkeds_run() -> None:
    specs = [RequestSpec(i, i * 0.02, tuple(range(100, 100 + 300 + 37 * i)), 300 + 37 * i, 40) for i in range(30)]
    runs = [simulate_records(specs, ModeledEngine(profile="roofline:h100/llama-3.1-8b", kv_blocks=400,
                                                  max_batched_tokens=512, scheduler=policy))
            for policy in ("chunked", "vllm-v1")]
    assert all(r.status == "ok" for r in runs[1])
    assert [(r.first_token_s, r.done_s, r.chunk_times_s) for r in runs[0]] == [(r.first_token_s, r.done_s, r.chunk_times_s) for r in runs[1]]


def test_async_scheduling_hides_the_host_work_behind_the_forward_pass() -> None:
    assert overlapped_step_s(0.020, 0.008, async_scheduling=False) == pytest.approx(0.028)
    assert overlapped_step_s(0.020, 0.008, async_scheduling=True) == 0.020  # hidden
    assert overlapped_step_s(0.005, 0.008, async_scheduling=True) == 0.008  # the host bounds the step
    with pytest.raises(ConfigError, match="step_s"):
        overlapped_step_s(-1.0, 0.0, async_scheduling=True)


def test_the_policy_overlaps_a_profiles_host_terms_with_its_forward_pass() -> None:
    from reference_engine.executor.modeled_executor import CostProfile

    base = CostProfile.load("roofline:h100/llama-3.1-8b").with_host_costs(0.004, 0.0001)
    forward = base.with_host_costs(0.0, 0.0).step_s(0, 64, 64 * 1000)
    host = 0.004 + 0.0001 * 64
    assert base.under_policy("chunked").step_s(0, 64, 64 * 1000) == pytest.approx(forward + host)
    v1 = base.under_policy("vllm-v1")
    assert v1.async_scheduling and v1.step_s(0, 64, 64 * 1000) == pytest.approx(max(forward, host))
    assert v1.with_host_costs(0.5, 0.0).step_s(0, 64, 64 * 1000) == pytest.approx(0.5)  # host-bound
    assert v1.under_policy("vllm-v0").async_scheduling is False
    assert "async_scheduling" not in base.to_json() and '"async_scheduling": true' in v1.to_json()
    # the simulator runs the policy's profile: the same steps, shorter by the hidden host work
    specs = [RequestSpec(i, i * 0.05, tuple(range(100, 612)), 512, 64) for i in range(20)]
    runs = {policy: simulate_records(specs, ModeledEngine(profile=base, kv_blocks=4000, max_num_seqs=64,
                                                          max_batched_tokens=2048, scheduler=policy))
            for policy in ("chunked", "vllm-v1")}
    assert all(r.status == "ok" for rs in runs.values() for r in rs)
    assert sum(r.done_s or 0 for r in runs["vllm-v1"]) < sum(r.done_s or 0 for r in runs["chunked"])


def test_a_served_modeled_engine_runs_the_policys_profile() -> None:
    from reference_engine.builder import build_engine

    for policy, is_async in (("vllm-v1", True), ("chunked", False)):
        engine, _ = build_engine(EngineSpec(profile="cpu-tiny", scheduler=policy))
        assert engine.executor.profile.async_scheduling is is_async  # type: ignore[attr-defined]
        assert engine.scheduler.config.scheduler == policy
