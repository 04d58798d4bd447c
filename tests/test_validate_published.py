"""The simulator against DistServe's measured OPT-13B/A100 runs (slobench.fleet.published,
benchmarks/validate_published.py): a fast subset that fails when the fitted profile's simulated attainment on
two runs of each setup drifts more than 3 points from the figures docs/measurements/validate_published.md
records, the run-file checks, and (slow) the planner ranking the setups per GPU as the measurements do. Skips
the data tests where ../shared/validation is absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import slobench.fleet.published as published
from slobench.analysis.headline import crossing_rate
from slobench.errors import SpecError
from slobench.fleet.published import (
    GPUS_PER_SETUP,
    PLAN_TARGET,
    Run,
    compare,
    measured_curve,
    mirrored_curve,
    pooled_lengths,
    read_run,
    simulated_curve,
    specs_of,
    targets_met,
    tpot_gap_by_length,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "validation" / "distserve-opt13b-a100"
needs_data = pytest.mark.skipif(not (DATA / "runs").is_dir(), reason="../shared/validation is not here")

# run -> (measured attainment %, simulated attainment % with the fitted profile, as recorded)
RECORDED = {
    ("vllm", "vllm-100-1"): (68.0, 60.0),
    ("vllm", "vllm-100-2"): (49.0, 54.0),
    ("distserve-c21d11", "distserve-c21d11-300-3"): (96.3, 96.0),
    ("distserve-c21d11", "distserve-c21d11-300-6"): (90.7, 91.0),
}


@needs_data
@pytest.mark.parametrize(("setup", "name"), sorted(RECORDED))
def test_fitted_attainment_stays_where_it_was_recorded(setup: str, name: str) -> None:
    row = compare(read_run(DATA / "runs" / f"{name}.jsonl"), setup, "fitted", DATA)
    measured, simulated = RECORDED[(setup, name)]
    assert row["measured"]["attainment"] == pytest.approx(measured, abs=0.05)
    assert abs(row["simulated"]["attainment"] - simulated) <= 3.0, row["simulated"]
    if setup == "distserve-c21d11":  # below saturation both meet the 3-point target against the measurement
        assert targets_met(row)["attainment"]


def test_run_files_are_checked_line_by_line(tmp_path: Path) -> None:
    good = '{"start_s": 0.5, "prompt_len": 12, "output_len": 3, "ttft_ms": 20.0, "tpot_ms": 10.0, "x": 1}\n'
    path = tmp_path / "run.jsonl"
    path.write_text(good + good.replace("0.5", "0.0"))
    run = read_run(path)
    assert run.start_s.tolist() == [0.0, 0.5] and run.prompt_len.tolist() == [12, 12]
    specs = specs_of(run)
    assert [len(s.prompt) for s in specs] == [12, 12] and [s.max_tokens for s in specs] == [3, 3]
    assert all(s.min_tokens == 3 for s in specs)
    for bad, why in (("{not json\n", "not a JSON object"), (good.replace('"output_len": 3', '"output_len": 0'),
                                                              "output_len"),
                     (good.replace('"prompt_len": 12, ', ""), "prompt_len"), ("", "holds no requests")):
        path.write_text(bad)
        with pytest.raises(SpecError, match=why):
            read_run(path)


def test_the_benchmark_refuses_a_bad_run_file_with_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for n in ("opt-13b-config.json", "profiler-a100-80g.vllm.json", "profiler-a100-80g.distserve.json"):
        (data / n).write_text("{}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"start_s": -1}\n')
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_published.py"), "--setup", "vllm",
                          "--profile", "fitted", str(bad), "--json", str(tmp_path / "o.json"), "--data", str(data)],
                         capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    assert "bad.jsonl:1" in out.stderr and "start_s" in out.stderr
    assert not (tmp_path / "o.json").exists()


@needs_data
@pytest.mark.slow
def test_the_planner_ranks_the_setups_per_gpu_as_the_measurements_do() -> None:
    per_gpu = {}
    for setup, rates in (("vllm", (0.25, 1.0, 2.0)), ("distserve-c21d11", (3.0, 6.0, 9.0))):
        runs = [read_run(f) for f in sorted((DATA / "runs").glob(f"{setup.split('-')[0]}-*.jsonl"))]
        measured = crossing_rate(*measured_curve(runs), PLAN_TARGET) or 0.0
        curve = simulated_curve(setup, "fitted", DATA, pooled_lengths(runs), rates, num_requests=200, seeds=(0,))
        simulated = crossing_rate(list(rates), curve, PLAN_TARGET) or 0.0
        per_gpu[setup] = (measured / GPUS_PER_SETUP[setup], simulated / GPUS_PER_SETUP[setup])
    assert per_gpu["distserve-c21d11"][0] > per_gpu["vllm"][0]
    assert per_gpu["distserve-c21d11"][1] > per_gpu["vllm"][1]


def _run(output_len: list[int], tpot_ms: list[float]) -> Run:
    n = len(output_len)
    return Run("synthetic", np.arange(n, dtype=float), np.full(n, 100), np.array(output_len),
               np.full(n, 50.0), np.array(tpot_ms))


def test_the_tpot_gap_tells_a_per_step_cost_from_a_per_request_one() -> None:
    lengths = [5, 20, 100, 300, 800]
    sim = np.full(5, 30.0)
    per_step = tpot_gap_by_length(_run(lengths, [35.0] * 5), sim)
    assert [b["tokens_after_first"][0] for b in per_step] == [1, 10, 50, 150, 400]
    assert [b["gap_ms"] for b in per_step] == pytest.approx([5.0] * 5)
    per_request = tpot_gap_by_length(_run(lengths, [30 + 400 / (n - 1) for n in lengths]), sim)
    gaps = [b["gap_ms"] for b in per_request]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] > 10 * gaps[-1]


def test_the_tpot_gap_leaves_out_one_token_answers_and_unfinished_requests() -> None:
    run = _run([1, 20, 20], [0.0, 40.0, 45.0])
    gap = tpot_gap_by_length(run, np.array([0.0, 30.0, np.inf]))
    assert gap == [{"tokens_after_first": [10, 50], "num_requests": 1, "gap_ms": 10.0, "measured_ms": 40.0,
                    "simulated_ms": 30.0}]


def test_the_planner_mirrors_the_measured_runs_lengths_and_pools_them_by_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past saturation a longer run attains less (its queue grows the whole run): the simulated answer is read
    off runs of the measured runs' rates and lengths, pooled by rate weighted by requests, as the measured one
    is. A stand-in simulation attains a run's first 150 requests only."""
    def fake_times(run: Run) -> tuple[np.ndarray, np.ndarray]:
        n = len(run.start_s)
        return np.where(np.arange(n) < 150, 100.0, 300.0), np.full(n, 50.0)
    monkeypatch.setattr(published, "simulate", lambda run, *a, **k: run)
    monkeypatch.setattr(published, "simulated_times_ms", fake_times)

    def measured(n: int, rate: float) -> Run:
        z = np.zeros(n)
        return Run(f"m-{n}-{rate:g}", np.arange(n) / rate, np.full(n, 100), np.full(n, 10), z, z)
    runs = [measured(100, 3.0), measured(300, 6.0), measured(600, 6.0), measured(300, 9.0)]
    rates, curve = mirrored_curve("distserve-c21d11", "fitted", DATA, runs, seeds=(0,))
    assert rates == [3.0, 6.0, 9.0]
    assert curve == pytest.approx([100.0, 100.0 * 300 / 900, 50.0])


