"""Roofline cost profiles: the arithmetic, the CostProfile extension, the CLI, and the check against
measured operator times (Vidur's profiling data, when the folder is present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import EngineConfigError
from slobench.profiles import GPUS, MODELS, Efficiency, get_model, roofline

VIDUR = Path(__file__).resolve().parents[2] / "shared" / "profiling" / "vidur-gpu-ops"


def test_model_shapes_give_the_published_parameter_counts() -> None:
    # the model cards' totals: 8.03B, 70.6B, 7.6B (Qwen2.5-7B's q/k/v biases, ~1M, are not counted)
    assert get_model("llama-3.1-8b").params == pytest.approx(8.03e9, rel=0.005)
    assert get_model("llama-3.1-70b").params == pytest.approx(70.55e9, rel=0.005)
    assert get_model("qwen2.5-7b").params == pytest.approx(7.61e9, rel=0.005)
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 128 * 1024  # 2 * 32 layers * 8 heads * 128 * 2 B


def test_decode_is_memory_bound_and_long_prefill_compute_bound() -> None:
    p = roofline("llama-3.1-8b", "h100")
    m, g, e = get_model("llama-3.1-8b"), GPUS["h100"], Efficiency()
    # batch-1 decode: the weights read dominates; a step at least bytes / (bandwidth * efficiency)
    weights_s = (m.num_layers * m.layer_params + m.vocab_size * m.hidden_size) * 2 / (g.hbm_tb_s * 1e12 * e.memory)
    assert p.weights_read_s == pytest.approx(weights_s)
    one = p.step_s(0, 1, 1000)
    assert weights_s < one < weights_s + 3e-3
    # a 4k-token prefill: compute, 2 * params FLOPs a token, at the compute efficiency
    n = 4096
    dense_s = 2 * m.num_layers * m.layer_params * n / (g.bf16_tflops * 1e12 * e.compute)
    long = p.step_s(n, 0, n, n * (n + 1) // 2)
    assert long > dense_s > weights_s
    # the roof is a max, not a sum: 64 tokens more on a weights-bound step cost far less than their FLOPs
    assert p.step_s(0, 65, 1000) - one < 0.5 * 64 * p.compute_per_token_s


def test_h200_is_faster_than_h100_only_where_memory_binds() -> None:
    h100, h200 = roofline("llama-3.1-8b", "h100"), roofline("llama-3.1-8b", "h200")
    assert h200.step_s(0, 8, 8 * 2000) < 0.85 * h100.step_s(0, 8, 8 * 2000)  # 4.8 vs 3.35 TB/s
    n = 8192
    assert h200.step_s(n, 0, n, n * n // 2) == pytest.approx(h100.step_s(n, 0, n, n * n // 2), rel=0.05)


def test_tensor_parallel_splits_weights_and_kv() -> None:
    one, four = roofline("llama-3.1-8b", "h100"), roofline("llama-3.1-8b", "h100", tp=4)
    assert four.weights_read_s == pytest.approx(one.weights_read_s / 4)
    assert four.kv_read_per_context_token_s == pytest.approx(one.kv_read_per_context_token_s / 4)
    assert four.step_overhead_s > one.step_overhead_s  # all-reduce latencies
    with pytest.raises(EngineConfigError, match="weights need"):
        roofline("llama-3.1-70b", "h100", tp=1)
    # the weights fit in the memory (131 of 140 GiB) but not in the 90% an engine takes, less no KV
    with pytest.raises(EngineConfigError, match=r"131\.4 GiB a GPU, leaving no room for the KV cache in 90% of the h200's 140\.4 GiB"):
        roofline("llama-3.1-70b", "h200", tp=1)
    assert roofline("llama-3.1-70b", "h200", tp=2).provenance["kv_capacity_tokens"] > 0  # type: ignore[index]
    with pytest.raises(EngineConfigError, match="tp"):
        roofline("llama-3.1-8b", "h100", tp=0)


def test_linear_profiles_are_unchanged_and_round_trip(tmp_path: Path) -> None:
    lin = CostProfile.load("cpu-tiny")
    assert not lin.is_roofline
    assert lin.step_s(10, 3, 500) == pytest.approx(0.0015 + 6e-5 * 10 + 1.2e-4 * 3 + 2.5e-7 * 500)
    assert "weights_read_s" not in json.loads(lin.to_json())
    roof = roofline("qwen2.5-7b", "l40s")
    path = tmp_path / "r.json"
    path.write_text(roof.to_json())
    back = CostProfile.load(path)
    assert back == roof and back.provenance == roof.provenance
    assert back.scaled(2.0).step_s(100, 4, 4000, 10_000) == pytest.approx(2 * roof.step_s(100, 4, 4000, 10_000))


def test_the_profile_flag_accepts_a_roofline_name() -> None:
    assert CostProfile.load("roofline:h100/llama-3.1-8b") == roofline("llama-3.1-8b", "h100")
    assert CostProfile.load("roofline:a100/llama-3.1-70b/tp8") == roofline("llama-3.1-70b", "a100", 8)
    with pytest.raises(EngineConfigError, match="known: h100"):
        CostProfile.load("roofline:x900/llama-3.1-8b")  # b200 is built in now
    with pytest.raises(EngineConfigError, match="roofline:GPU/MODEL"):
        CostProfile.load("roofline:h100")


def test_a_simulated_run_takes_a_roofline_profile() -> None:
    from slobench.fleet.simulate import ModeledEngine, simulate_records
    from slobench.run.records import RequestSpec

    specs = [RequestSpec(i, i * 0.05, tuple(range(100, 100 + 512)), 512, 64) for i in range(20)]
    h100 = simulate_records(specs, ModeledEngine(profile="roofline:h100/llama-3.1-8b"))
    l40s = simulate_records(specs, ModeledEngine(profile="roofline:l40s/llama-3.1-8b"))
    assert all(r.status == "ok" and r.output_tokens == 64 for r in h100 + l40s)
    tpot = [sum((r.done_s - r.first_token_s) / 63 for r in recs) / len(recs)  # type: ignore[operator]
            for recs in (h100, l40s)]
    assert tpot[1] > 3 * tpot[0]  # 0.864 vs 3.35 TB/s: decode is memory-bound


def test_cli_writes_a_profile_and_names_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--gpu", "h200", "--model", "llama-3.1-70b", "--tp", "2", "-o", str(out)]) == 0
    assert CostProfile.load(out) == roofline("llama-3.1-70b", "h200", 2)
    capsys.readouterr()
    assert main(["profile", "--gpu", "h100", "--model", "gpt-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(m in err for m in MODELS)


@pytest.mark.skipif(not VIDUR.is_dir(), reason="Vidur's measured operator times are not in this workspace")
def test_roofline_dense_part_against_vidur_measurements() -> None:
    from slobench.profiles import vidur

    tables = vidur.read_folder(VIDUR)
    assert {t.gpu.name for t in tables} >= {"h100", "a100"} and len(tables) >= 8
    # the bundled efficiencies are what the fit gives from these files
    assert vidur.fit_efficiency(tables) == Efficiency()
    results = vidur.compare(tables)
    import numpy as np

    medians = np.array([c.median_error for c in results])
    # per-layer dense time over 1..4096 tokens: a median error of ~5%; the largest where the sharp roof
    # meets the smooth measurement (~100-400 tokens), under-predicting by up to ~45%
    assert np.median(medians) < 0.08, results
    assert max(c.median_error for c in results) < 0.15, results
    assert max(c.max_error for c in results) < 0.5, results


def test_kv_capacity_is_memory_less_weights_over_kv_bytes() -> None:
    from slobench.profiles import kv_capacity_tokens

    m = get_model("llama-3.1-8b")
    expected = (81_559 * 2**20 * 0.9 - m.params * 2) / m.kv_bytes_per_token  # the driver's MiB, not 80e9 bytes
    assert kv_capacity_tokens("llama-3.1-8b", "h100") == pytest.approx(expected, abs=1)
    reserved = (81_559 * 2**20 * (0.9 - 0.01) - m.params * 2) / m.kv_bytes_per_token
    assert kv_capacity_tokens("llama-3.1-8b", "h100", reserve_fraction=0.01) == pytest.approx(reserved, abs=1)
    # 141 vs 80 GB, less the same 16 GB of weights: ~1.98x the tokens
    assert kv_capacity_tokens("llama-3.1-8b", "h200") > 1.9 * kv_capacity_tokens("llama-3.1-8b", "h100")
    assert kv_capacity_tokens("llama-3.1-70b", "a100", tp=1) == 0  # the weights alone do not fit
    assert roofline("llama-3.1-70b", "h100", 4).provenance["kv_capacity_tokens"] == (  # type: ignore[index]
        kv_capacity_tokens("llama-3.1-70b", "h100", 4))
    with pytest.raises(Exception, match="memory_utilization"):
        kv_capacity_tokens("llama-3.1-8b", "h100", memory_utilization=1.5)
    with pytest.raises(Exception, match="reserve_fraction"):
        kv_capacity_tokens("llama-3.1-8b", "h100", memory_utilization=0.5, reserve_fraction=0.5)
