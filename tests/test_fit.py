"""`workload fit`: arrival and length fits, the 10% quantile criterion on the spec it writes, the TOML
writer."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.workload import WorkloadSpec, generate, list_workloads, load_workload
from slobench.workload.fit import dumps_toml, fit_arrivals, fit_lengths, fit_trace
from slobench.workload.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"
QS = (0.5, 0.9, 0.99)


def write_trace(path: Path, t: np.ndarray, ins: np.ndarray, outs: np.ndarray) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{x:.6f},{a},{b}" for x, a, b in zip(t.tolist(), ins.tolist(), outs.tolist(), strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def bimodal_trace(tmp_path: Path, n: int = 4000, seed: int = 0) -> Path:
    """Lengths a lognormal cannot hold (two modes), gamma gaps with CV 2."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.gamma(0.25, 1 / (0.25 * 5.0), n))  # shape 1/cv^2, mean gap 0.2 s
    ins = np.where(rng.random(n) < 0.6, rng.integers(150, 250, n), rng.integers(3000, 6000, n))
    outs = np.maximum(1, np.rint(np.exp(rng.normal(3.0, 1.2, n)))).astype(int)
    return write_trace(tmp_path / "bimodal.csv", t, ins, outs)


def regenerated_quantiles_within(spec: WorkloadSpec, trace, rel: float = 0.10) -> None:
    """The spec's length distributions, sampled 200k times (so the regenerated p99 is itself precise),
    land p50, p90 and p99 within `rel` of the trace's; and `generate` draws from those distributions."""
    rng = np.random.default_rng(11)
    for dist, theirs in ((spec.input, trace.input_tokens), (spec.output, trace.output_tokens)):
        got, want = np.quantile(dist.sample(200_000, rng), QS), np.quantile(theirs, QS)
        for q, g, w in zip(QS, got, want, strict=True):
            assert g == pytest.approx(w, rel=rel), f"p{round(q * 100)}: regenerated {g}, trace {w}"
    reqs = generate(spec, seed=11, num_requests=500, input_len=None)
    assert len(reqs) == 500 and max(r.input_tokens for r in reqs) <= trace.input_tokens.max()


def test_fit_cli_writes_a_spec_whose_lengths_match_the_trace(tmp_path, capsys):
    path = bimodal_trace(tmp_path)
    out = tmp_path / "fitted.toml"
    assert main(["workload", "fit", str(path), "-o", str(out), "--arrivals", "gamma"]) == 0
    printed = capsys.readouterr().out
    assert "KS" in printed and "spec uses: empirical" in printed  # two modes: lognormal misses
    spec = load_workload(str(out))
    assert spec.input.to_dict()["dist"] == "empirical"
    regenerated_quantiles_within(spec, load_trace(path))
    assert spec.arrival.rate_rps == pytest.approx(5.0, rel=0.05)
    assert spec.arrival.cv == pytest.approx(2.0, rel=0.1)
    assert "spec uses: empirical" in out.read_text()  # the choice is written down


def test_a_lognormal_trace_gets_a_lognormal_spec(tmp_path):
    rng = np.random.default_rng(1)
    n = 20_000
    t = np.cumsum(rng.exponential(0.1, n))
    ins = np.maximum(1, np.rint(np.exp(rng.normal(6.6, 0.9, n)))).astype(int)
    outs = np.maximum(1, np.rint(np.exp(rng.normal(5.0, 0.8, n)))).astype(int)
    trace = load_trace(write_trace(tmp_path / "ln.csv", t, ins, outs))
    fit = fit_trace(trace)
    assert fit.input.chosen == "lognormal" and fit.output.chosen == "lognormal"
    assert fit.input.mu == pytest.approx(6.6, abs=0.03) and fit.input.sigma == pytest.approx(0.9, abs=0.03)
    assert fit.input.ks_lognormal < 0.02
    assert fit.arrival.gap_cv_gamma_mle == pytest.approx(1.0, abs=0.05)
    spec = WorkloadSpec.from_dict(tomllib.loads(fit.to_toml()))
    assert spec == fit.spec()
    regenerated_quantiles_within(spec, trace)


def test_forced_choices_are_respected(tmp_path):
    trace = load_trace(bimodal_trace(tmp_path))
    assert fit_trace(trace, choose="lognormal").spec().input.to_dict()["dist"] == "lognormal"
    lengths = fit_lengths(trace.input_tokens, "input", choose="lognormal")
    assert max(abs(e) for e in lengths.lognormal_errors) > 0.10  # the reason auto would not pick it


def test_arrival_fit_reports_dispersion_a_renewal_process_misses():
    rng = np.random.default_rng(3)
    # Ten minutes quiet at 1 req/s, ten busy at 20 req/s: Poisson within, very overdispersed per minute.
    t = np.concatenate([np.cumsum(rng.exponential(1.0, 600)), 600 + np.cumsum(rng.exponential(0.05, 12000))])
    fit = fit_arrivals(t)
    assert fit.dispersion_per_minute > 50
    assert fit.gap_cv_moments > 2
    flat = fit_arrivals(np.cumsum(rng.exponential(0.1, 20000)))
    assert flat.dispersion_per_minute == pytest.approx(1.0, abs=0.3)


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
@pytest.mark.parametrize("which", ["code", "conv"])
def test_fitted_azure_specs_regenerate_the_trace_quantiles(tmp_path, which):
    path = TRACES / f"AzureLLMInferenceTrace_{which}.csv"
    out = tmp_path / f"{which}.toml"
    assert main(["workload", "fit", str(path), "-o", str(out)]) == 0
    spec = load_workload(str(out))
    trace = load_trace(path)
    regenerated_quantiles_within(spec, trace)
    # Matches the numbers in NOTES-statistics.md: code gaps CV ~13 raw, ~2.1 by a gamma fit.
    fit = fit_trace(trace)
    if which == "code":
        assert fit.arrival.gap_cv_moments == pytest.approx(13.2, rel=0.05)
        assert fit.arrival.gap_cv_gamma_mle == pytest.approx(2.1, rel=0.05)
        assert fit.input.mu == pytest.approx(7.00, abs=0.02) and fit.input.sigma == pytest.approx(1.36, abs=0.02)
    else:
        assert fit.arrival.gap_cv_moments == pytest.approx(1.1, rel=0.05)


# ---- the TOML writer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_workloads())
def test_every_bundled_spec_survives_the_toml_writer(name):
    spec = load_workload(name)
    assert WorkloadSpec.from_dict(tomllib.loads(dumps_toml(spec.to_dict()))) == spec


def test_toml_writer_escapes_and_special_values():
    d = {"s": 'quote " back \\ nl \n tab \t', "odd key": 1, "f": math.inf, "b": False,
         "nested": {"deep": {"x": [1, 2]}}, "arr": [{"a": 1}, {"a": 2, "t": {"k": "v"}}], "empty": []}
    text = dumps_toml(d, ["a comment"])
    assert text.startswith("# a comment\n")
    assert tomllib.loads(text) == d
