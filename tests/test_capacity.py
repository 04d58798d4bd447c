"""Capacity search against synthetic, seeded attainment curves (no server, milliseconds)."""

import asyncio
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.cli import main
from slobench.errors import SpecError
from slobench.experiments.capacity import (
    RunMeasure,
    SearchOptions,
    search_capacity,
    tightest_slo_scale,
)
from slobench.experiments.probe import probe_dir_name
from slobench.report import build_report
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.rundir import load_run
from slobench.run.runner import RunOptions
from slobench.targets.base import TargetBase

LN9 = math.log(9.0)


def logistic_curve(r0=20.0, width_rps=1.5, seed_sd=0.02, white_sd=0.01, calls=None):
    """Attainment = logistic with 0.9 exactly at r0 for the median seed; each seed shifts the curve by a
    relative N(0, seed_sd) (one seed's arrivals are burstier than another's), plus white noise per probe."""

    async def measure(rate, seed):
        if calls is not None:
            calls.append((rate, seed))
        shift = np.random.default_rng([seed, 7]).normal(0, seed_sd)
        white = np.random.default_rng([seed, int(rate * 1e6)]).normal(0, white_sd)
        x = (r0 * (1 + shift) - rate) / width_rps + LN9
        a = float(np.clip(1 / (1 + math.exp(min(-x, 700))) + white, 0, 1))
        return RunSummary.from_dict({"attainment": {"value": a, "ci_low": a - 0.02, "ci_high": a + 0.02},
                                     "run_dir": f"r{rate:g}-s{seed}"})

    return measure


async def test_brackets_bisects_and_converges():
    calls = []
    res = await search_capacity(logistic_curve(calls=calls), SearchOptions(start_rps=1.0))
    lo, hi = res.bracket_rps
    assert (hi - lo) / lo <= 0.05
    assert res.capacity_rps == pytest.approx(20.0, rel=0.05)
    lo_i, hi_i = res.interval_rps
    assert lo_i < res.capacity_rps < hi_i
    assert not res.is_lower_bound
    # 5 replicates, each run at both edges first, with fresh seeds 1..5; the search's seed 0 counts too
    reps = [p for p in res.probes if p.phase == "replicate"]
    assert len(reps) == 10 and [r["seed"] for r in res.replicates] == [0, 1, 2, 3, 4, 5]
    assert sorted({p.seed for p in reps}) == [1, 2, 3, 4, 5]
    assert res.replicate_edges_rps == (lo, hi)
    assert {p.rate_rps for p in reps} == {lo, hi}
    for r in res.replicates:  # each seed's crossing lies inside its own bracket, narrowed to the tolerance
        met, missed = r["bracket_rps"]
        assert met <= r["capacity_rps"] <= missed and (missed - met) / met <= 0.05
    assert len(calls) == len(res.probes)


async def test_probes_are_monotone_sensible():
    res = await search_capacity(logistic_curve(), SearchOptions(start_rps=1.0, factor=2.0))
    up = [p for p in res.probes if p.phase == "up"]
    assert [p.rate_rps for p in up] == [1, 2, 4, 8, 16, 32]
    assert all(p.meets(0.9) for p in up[:-1]) and not up[-1].meets(0.9)
    lo, hi = 16.0, 32.0
    for p in (p for p in res.probes if p.phase == "bisect"):
        assert lo < p.rate_rps < hi  # every bisection probe lies inside the current bracket
        assert p.rate_rps == pytest.approx((lo + hi) / 2)
        lo, hi = (p.rate_rps, hi) if p.meets(0.9) else (lo, p.rate_rps)
    assert (lo, hi) == res.bracket_rps


async def test_replicate_interval_covers_true_crossing_in_most_runs():
    covered = 0
    trials = 60
    for master in range(trials):
        res = await search_capacity(logistic_curve(), SearchOptions(start_rps=3.0, seed=1000 * master))
        lo, hi = res.interval_rps
        covered += lo <= 20.0 <= hi
    # a 95% t-interval from 5 replicates; allow for the interpolation's small bias
    assert covered >= 0.85 * trials, covered


async def test_start_above_capacity_probes_down():
    res = await search_capacity(logistic_curve(), SearchOptions(start_rps=100.0, replicates=2))
    down = [p.rate_rps for p in res.probes if p.phase == "down"]
    assert down == [50.0, 25.0, 12.5]
    assert res.capacity_rps == pytest.approx(20.0, rel=0.06)


async def test_never_breaks_is_a_lower_bound():
    res = await search_capacity(logistic_curve(r0=1e6), SearchOptions(start_rps=1.0, max_rate_rps=10.0))
    assert res.is_lower_bound and res.capacity_rps == 10.0 and res.interval_rps is None
    assert max(p.rate_rps for p in res.probes) == 10.0
    assert any("at least" in n for n in res.notes)


