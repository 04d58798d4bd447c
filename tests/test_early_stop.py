"""The early-stop decider (slobench.run.early_stop): the exact fail rule's arithmetic, which requests are known
to miss (finished, and in flight on each bound), and what a stopped run records; no server, no clock."""

from __future__ import annotations

import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError, UsageError
from slobench.experiments.capacity import Probe, SearchOptions, search_capacity
from slobench.load_options import LoadOptions
from slobench.run.early_stop import (
    MissCounter,
    StoppedEarly,
    allowed_misses,
    bound_text,
    partial_attainment,
    stopped_attainment,
)
from slobench.run.records import RequestRecord
from slobench.run.server_idle import busy_requests, wait_idle
from slobench.targets.transport import TransportError


def test_allowed_misses_is_the_most_with_which_the_float_attainment_still_meets() -> None:
    assert allowed_misses(100, 0.9) == 10  # (1 - 0.9) * 100 is 9.999...: not 9
    assert allowed_misses(617, 0.9) == 61
    assert allowed_misses(10, 0.95) == 0
    assert allowed_misses(20, 0.95) == 1
    assert allowed_misses(50, 1.0) == 0
    assert allowed_misses(0, 0.9) == 0
    for n in (1, 7, 99, 1000, 1234):
        for p in (0.5, 0.9, 0.95, 0.99, 0.999):
            m = allowed_misses(n, p)
            assert (n - m) / n >= p and (m == n or (n - m - 1) / n < p), (n, p, m)


def test_allowed_misses_refuses_bad_input() -> None:
    with pytest.raises(SpecError, match="num_measured"):
        allowed_misses(-1, 0.9)
    with pytest.raises(SpecError, match="target"):
        allowed_misses(10, 0.0)


def done(i: int, ttft_s: float, *, tpot_s: float = 0.01, tokens: int = 5, status: str = "ok") -> RequestRecord:
    first = 1.0 * i + ttft_s
    rec = RequestRecord(request_id=i, scheduled_s=1.0 * i, sent_s=1.0 * i, first_token_s=first,
                        done_s=first + tpot_s * (tokens - 1), max_tokens=tokens, output_tokens=tokens,
                        chunk_times_s=[first + tpot_s * k for k in range(tokens)], chunk_tokens=[1] * tokens)
    if status != "ok":
        rec.fail("error", "boom")
    return rec


def waiting(i: int, *, sent_s: float | None = None, first_s: float | None = None, max_tokens: int = 5) -> RequestRecord:
    return RequestRecord(request_id=i, scheduled_s=1.0 * i, sent_s=sent_s, first_token_s=first_s, max_tokens=max_tokens)


SLO_T = SLO(ttft_s=0.5, tpot_s=0.05, target=0.9)


def test_finished_requests_decide_once_more_miss_than_allowed() -> None:
    c = MissCounter(SLO_T, 20, in_flight_rules=False)  # 2 misses allowed
    c.add_finished([done(0, 0.1), done(1, 0.9), done(2, 0.1, tpot_s=0.2)])
    assert (c.finished_met, c.finished_missed) == (1, 2)
    assert c.check([], 3.0) is None
    c.add_finished([done(3, 0.1, status="error")])
    stop = c.check([], 4.0)
    assert stop is not None and stop.known_misses == 3 and stop.allowed_misses == 2 and stop.num_met == 1
    assert stop.attainment_at_most == 17 / 20 and stop.attainment_at_least == 1 / 20
    assert stop.decided_share == 1 / 4 < SLO_T.target


def test_warm_up_records_count_for_nothing() -> None:
    c = MissCounter(SLO_T, 10, in_flight_rules=True)
    warm = done(0, 5.0)
    warm.is_warmup = True
    c.add_finished([warm, warm, warm])
    assert (c.finished_met, c.finished_missed) == (0, 0)
    w = waiting(1, sent_s=1.0)
    w.is_warmup = True
    assert c.pending_miss(w, 100.0) is None


