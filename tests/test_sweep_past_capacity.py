"""A rate past capacity is marked (▲) when its completions fall clearly short of its arrivals, even when the
run ended before the queue grew into SLO misses, and the sweep's headline says so instead of "no rate tried
missed".

The old demo printed `32 │ 32.10 sent │ 27.70 done │ 97.5%` and "attainment stays >= 90% up to 32 req/s (a
lower bound: no rate tried missed)": a short run at a rate the server could not sustain read as met.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from slobench.analysis.headline import headline
from slobench.analysis.metrics import RecordArrays
from slobench.analysis.past_capacity import completion_counts, falls_short
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, summarize
from slobench.report.terminal import headline_text
from slobench.run.records import RequestRecord

SLO90 = SLO.parse("ttft=10s,target=0.9")  # loose: a short run past capacity still meets it


def server(rate_rps: float, capacity_rps: float, seconds: float, seed: int = 0) -> list[RequestRecord]:
    """Poisson arrivals at `rate_rps` served first come first served, one at a time, each taking
    1/capacity_rps: a queue that grows without bound when the rate is past capacity."""
    rng = np.random.default_rng(seed)
    t, free, out = 0.0, 0.0, []
    while t < seconds:
        start = max(t, free)
        free = start + 1 / capacity_rps
        out.append(RequestRecord(request_id=len(out), scheduled_s=t, sent_s=t, first_token_s=start + 0.5 / capacity_rps,
                                 done_s=free, input_tokens=10, output_tokens=2, max_tokens=2))
        t += rng.exponential(1 / rate_rps)
    return out


def test_completions_short_of_arrivals_mark_a_short_run_past_capacity() -> None:
    # 40 req/s offered to a server that completes 20: 6 s of arrivals, too short for a 10 s SLO to miss
    past = summarize(server(40, 20, 6.0), SLO90)
    assert past.attainment is not None and past.attainment.value >= 0.9
    assert past.queue_drift is not None and past.queue_drift["completions_short"] and past.overloaded
    # the same server offered a rate it carries: completions keep pace, nothing marked
    for seed in range(5):
        ok = summarize(server(16, 20, 6.0, seed), SLO90)
        assert ok.queue_drift is not None and not ok.queue_drift["completions_short"]


def test_the_margin_is_statistical_not_a_fixed_share() -> None:
    # 10% short is noise over 50 arrivals and clear over 2,000
    assert not falls_short(50, 45, 5)
    assert falls_short(2000, 1800, 5)
    # what is in flight when the window opens widens the margin: a server holding many may catch up
    assert falls_short(400, 340, 0) and not falls_short(400, 340, 300)
    assert not falls_short(10, 0, 0)  # too few arrivals for a verdict
    a = RecordArrays.from_records(server(32, 27, 0.5))
    assert completion_counts(a) is None


def point(rate: float, value: float, overloaded: bool) -> RunSummary:
    s = RunSummary.from_dict({"num_requests": 200, "num_ok": 200, "queue_drift": {"overloaded": overloaded},
                              "attainment": {"value": value, "ci_low": value - 0.03, "ci_high": min(1.0, value + 0.03)}})
    return replace(s, rate_rps=rate)


def test_the_headline_says_past_capacity_instead_of_no_rate_missed() -> None:
    before = headline([point(4, 1.0, False), point(8, 0.99, False), point(16, 0.98, False)], SLO90)
    assert before is not None and before["is_lower_bound"] and "no rate tried missed" in headline_text(before)
    h = headline([point(4, 1.0, False), point(8, 0.99, False), point(16, 0.97, True), point(32, 0.95, True)], SLO90)
    assert h is not None
    assert not h["is_lower_bound"] and h["max_rate_meeting_rps"] == 8
    assert h["past_capacity_rps"] == [16, 32] and h["past_capacity_meeting_rps"] == [16, 32]
    assert h["interval_rps"][1] == 16 and h["bracket_rps"] == [8, 16]
    text = headline_text(h)
    assert "no rate tried missed" not in text
    assert "16 and 32 req/s ▲ are past capacity and met the target only because" in text and "between 8 and 16 req/s" in text


def test_a_rate_past_capacity_that_missed_changes_nothing() -> None:
    pts = [point(4, 1.0, False), point(8, 0.95, False), point(16, 0.4, True)]
    h = headline(pts, SLO90)
    plain = headline([replace(p, queue_drift=None) for p in pts], SLO90)
    assert h is not None and plain is not None
    assert h["max_rate_meeting_rps"] == plain["max_rate_meeting_rps"] and h["past_capacity_meeting_rps"] == []
    assert headline_text(h) == headline_text(plain)
