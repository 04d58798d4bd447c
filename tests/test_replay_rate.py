"""`--rate` on a slice of a trace: the window actually replayed offers the asked rate (issue 14, item 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slobench.workload.replay import replay
from slobench.workload.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")


def uneven(tmp_path: Path) -> Path:
    """100 rows 1 s apart, then 400 rows 0.1 s apart: the mean rate of a slice is not the trace's."""
    t = np.concatenate([np.arange(100) * 1.0, 100 + np.arange(400) * 0.1])
    rows = "".join(f'{{"arrival_s": {x:.3f}, "input_tokens": 5, "max_tokens": 3}}\n' for x in t)
    p = tmp_path / "uneven.jsonl"
    p.write_text(rows)
    return p


def offered(specs) -> float:
    t = np.array([s.arrival_s for s in specs])
    return (len(t) - 1) / float(t[-1] - t[0])


def test_rate_is_met_by_the_first_n_requests(tmp_path):
    trace = load_trace(uneven(tmp_path))
    specs = replay(trace, rate_rps=5.0, num_requests=50)
    assert len(specs) == 50 and offered(specs) == pytest.approx(5.0)


def test_rate_is_met_after_start(tmp_path):
    trace = load_trace(uneven(tmp_path))
    specs = replay(trace, rate_rps=5.0, start_s=90.0, num_requests=200)
    assert len(specs) == 200 and offered(specs) == pytest.approx(5.0)


def test_rate_is_met_over_a_duration(tmp_path):
    trace = load_trace(uneven(tmp_path))
    specs = replay(trace, rate_rps=5.0, duration_s=60.0)
    assert len(specs) == 300  # rate x duration requests, the next one lands exactly at 60 s
    assert len(specs) / 60.0 == pytest.approx(5.0)
    assert specs[-1].arrival_s < 60.0


def test_whole_trace_rate_unchanged(tmp_path):
    trace = load_trace(uneven(tmp_path))
    assert offered(replay(trace, rate_rps=5.0)) == pytest.approx(5.0)


@needs_traces
@pytest.mark.parametrize(
    ("which", "kwargs"),
    [
        ("conv", {"num_requests": 50}),
        ("conv", {"num_requests": 2000}),
        ("code", {"start_s": 1700.0, "num_requests": 2000}),
    ],
)
def test_azure_slices_offer_the_asked_rate(which, kwargs):
    trace = load_trace(TRACES / f"AzureLLMInferenceTrace_{which}.csv")
    specs = replay(trace, rate_rps=5.0, **kwargs)
    assert offered(specs) == pytest.approx(5.0)


@needs_traces
def test_azure_duration_offers_the_asked_rate():
    trace = load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv")
    specs = replay(trace, rate_rps=5.0, duration_s=60.0)
    assert len(specs) == 300