def test_a_difference_of_exactly_3_points_is_within_3() -> None:
    """110 against 104 of 200 requests attained: 100 x 0.55 is 55.00000000000001 in floating point."""
    nan = float("nan")
    meas, sim = 100.0 * float(np.mean(np.arange(200) < 104)), 100.0 * float(np.mean(np.arange(200) < 110))
    row = {"profile": "fitted", "measured": {"attainment": meas, "ttft_p90_ms": 5000.0},
           "simulated": {"attainment": sim, "ttft_p90_ms": nan}}
    assert sim - meas > 3.0
    assert targets_met(row) == {"attainment": True}


@needs_data
def test_distserve_calibrated_meets_the_targets_its_admission_and_request_overhead_bring() -> None:
    """With the host costs and request overhead the lower-rate half fits (docs/measurements/
    validate_published.md), the two targets the decode admission and the request overhead brought in hold:
    600-6's TPOT p90 (a wait for decode room before the second token: 35% low when the decode instance admitted
    whenever it had room) and 300-12's TTFT p50 (12% high with the host costs on the prefill instance too)."""
    host = (5.025e-3, 0.0502e-3, 7.25e-3)
    tail = compare(read_run(DATA / "runs" / "distserve-c21d11-600-6.jsonl"), "distserve-c21d11", "fitted", DATA,
                   host=host)
    assert targets_met(tail)["tpot_p90_ms"] and targets_met(tail)["attainment"], tail["simulated"]
    busy = compare(read_run(DATA / "runs" / "distserve-c21d11-300-12.jsonl"), "distserve-c21d11", "fitted", DATA,
                   host=host)
    assert targets_met(busy)["ttft_p50_ms"] and targets_met(busy)["attainment"], busy["simulated"]
    # the same host costs on the prefill instance too put 300-12's TTFT p50 out of the target
    both = published.simulate(read_run(DATA / "runs" / "distserve-c21d11-300-12.jsonl"), "distserve-c21d11",
                              "fitted", DATA, build=lambda h: published.setup_fleet(
                                  "distserve-c21d11", "fitted", DATA, host=h, prefill_host=True), host=host)
    ttft, _ = published.simulated_times_ms(both)
    assert np.median(ttft) > 1.10 * busy["measured"]["ttft_p50_ms"]
