"""Virtual-clock runs of the reference engine: exact modeled times, determinism, the cliff, and capacity."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile
from reference_engine.protocol import chat_prompt
from reference_engine.tokenizer import ByteTokenizer
from slobench.analysis.slo import SLO
from slobench.analysis.summary import error_kinds
from slobench.errors import EngineConfigError
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import (
    ModeledEngine,
    SimOptions,
    simulate_records,
    simulate_run,
    sweep_crossing,
)
from slobench.run.records import RequestSpec
from slobench.run.rundir import load_run
from slobench.workload import generate, load_workload

# step_s = a + b * prefill_tokens + c * decode_seqs + d * context_tokens, with round numbers
PROFILE = CostProfile("exact", step_overhead_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.002,
                      per_context_token_s=0.0001)
ENGINE = ModeledEngine(PROFILE, kv_blocks=64)
CLIFF_KNOBS = {"profile": "cpu-tiny", "kv_blocks": 256, "max_num_seqs": 32}
CLIFF_SLO = SLO.parse("ttft=100ms,tpot=15ms")


def spec(rid: int, arrival_s: float, n_in: int = 32, n_out: int = 4, **kw: object) -> RequestSpec:
    ids = tuple(40 + (97 * rid + k) % 200 for k in range(n_in))  # no shared prefix between requests
    return RequestSpec(rid, arrival_s, ids, n_in, n_out, **kw)  # type: ignore[arg-type]


def tiny(rate: float, n: int, seed: int = 1) -> list[RequestSpec]:
    return generate(load_workload("tiny"), rate_rps=rate, num_requests=n, seed=seed)


def test_one_request_gets_exactly_the_modeled_step_times() -> None:
    (rec,) = simulate_records([spec(7, 0.5)], ENGINE)
    prefill = 0.01 + 0.001 * 32 + 0.0001 * 32  # one step computes the whole prompt and samples token 1
    decodes = [0.01 + 0.002 + 0.0001 * ctx for ctx in (33, 34, 35)]
    assert rec.status == "ok" and rec.request_id == 7
    assert rec.scheduled_s == rec.sent_s == 0.5
    assert rec.first_token_s == pytest.approx(0.5 + prefill)
    assert rec.done_s == pytest.approx(0.5 + prefill + sum(decodes))
    assert rec.chunk_times_s == pytest.approx([0.5 + prefill + sum(decodes[:k]) for k in range(4)])
    assert rec.chunk_tokens == [1, 1, 1, 1] and rec.output_tokens == 4 and rec.prompt_tokens == 32


def test_arrival_during_a_step_waits_for_the_step_boundary() -> None:
    a, b = simulate_records([spec(0, 0.0), spec(1, 0.01)], ENGINE)
    first = 0.01 + 0.032 + 0.0032
    # b joins at the boundary: its prefill shares step 2 with a's first decode (context 32 + 33)
    step2 = 0.01 + 0.001 * 32 + 0.002 + 0.0001 * 65
    assert a.first_token_s == pytest.approx(first)
    assert b.sent_s == 0.01 and b.first_token_s == pytest.approx(first + step2)
    assert b.first_token_s - b.sent_s == pytest.approx(first + step2 - 0.01)  # TTFT counts the wait


def test_idle_engine_jumps_to_the_next_arrival() -> None:
    a, b = simulate_records([spec(0, 0.0, n_out=1), spec(1, 100.0, n_out=1)], ENGINE)
    assert a.done_s == pytest.approx(0.0452)
    assert b.first_token_s == pytest.approx(100.0452)


def test_step_scale_stretches_every_step() -> None:
    (base,) = simulate_records([spec(0, 0.0, n_out=8)], ENGINE)
    (slow,) = simulate_records([spec(0, 0.0, n_out=8)], ModeledEngine(PROFILE, kv_blocks=64, step_scale=1.15))
    assert slow.done_s == pytest.approx(1.15 * base.done_s)


def test_deterministic_for_a_seed_and_jitter_changes_with_it() -> None:
    specs = tiny(40.0, 150)
    runs = [simulate_run(specs, CLIFF_KNOBS, slo=CLIFF_SLO, seed=s, jitter_sd=0.02) for s in (3, 3, 4)]
    (r1, s1), (r2, s2), (r3, _) = runs
    assert [r.to_json() for r in r1] == [r.to_json() for r in r2]
    assert json.dumps(s1.to_dict(), sort_keys=True) == json.dumps(s2.to_dict(), sort_keys=True)
    assert [r.done_s for r in r1] != [r.done_s for r in r3]
    no_jitter = simulate_records(specs, CLIFF_KNOBS, seed=3)
    assert [r.to_json() for r in no_jitter] == [r.to_json() for r in simulate_records(specs, CLIFF_KNOBS, seed=9)]


def test_summary_is_the_libraries_summary_on_virtual_seconds() -> None:
    records, summary = simulate_run(tiny(20.0, 100), CLIFF_KNOBS, slo=CLIFF_SLO)
    assert summary.clock == "virtual" and summary.num_requests == summary.num_ok == 100
    att = summary.attainment
    assert att.ci_low is not None and att.ci_low <= att.value <= att.ci_high
    assert summary.client.is_bottleneck is False  # every request went out exactly on time
    assert all(r.sent_s == r.scheduled_s for r in records)
    assert all(sum(r.chunk_tokens) == r.output_tokens == r.max_tokens for r in records)
    _, lean = simulate_run(tiny(20.0, 100), CLIFF_KNOBS, slo=CLIFF_SLO, intervals=False)
    assert lean.attainment.value == att.value and lean.ttft.p99 == summary.ttft.p99 and lean.attainment.ci_low is None


def test_attainment_falls_as_rate_rises_across_the_cliff() -> None:
    rates = [20.0, 40.0, 60.0, 80.0, 120.0]
    att = [simulate_run(tiny(r, 200), CLIFF_KNOBS, slo=CLIFF_SLO, intervals=False)[1].attainment.value
           for r in rates]
    assert att[0] == 1.0 and att[-1] < 0.2, att
    assert all(later <= earlier for earlier, later in zip(att, att[1:], strict=False)), att


def test_rejected_request_is_a_failed_record_and_the_rest_run() -> None:
    engine = ModeledEngine(PROFILE, kv_blocks=64, max_model_len=64)
    # (a request asking past the context is shortened before it is sent, as a live run does: this one's
    # own body asks for more than it said)
    ok, too_long, empty = simulate_records(
        [spec(0, 0.0), spec(1, 0.1, n_in=60, n_out=4, extra_body=(("max_tokens", 8),)), RequestSpec(2, 0.2, (), 0, 4)],
        engine)
    assert ok.status == "ok" and ok.output_tokens == 4
    assert too_long.status == "error" and too_long.error.startswith("too long: ")  # as over HTTP
    assert "maximum context length is 64" in too_long.error
    assert too_long.sent_s == too_long.done_s == 0.1 and too_long.first_token_s is None
    assert empty.status == "error" and empty.error.startswith("rejected: ") and "empty" in empty.error
    # counted apart: a length refusal is its own kind in the summary, as on the HTTP path
    assert error_kinds([too_long.error, empty.error]) == {"too long": 1, "rejected": 1}


def test_text_and_chat_prompts_are_tokenised_as_the_server_does() -> None:
    (plain,) = simulate_records([RequestSpec(0, 0.0, "hello", 5, 3)], ENGINE)
    (chat,) = simulate_records([RequestSpec(0, 0.0, "hello", 5, 3)], ENGINE, api="chat")
    assert plain.prompt_tokens == 5
    assert chat.prompt_tokens == len(ByteTokenizer().encode(chat_prompt([{"role": "user", "content": "hello"}])))
    assert plain.output_tokens == chat.output_tokens == 3


class _RealTimeExecutor:
    """Runs steps 'for real' (reports no modeled time): meaningless on a virtual clock."""

    block_size, num_blocks, vocab_size, eos_token_id = 16, 64, 300, None

    def execute(self, batch: StepBatch) -> StepResult:
        return StepResult([40 if c.sample else None for c in batch.chunks])


def test_needs_a_modeled_executor_and_valid_knobs() -> None:
    with pytest.raises(EngineConfigError, match="modeled"):
        simulate_records([spec(0, 0.0)], lambda: LLMEngine(EngineConfig(num_blocks=64), _RealTimeExecutor()))
    with pytest.raises(EngineConfigError, match="executor"):
        simulate_records([spec(0, 0.0)], {"executor": "torch"})
    with pytest.raises(EngineConfigError, match="unknown knobs"):
        simulate_records([spec(0, 0.0)], {"kv_block": 12})
    with pytest.raises(EngineConfigError, match="kv_blocks"):
        ModeledEngine(kv_blocks=0)
    with pytest.raises(EngineConfigError, match="step_scale"):
        ModeledEngine(step_scale=0)
    with pytest.raises(EngineConfigError, match="jitter_sd"):
        simulate_records([spec(0, 0.0)], ENGINE, jitter_sd=-1)


async def test_simulated_measure_writes_probe_run_directories(tmp_path) -> None:
    m = SimulatedMeasure("tiny", CLIFF_KNOBS, CLIFF_SLO, num_requests=30, out_dir=tmp_path, manifest={"x": 1})
    s1 = await m(20.0, 1)
    s2 = await m(20.0, 1)
    assert s1.run_dir == "probe-00-rate-20-seed-1" and s2.run_dir == "probe-01-rate-20-seed-1"
    assert replace(s1, run_dir=None).to_dict() == replace(s2, run_dir=None).to_dict()  # the same probe twice: same result
    run = load_run(tmp_path / s1.run_dir)
    assert len(run.records) == 30 and run.manifest["x"] == 1 and run.manifest["rate_rps"] == 20.0
    assert run.summary.attainment.value == s1.attainment.value


async def test_sweep_crosses_the_target_where_capacity_finds_capacity() -> None:
    m = SimulatedMeasure("tiny", CLIFF_KNOBS, CLIFF_SLO, num_requests=100, jitter_sd=0.01)
    res = await search_capacity(m, SearchOptions(start_rps=10.0, replicates=5))
    lo, hi = res.interval_rps
    assert lo < res.capacity_rps < hi
    rates = [round(res.capacity_rps * f, 3) for f in (0.75, 0.85, 0.95, 1.05, 1.15, 1.25)]
    crossing, means = await sweep_crossing(m, rates, list(range(500, 506)), 0.9)
    assert means[0] > 0.9 > means[-1]  # the sweep spans the crossing
    assert lo <= crossing <= hi, (crossing, res.interval_rps, means)


def test_knobs_are_build_engines() -> None:
    eng = ModeledEngine.from_knobs({"executor": "modeled", "model": "m", "kv_blocks": 32, "dtype": "float32",
                                    "device": "cpu", "max_model_len": None})
    assert eng.kv_blocks == 32 and eng.name == "m" and eng.max_model_len == 4096  # None keeps the default
    built = eng()
    assert built.config.num_blocks == built.executor.num_blocks == 32


# ---- fleets ----------------------------------------------------------------------------------------------


def _times(recs: list) -> list[tuple]:
    return [(r.request_id, r.first_token_s, r.done_s, tuple(r.chunk_times_s), r.output_tokens) for r in recs]


def test_round_robin_fleet_is_two_independent_engines() -> None:
    # Replicas share nothing, so a 2-replica round-robin fleet must give each request exactly the times it
    # gets when its half of the traffic (every other request) runs on an engine of its own.
    specs = tiny(40.0, 120, seed=3)
    fleet: dict = {}
    recs = simulate_records(specs, CLIFF_KNOBS, replicas=2, router="round-robin", fleet=fleet)
    assert fleet["requests_per_replica"] == [60, 60] and fleet["router"] == "round-robin"
    ordered = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
    halves = [simulate_records(ordered[k::2], CLIFF_KNOBS) for k in (0, 1)]
    assert sorted(_times(recs)) == sorted(_times(halves[0] + halves[1]))
    assert sum(fleet["output_tokens_per_replica"]) == sum(r.output_tokens for r in recs)


def test_one_replica_is_the_single_engine_run() -> None:
    specs = tiny(60.0, 80)
    assert _times(simulate_records(specs, CLIFF_KNOBS, jitter_sd=0.05, seed=9)) == _times(
        simulate_records(specs, CLIFF_KNOBS, jitter_sd=0.05, seed=9, replicas=1, router="round-robin"))


def test_least_outstanding_spreads_a_burst_and_beats_round_robin_on_heavy_tails() -> None:
    burst = [spec(i, 0.0) for i in range(10)]
    fleet: dict = {}
    simulate_records(burst, ENGINE, replicas=3, fleet=fleet)
    assert fleet["requests_per_replica"] == [4, 3, 3]
    # chat lengths are heavy-tailed: blind turns pile long requests onto one replica now and then, which
    # costs where the KV cache is tight (with room to spare, round-robin's even spread is as good or better).
    # Over five seeds: one seed alone can go either way
    knobs = {"profile": "h100-llama-1b", "kv_blocks": 400}
    slo = SLO.parse("ttft=300ms,tpot=40ms")
    p99 = {"least-outstanding": 0.0, "round-robin": 0.0}
    attained = dict(p99)
    for seed in range(1, 6):
        specs = generate(load_workload("chat"), rate_rps=30.0, num_requests=600, seed=seed)
        for router in p99:
            _, summary = simulate_run(specs, knobs, slo=slo, replicas=4, router=router, intervals=False)
            assert summary.fleet["replicas"] == 4
            p99[router] += summary.ttft.p99 / 5
            attained[router] += summary.attainment.value / 5
    assert p99["least-outstanding"] < 0.9 * p99["round-robin"]  # measured 586 ms against 791
    assert attained["least-outstanding"] > attained["round-robin"]  # 95.7% against 92.7%


def test_prefix_affinity_keeps_shared_prefixes_on_one_replica() -> None:
    # Zipf-popular system prompts, KV caches too small to hold every prompt on every replica: spraying
    # requests makes each replica cache (and evict) them all; affinity gives each prompt one home.
    specs = generate(load_workload("system-prompts"), rate_rps=20.0, num_requests=300, seed=2)
    share = {}
    for router in ("prefix-affinity", "round-robin"):
        recs = simulate_records(specs, {"profile": "h100-llama-1b", "kv_blocks": 300}, replicas=4, router=router)
        cached = sum(r.cached_tokens or 0 for r in recs)
        share[router] = cached / sum(r.prompt_tokens or 0 for r in recs)
    assert share["prefix-affinity"] > share["round-robin"] + 0.15  # measured 66% against 43%


def test_bad_fleets_are_refused() -> None:
    for n in (0, -2, True, 1.5):
        with pytest.raises(EngineConfigError, match="replicas"):
            simulate_records([spec(0, 0.0)], ENGINE, replicas=n)  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="router"):
        simulate_records([spec(0, 0.0)], ENGINE, replicas=2, router="random")


def test_options_are_checked_once_and_given_one_way() -> None:
    for bad in ({"jitter_sd": -0.1}, {"request_overhead_s": float("inf")}, {"api": "messages"},
                {"router": "random"}, {"replicas": 0}):
        with pytest.raises(EngineConfigError, match=next(iter(bad))):
            SimOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="twice"):
        simulate_records([spec(0, 0.0)], ENGINE, SimOptions(seed=1), seed=2)
    specs = [spec(i, 0.01 * i) for i in range(20)]
    given = simulate_records(specs, ENGINE, SimOptions(seed=3, jitter_sd=0.05, replicas=2))
    named = simulate_records(specs, ENGINE, seed=3, jitter_sd=0.05, replicas=2)
    assert [r.to_json() for r in given] == [r.to_json() for r in named]


def test_prefix_balanced_leaves_an_overloaded_home() -> None:
    # 20 requests at once, all with the same prefix: affinity piles them on one replica; the balanced router
    # keeps them home until the home holds > 4 more than the least loaded (and 1.5x as many), then spills.
    same = [RequestSpec(i, 0.0, tuple(range(40, 120)), 80, 4) for i in range(20)]
    counts = {}
    for router in ("prefix-affinity", "prefix-balanced"):
        fleet: dict = {}
        simulate_records(same, ENGINE, replicas=4, router=router, fleet=fleet)
        counts[router] = sorted(fleet["requests_per_replica"], reverse=True)
    assert counts["prefix-affinity"] == [20, 0, 0, 0]
    assert counts["prefix-balanced"][0] <= 9 and sum(counts["prefix-balanced"]) == 20
    assert counts["prefix-balanced"][-1] >= 3


def test_queue_drift_flags_runs_past_capacity() -> None:
    from rich.console import Console

    from slobench.report.terminal import print_run

    knobs = {"profile": "h100-llama-1b", "kv_blocks": 2048}
    slo = SLO.parse("ttft=300ms,tpot=40ms")
    drift = {}
    for rate in (20.0, 40.0):  # the simulated chat engine's capacity is ~35 req/s
        specs = generate(load_workload("chat"), rate_rps=rate, duration_s=30, seed=1)
        _, summary = simulate_run(specs, knobs, slo=slo)
        drift[rate] = summary.queue_drift
        console = Console(record=True, width=200)
        print_run(summary, console)
        assert ("past capacity" in console.export_text()) == (rate == 40.0)
    assert not drift[20.0]["overloaded"] and 0.7 < drift[20.0]["ratio"] < 1.4
    assert drift[40.0]["overloaded"] and drift[40.0]["ratio"] > 3
    phased = generate(load_workload("day-shift"), rate_rps=12.0, num_requests=200, seed=1)
    assert simulate_run(phased, knobs, slo=slo)[1].queue_drift is None  # load changes on purpose