def test_in_flight_rules_each_bound() -> None:
    c = MissCounter(SLO(ttft_s=0.5, tpot_s=0.05, e2e_s=3.0, target=0.9), 10, in_flight_rules=True)
    assert c.pending_miss(waiting(2, sent_s=2.0), 2.5) is None  # exactly at the bound: may still meet it
    assert c.pending_miss(waiting(2, sent_s=2.0), 2.51) == "no first token after the TTFT bound"
    assert c.pending_miss(waiting(2), 2.51) is not None  # not sent yet (a full in-flight cap): still late
    # TPOT: 4 gaps of at most 0.05 s for 5 tokens; at 0.21 s after the first token it cannot be met
    assert c.pending_miss(waiting(2, sent_s=2.0, first_s=2.1), 2.1 + 0.19) is None
    assert c.pending_miss(waiting(2, sent_s=2.0, first_s=2.1), 2.1 + 0.21) == "tokens too slow for the TPOT bound"
    assert c.pending_miss(waiting(2, sent_s=2.0, first_s=2.1, max_tokens=1), 4.9) is None
    assert c.pending_miss(waiting(2, sent_s=2.0, first_s=2.1, max_tokens=1), 5.01) == "not done after the E2E bound"


def test_the_sent_clock_counts_from_the_send() -> None:
    c = MissCounter(SLO(ttft_s=0.5, target=0.9, clock="sent"), 10, in_flight_rules=True)
    assert c.pending_miss(waiting(2), 9.0) is None  # never sent: its TTFT from the send is not known
    assert c.pending_miss(waiting(2, sent_s=3.0), 3.4) is None
    assert c.pending_miss(waiting(2, sent_s=3.0), 3.6) is not None
    assert c.pending_miss(waiting(2, sent_s=3.0, first_s=3.1), 9.0) is None  # TTFT met; no other bound


def test_in_flight_requests_decide_only_with_live_records() -> None:
    stuck = [waiting(i, sent_s=1.0 * i) for i in range(5)]
    live = MissCounter(SLO_T, 30, in_flight_rules=True)  # 3 allowed
    stop = live.check(stuck, 10.0)
    assert stop is not None and stop.known_misses == 5 and "no first token after the TTFT bound: 5" in stop.reason
    assert MissCounter(SLO_T, 30, in_flight_rules=False).check(stuck, 10.0) is None


def test_stopped_early_round_trips_and_reads_as_a_bound() -> None:
    s = StoppedEarly("finished and missed: 3", 4.25, 3, 2, 20, 1, 0.85, 0.05, {"idle_after_s": 0.1})
    assert StoppedEarly.from_dict(s.to_dict()) == s
    assert bound_text(s.attainment_at_most, s.at_s) == "at most 85.0% (stopped early at 4.2 s)"
    close = StoppedEarly("x", 1.0, 62, 61, 617, 33, 555 / 617, 33 / 617)
    assert "at most 89.9%" in close.text()  # 89.95%: rounded down, never shown as the 90% it missed
    att = stopped_attainment(s, 2.0)
    assert (att.value, att.ci_low, att.ci_high, att.num_requests, att.num_met) == (0.25, 0.05, 0.85, 20, 1)
    with pytest.raises(SpecError, match="known_misses"):
        StoppedEarly("x", 1.0, 2, 2, 20, 1, 0.9, 0.05)


def test_a_capacity_probe_writes_stopped_early_only_when_set() -> None:
    whole = Probe(10.0, 0, "up", 0.95, None)
    assert "stopped_early" not in whole.to_dict()  # capacity.json of a whole probe reads as before
    stopped = Probe(20.0, 0, "up", 0.3, (0.1, 0.88), stopped_early={"at_s": 2.0})
    assert stopped.to_dict()["stopped_early"] == {"at_s": 2.0} and not stopped.meets(0.9)