async def test_never_meets_gives_none():
    res = await search_capacity(logistic_curve(r0=0.01, width_rps=0.001), SearchOptions(start_rps=1.0))
    assert res.capacity_rps is None and res.bracket_rps is None
    assert min(p.rate_rps for p in res.probes) >= SearchOptions(start_rps=1.0).floor_rps
    assert "below 90%" in res.notes[0]


async def test_max_probes_stops_the_search_and_says_so():
    res = await search_capacity(logistic_curve(), SearchOptions(start_rps=1.0, max_probes=7, replicates=2))
    assert sum(p.phase in ("up", "down", "bisect") for p in res.probes) == 7
    assert any("still wider" in n for n in res.notes)


async def test_no_replicates_no_interval():
    res = await search_capacity(logistic_curve(), SearchOptions(replicates=0))
    assert res.interval_rps is None and res.capacity_rps == pytest.approx(20.0, rel=0.05)


@pytest.mark.parametrize(
    "kw",
    [dict(target=0), dict(start_rps=0), dict(factor=1.0), dict(rel_tol=0), dict(replicates=1),
     dict(max_probes=1), dict(max_rate_rps=0.5), dict(level=1.0), dict(seed_probes=1)],
)
def test_search_options_validated(kw):
    with pytest.raises(SpecError):
        SearchOptions(**kw)


def _rec(i, ttft, tpot, n=11, status="ok"):
    r = RequestRecord(request_id=i, scheduled_s=float(i), sent_s=float(i), output_tokens=n)
    if status == "ok":
        r.first_token_s = i + ttft
        r.done_s = i + ttft + tpot * (n - 1)
    else:
        r.fail(status, "boom", float(i))
    return r


def test_tightest_slo_scale_is_exact():
    slo = SLO(ttft_s=1.0, tpot_s=0.1, target=0.9)
    # needs: max(ttft/1, tpot/0.1) -> 0.5, 1, ..., 5.0 (10 requests); 90% -> the 9th smallest = 4.5
    recs = [_rec(i, ttft=0.5 * (i + 1), tpot=0.01) for i in range(10)]
    k = tightest_slo_scale(recs, slo)
    assert k == pytest.approx(4.5)
    scaled = SLO(ttft_s=k, tpot_s=0.1 * k, target=0.9)
    from slobench.analysis.metrics import RecordArrays

    a = RecordArrays.from_records(recs)
    assert scaled.meets(a).mean() >= 0.9
    tighter = SLO(ttft_s=k * 0.99, tpot_s=0.1 * k * 0.99, target=0.9)
    assert tighter.meets(a).mean() < 0.9


def test_slo_scale_failures_are_infinite_need():
    slo = SLO(ttft_s=1.0, target=0.9)
    recs = [_rec(i, 0.1, 0.01) for i in range(5)] + [_rec(i, 0, 0, status="error") for i in range(5, 10)]
    assert tightest_slo_scale(recs, slo) == math.inf
    assert tightest_slo_scale(recs[:5], slo) == pytest.approx(0.1)


def test_flat_metrics_names():
    s = RunSummary.from_dict({"attainment": {"value": 0.9, "good_throughput_rps": 3.0},
                              "ttft_s": {"p99": 0.2, "mean": None}, "tpot_s": {"p50": 0.01},
                              "request_throughput_rps": 4.0})
    assert s.flat_metrics() == {"attainment": 0.9, "good_throughput": 3.0, "throughput": 4.0,
                               "ttft.p99": 0.2, "tpot.p50": 0.01}


class InstantTarget(TargetBase):
    def __init__(self, clock):
        self.clock = clock

    async def send(self, spec, rec):
        rec.sent_s = self.clock.now_s()
        await asyncio.sleep(0)
        t = self.clock.now_s()
        rec.first_token_s = t
        rec.chunk_times_s = [t, t]
        rec.chunk_tokens = [1, 1]
        rec.output_tokens = 2
        rec.done_s = t


async def test_run_measure_writes_one_run_dir_per_probe(tmp_path):
    clock = Clock()
    seen = []

    def make_specs(rate, seed):
        return [RequestSpec(i, i / rate, (1, 2, 3), 3, 2) for i in range(5)]

    m = RunMeasure(make_specs, InstantTarget(clock), out_dir=tmp_path, slo=SLO(ttft_s=1.0),
                   opts=RunOptions(progress=False), manifest={"workload_name": "t"}, clock=clock,
                   on_probe=lambda r, s, summ: seen.append((r, s)))
    s1 = await m(500.0, 3)
    s2 = await m(1000.0, 4)
    assert s1.run_dir == probe_dir_name(0, 500.0, 3) == "probe-00-rate-500-seed-3"
    assert s2.run_dir == "probe-01-rate-1000-seed-4"
    run = load_run(tmp_path / s1.run_dir)
    assert run.manifest["rate_rps"] == 500.0 and run.manifest["seed"] == 3
    assert len(run.records) == 5 and s1.attainment.value == 1.0
    assert seen == [(500.0, 3), (1000.0, 4)]


