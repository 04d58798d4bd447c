"""Per-phase step-time fits (reference_engine.executor.phase_fit): DistServe's formulas, read from its profiler
files, as a cost profile the modeled executor uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference_engine.errors import ConfigError
from reference_engine.executor.base import SeqChunk, StepBatch
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.executor.phase_fit import PhaseFit, read_distserve

FIT = PhaseFit(prefill=(0.02, 1e-4, 1e-8), decode_small=(0.03, 1e-6, 1e-4), decode_large=(0.01, 2e-6, 3e-4),
               large_batch_from=8)
DISTSERVE_FILE = {"facebook/opt-13b": {"1": {"decoding_large_small_bs_threshold": 95, "prefill": [20.0, 0.1, 1e-5],
                                             "decoding_smallbs": [25.0, 0.001, 0.05],
                                             "decoding_largebs": [15.0, 0.002, 0.2]}}}


def test_prefill_is_a_plus_b_tokens_plus_c_squared_lengths() -> None:
    # two whole prompts of 100 and 300 tokens: T = 400, S = 100² + 300², pairs = Σ L(L+1)/2
    pairs = 100 * 101 // 2 + 300 * 301 // 2
    assert FIT.step_s(400, 0, 400, pairs) == pytest.approx(0.02 + 1e-4 * 400 + 1e-8 * (100**2 + 300**2))


def test_decode_switches_coefficients_at_the_batch_size_breakpoint() -> None:
    assert FIT.step_s(0, 7, 7000, 7000) == pytest.approx(0.03 + 1e-6 * 7000 + 1e-4 * 7)
    assert FIT.step_s(0, 8, 8000, None) == pytest.approx(0.01 + 2e-6 * 8000 + 3e-4 * 8)


def test_a_mixed_step_adds_the_decodes_marginal_cost_to_the_prefill() -> None:
    pairs = 50 * 51 // 2 + 3 * 1000
    got = FIT.step_s(50, 3, 50 + 3000, pairs)
    assert got == pytest.approx(0.02 + 1e-4 * 50 + 1e-8 * 2500 + 1e-6 * 3000 + 1e-4 * 3)


def test_read_from_a_distserve_profiler_file_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "profiler.json"
    path.write_text(json.dumps(DISTSERVE_FILE))
    fit = read_distserve(path, "facebook/opt-13b", 1)
    assert fit.prefill == pytest.approx((0.02, 1e-4, 1e-8))
    assert fit.decode_large == pytest.approx((0.015, 2e-6, 2e-4)) and fit.large_batch_from == 95
    prof = CostProfile.load(f"distserve:{path}@facebook/opt-13b/tp1")
    assert prof.phases == fit and prof.uses_pairs
    assert prof.step_s(0, 1, 1000) == pytest.approx(0.025 + 1e-6 * 1000 + 5e-5)
    # a JSON profile with phases loads back the same, and scales like any profile
    saved = tmp_path / "fit.json"
    saved.write_text(prof.to_json())
    again = CostProfile.load(saved)
    assert again.phases == fit
    assert again.scaled(2.0).step_s(0, 1, 1000) == pytest.approx(2 * prof.step_s(0, 1, 1000))
    with pytest.raises(ConfigError, match="no fit at that TP degree"):
        read_distserve(path, "facebook/opt-13b", 2)
    with pytest.raises(ConfigError, match="no such model"):
        read_distserve(path, "facebook/opt-66b", 1)
    with pytest.raises(ConfigError, match="distserve:PATH@MODEL/tpN"):
        CostProfile.load(f"distserve:{path}")


def test_the_executor_hands_a_fit_the_attention_pairs() -> None:
    prof = CostProfile("fit", 0.0, 0.0, 0.0, 0.0, phases=FIT)
    ex = ModeledExecutor(prof, block_size=16, num_blocks=64)
    chunk = SeqChunk(0, list(range(1, 201)), 0, list(range(13)), True)
    result = ex.execute(StepBatch([chunk]))
    assert result.modeled_s == pytest.approx(0.02 + 1e-4 * 200 + 1e-8 * 200**2)