def test_early_stop_is_on_for_sweep_and_capacity_and_refused_on_run() -> None:
    assert LoadOptions.make("capacity").early_stop and LoadOptions.make("sweep").early_stop
    assert not LoadOptions.make("capacity", no_early_stop=True).early_stop
    assert not LoadOptions.make("run").early_stop
    with pytest.raises(UsageError, match="--no-early-stop"):
        LoadOptions.make("run", no_early_stop=True)


def test_busy_requests_sums_the_gauges_of_every_replica() -> None:
    samples = {'vllm:num_requests_running{model_name="m",replica="0"}': 2.0,
               'vllm:num_requests_waiting{model_name="m",replica="0"}': 3.0,
               'sglang:num_queue_reqs{replica="1"}': 1.0, "vllm:prompt_tokens_total": 99.0}
    assert busy_requests(samples) == 6.0
    assert busy_requests({"process_cpu_seconds_total": 1.0}) is None


def test_partial_attainment_bounds_what_the_undecided_requests_could_make_of_it() -> None:
    att = partial_attainment(20, 5, 3, 2.0)  # 12 requests undecided (cancelled, or never sent)
    assert (att.value, att.ci_low, att.ci_high, att.num_requests, att.good_throughput_rps) == (5 / 8, 5 / 20, 17 / 20, 20,
                                                                                              2.5)


async def test_a_capacity_search_takes_a_stopped_probe_as_the_fail_it_is() -> None:
    """Past 20 req/s every probe stops early, its attainment the share met among the decided requests: the
    search brackets and interpolates on them, keeps their record, and notes no short probe for them."""

    async def measure(rate: float, seed: int) -> RunSummary:
        if rate <= 20:
            return RunSummary.from_dict({"attainment": {"value": 0.95 - rate / 1000, "num_requests": 100},
                                         "duration_s": 40.0, "run_dir": f"r{rate:g}-s{seed}"})
        stop = StoppedEarly("no first token after the TTFT bound: 11", 1.0, 11, 10, 100, 40, 0.89, 0.4)
        att = stopped_attainment(stop, 1.0)
        return RunSummary.from_dict({"attainment": {"value": att.value, "ci_low": att.ci_low,
                                                    "ci_high": att.ci_high, "num_requests": 100},
                                     "duration_s": 1.0, "stopped_early": stop.to_dict(),
                                     "run_dir": f"r{rate:g}-s{seed}"})

    res = await search_capacity(measure, SearchOptions(start_rps=5.0, replicates=2))
    assert res.bracket_rps is not None and res.bracket_rps[0] <= 20 < res.bracket_rps[1]
    assert res.capacity_rps is not None and 20 <= res.capacity_rps < res.bracket_rps[1]
    stopped = [p for p in res.probes if p.stopped_early is not None]
    assert stopped and all(not p.meets(0.9) and p.ci == (0.4, 0.89) for p in stopped)
    assert not any("lasted only" in n for n in res.notes)  # a stopped probe is short for its verdict, not its size


async def test_wait_idle_polls_until_nothing_runs_or_waits() -> None:
    busy = [{"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 1.0},
            {"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0},
            {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}]

    async def fetch() -> dict[str, float]:
        return busy.pop(0)

    got = await wait_idle(fetch, poll_s=0.0)
    assert "idle_after_s" in got and not busy

    async def stuck() -> dict[str, float]:
        return {"sglang:num_running_reqs": 2.0}

    assert (await wait_idle(stuck, timeout_s=0.0, poll_s=0.0))["busy"] == 2.0

    async def no_gauges() -> dict[str, float]:
        return {"process_cpu_seconds_total": 1.0}

    assert "no running or waiting gauge" in (await wait_idle(no_gauges))["unknown"]

    async def refused() -> dict[str, float]:
        raise TransportError("error", "cannot connect to 127.0.0.1:9")

    assert "cannot connect" in (await wait_idle(refused))["unknown"]
