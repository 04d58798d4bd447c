"""`workload fit` keeps what makes a trace hard: count dispersion at 1 s and 1 min within 20% and
per-class lengths, and prints trace against generated (issue 14, item 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.workload import generate, load_workload
from slobench.workload.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"


def dispersion(t: np.ndarray, bin_s: float, span_s: float) -> float:
    """Variance / mean of the counts in whole `bin_s` bins from 0 to `span_s`."""
    n = int(span_s // bin_s)
    counts = np.bincount((t // bin_s).astype(np.int64), minlength=n)[:n]
    return float(counts.var() / counts.mean())


def bursty_times(seed: int = 0) -> np.ndarray:
    """30 minutes: the rate swings from minute to minute (0.5 to 8 req/s), and within a minute a few
    seconds carry bursts of ~20 requests: overdispersed at both scales."""
    rng = np.random.default_rng(seed)
    out = []
    for minute in range(30):
        rate = rng.choice([0.5, 1.0, 2.0, 8.0])
        base = minute * 60 + np.cumsum(rng.exponential(1 / rate, int(rate * 90)))
        out.append(base[base < (minute + 1) * 60])
        for start in minute * 60 + rng.uniform(0, 59, rng.integers(0, 4)):
            out.append(start + np.sort(rng.uniform(0, 0.8, rng.integers(10, 30))))
    return np.sort(np.concatenate(out))


def write_burstgpt(path: Path, t: np.ndarray, seed: int = 0) -> Path:
    """Two models with different lengths: GPT-4 long prompts and short answers, ChatGPT the reverse."""
    rng = np.random.default_rng(seed + 1)
    is_gpt4 = rng.random(len(t)) < 0.3
    ins = np.where(is_gpt4, rng.integers(2000, 4000, len(t)), rng.integers(50, 300, len(t)))
    outs = np.where(is_gpt4, rng.integers(5, 40, len(t)), rng.integers(200, 600, len(t)))
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [f"{x:.3f},{'GPT-4' if g else 'ChatGPT'},{a},{b},{a + b},API log"
              for x, g, a, b in zip(t.tolist(), is_gpt4.tolist(), ins.tolist(), outs.tolist(), strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def generated_dispersions(spec, span: float, seeds=range(3)) -> tuple[float, float]:
    d1, d60 = [], []
    for seed in seeds:
        t = np.array([r.arrival_s for r in generate(spec, seed=seed)])
        d1.append(dispersion(t, 1.0, span))
        d60.append(dispersion(t, 60.0, span))
    return float(np.mean(d1)), float(np.mean(d60))


def test_fitted_spec_keeps_dispersion_at_1s_and_1min(tmp_path, capsys):
    path = write_burstgpt(tmp_path / "b.csv", bursty_times())
    out = tmp_path / "fitted.toml"
    assert main(["workload", "fit", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "trace vs generated" in printed and "dispersion, 1 s" in printed and "dispersion, 1 min" in printed
    trace = load_trace(path, spread=False)
    t = trace.arrival_s
    span = float(t[-1])
    want1, want60 = dispersion(t, 1.0, span), dispersion(t, 60.0, span)
    assert want1 > 3 and want60 > 20  # the trace is bursty at both scales
    spec = load_workload(str(out))
    got1, got60 = generated_dispersions(spec, span)
    assert got1 == pytest.approx(want1, rel=0.2) and got60 == pytest.approx(want60, rel=0.2)
    n = len(generate(spec, seed=0))
    assert n == pytest.approx(len(t), rel=0.1)


def test_fitted_spec_has_per_class_lengths(tmp_path, capsys):
    path = write_burstgpt(tmp_path / "b.csv", bursty_times(1), seed=1)
    out = tmp_path / "fitted.toml"
    assert main(["workload", "fit", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "class GPT-4:" in printed and "class ChatGPT:" in printed
    spec = load_workload(str(out))
    trace = load_trace(path)
    reqs = generate(spec, seed=5)
    tags = np.array([r.tag.rsplit("/", 1)[-1] for r in reqs])
    ins = np.array([r.input_tokens for r in reqs])
    outs = np.array([r.max_tokens for r in reqs])
    t_tags = np.array([e.tag for e in trace.entries])
    assert (tags == "GPT-4").mean() == pytest.approx((t_tags == "GPT-4").mean(), abs=0.04)
    for name in ("GPT-4", "ChatGPT"):
        for got, want in ((ins[tags == name], trace.input_tokens[t_tags == name]),
                          (outs[tags == name], trace.output_tokens[t_tags == name])):
            assert np.median(got) == pytest.approx(np.median(want), rel=0.15)  # auto: lognormal within 10% at p50
            assert got.min() >= want.min() and got.max() <= want.max()


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
def test_the_azure_code_trace_keeps_its_bursts(tmp_path):
    path = TRACES / "AzureLLMInferenceTrace_code.csv"
    out = tmp_path / "code.toml"
    assert main(["workload", "fit", str(path), "-o", str(out)]) == 0
    t = load_trace(path).arrival_s
    span = float(t[-1])
    got1, got60 = generated_dispersions(load_workload(str(out)), span, seeds=range(2))
    assert got1 == pytest.approx(dispersion(t, 1.0, span), rel=0.2)  # ~13
    assert got60 == pytest.approx(dispersion(t, 60.0, span), rel=0.2)  # ~164
