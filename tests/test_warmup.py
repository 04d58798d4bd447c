"""MSER-5 warm-up detection, and `--warmup auto` end to end in the runner."""

import asyncio
import json

import numpy as np
import pytest

from slobench.analysis.warmup import latency_series, mser5_cut
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase


@pytest.mark.parametrize("seed", range(5))
def test_cut_lands_at_the_end_of_a_transient(seed):
    rng = np.random.default_rng(seed)
    # an empty server at first: latency climbs over 200 requests to a noisy steady state
    ramp = np.linspace(0.01, 0.2, 200) + rng.normal(0, 0.005, 200)
    steady = 0.2 + rng.normal(0, 0.02, 1800)
    cut = mser5_cut(np.concatenate([ramp, steady]))
    assert 120 <= cut <= 260, cut


@pytest.mark.parametrize("seed", range(5))
def test_stationary_series_is_barely_cut(seed):
    x = np.random.default_rng(seed).exponential(0.1, 2000)
    assert mser5_cut(x) <= 200  # never more than a tenth of a series with no transient


def test_short_series_and_failures():
    assert mser5_cut(np.ones(10)) == 0
    s = latency_series(np.array([0.1, np.nan, 0.3]))
    np.testing.assert_allclose(s, [0.1, 0.3, 0.3])  # a failure reads as the worst latency seen
    assert mser5_cut(np.concatenate([np.full(100, 5.0), np.full(400, 1.0)])) == 100


class RampTarget(TargetBase):
    """Latency rises over the first 100 requests, then holds: a server filling up."""

    def __init__(self, clock):
        self.clock = clock
        self.n = 0

    async def send(self, spec, rec):
        # The latency is stamped, not slept, so the test does not depend on timer precision.
        rec.sent_s = self.clock.now_s()
        self.n += 1
        await asyncio.sleep(0)
        # steady state with a server's own spread (seeded), so a client hiccup is not the only variance left
        noise = float(np.random.default_rng(spec.request_id).exponential(0.005))
        t = rec.sent_s + (0.0005 if spec.request_id < 100 else 0.02 + noise)
        rec.first_token_s = rec.done_s = t
        rec.chunk_times_s, rec.chunk_tokens, rec.output_tokens = [t], [1], 1


async def test_runner_auto_warmup_marks_rewrites_and_summarises(tmp_path):
    clock = Clock()
    specs = [RequestSpec(i, i * 0.002, (1,), 1, 1) for i in range(500)]
    res = await run(specs, RampTarget(clock), opts=RunOptions(warmup_auto=True, progress=False),
                    run_dir=tmp_path / "r")
    cut = res.summary.warmup["num_requests"]
    assert 60 <= cut <= 140, cut
    assert res.summary.num_warmup == cut and res.summary.num_requests == 500 - cut
    lines = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 500 and sum(d["is_warmup"] for d in lines) == cut
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["warmup"]["num_requests"] == cut