async def test_short_probes_near_capacity_get_a_note() -> None:
    # The same curve; only how long each probe's traffic lasted differs: a fixed 400 requests (shorter as
    # the rate rises) against a fixed minute.
    curve = logistic_curve()

    def lasting(duration_of):
        async def measure(rate, seed):
            return replace(await curve(rate, seed), duration_s=duration_of(rate))

        return measure

    short = await search_capacity(lasting(lambda r: 400 / r), SearchOptions(start_rps=5.0, replicates=3))
    assert any("lasted only 17 s" in n and "--duration" in n for n in short.notes), short.notes
    assert all(p.duration_s is not None for p in short.probes)
    long = await search_capacity(lasting(lambda r: 60.0), SearchOptions(start_rps=5.0, replicates=3))
    assert not any("lasted only" in n for n in long.notes)
    unknown = await search_capacity(curve, SearchOptions(start_rps=5.0, replicates=3))
    assert not any("lasted only" in n for n in unknown.notes)


async def test_a_search_whose_seeds_disagree_reports_inconclusive():
    """Seeds shifted by +-60%: the replicate crossings scatter past every rate probed."""
    res = await search_capacity(logistic_curve(seed_sd=0.6, width_rps=0.5), SearchOptions(start_rps=4.0, replicates=3))
    assert res.inconclusive is not None and res.capacity_rps is None and res.interval_rps is None
    assert res.to_dict()["inconclusive"] == res.inconclusive


SIM_CAPACITY = ["capacity", "--simulate", "--max-num-seqs", "8", "--workload", "tiny", "--slo", "ttft=500ms,tpot=50ms",
                "--duration", "10", "--replicates", "2"]


def test_capacity_cli_exits_4_when_inconclusive_and_0_when_found(tmp_path, capsys):
    """Two probes a seed reach only the bracket's edges: seeds 1 and 2 meet both (44 and 46 req/s), so their
    crossings are censored, never imputed, and the search says which and what to change."""
    assert main([*SIM_CAPACITY, "--seed-probes", "2", "--out", str(tmp_path / "a")]) == 4
    out = capsys.readouterr().out
    why = ("2 of 3 seeds not bracketed within 2 probes each: seed 1 met the target at every rate up to 46 req/s; "
           "seed 2 met the target at every rate up to 46 req/s; the other seeds cross at 44.4 req/s: raise "
           "--seed-probes (now 2) or run longer probes (--duration: these lasted 10 s of traffic)")
    assert f"capacity: inconclusive: {why}" in out
    doc = json.loads((tmp_path / "a" / "capacity.json").read_text())
    assert doc["capacity_rps"] is None and doc["interval_rps"] is None and doc["inconclusive"] == why
    assert [r["censored"] for r in doc["replicates"]][1:] == ["met the target at every rate up to 46 req/s"] * 2
    # the report says so plainly, with the reason, and reads no capacity off the probes (no headline, no knee)
    html = build_report([tmp_path / "a"], tmp_path / "a.html").read_text()
    assert '<p class="headline bad">capacity: inconclusive (no capacity located): 2 of 3 seeds not bracketed' in html
    assert "gives no capacity figure" in html and "attainment stays" not in html
    assert not re.search(r"knee [0-9.]+ req", html)  # the cliff figure's knee label (in plotly JSON)
    assert main([*SIM_CAPACITY, "--out", str(tmp_path / "b")]) == 0
    found = json.loads((tmp_path / "b" / "capacity.json").read_text())
    assert found["inconclusive"] is None
    line = (f"capacity: {found['capacity_rps']:.3g} req/s at >= 90% attainment [{found['interval_rps'][0]:.3g}, "
            f"{found['interval_rps'][1]:.3g}] (95%, 3 seeds)")
    assert line in capsys.readouterr().out
    html = build_report([tmp_path / "b"], tmp_path / "b.html").read_text()
    assert f'<p class="headline">capacity: {found["capacity_rps"]:.3g} req/s at &gt;= 90% attainment' in html
    both = build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "ab.html").read_text()
    assert f"<p>Headline capacity: - → {found['capacity_rps']:.3g} req/s" in both  # none for the inconclusive one
