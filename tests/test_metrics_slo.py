import json

import numpy as np
import pytest

from slobench.analysis import slo as slo_module
from slobench.analysis.metrics import RecordArrays, quantiles, throughput
from slobench.analysis.slo import (
    SLO,
    attainment,
    binomial_quantile,
    block_length,
    block_starts,
    bootstrap_mean_ci,
    bootstrap_quantile_ci,
    bootstrap_quantile_cis,
    order_statistic_ci,
    quantile_ci,
    quantile_cis,
    resample_quantile_ends,
    resample_quantiles,
    samples_beyond,
    wilson_ci,
)
from slobench.analysis.summary import summarize
from slobench.cli import main
from slobench.errors import SpecError
from slobench.run.records import RequestRecord


def rec(i, sched, sent, first, done, out, status="ok", chunks=None, warm=False):
    r = RequestRecord(request_id=i, scheduled_s=sched, sent_s=sent, first_token_s=first, done_s=done,
                      output_tokens=out, status=status, is_warmup=warm)
    r.chunk_times_s = chunks or []
    return r


def test_definitions_match_vllm():
    r = rec(0, 1.0, 1.5, 2.0, 3.0, 11, chunks=[2.0, 2.1, 2.3])
    a = RecordArrays.from_records([r])
    assert a.ttft_s[0] == pytest.approx(0.5)
    assert a.ttft_from_scheduled_s[0] == pytest.approx(1.0)
    assert a.tpot_s[0] == pytest.approx(0.1)  # (3-2)/(11-1)
    assert a.e2e_s[0] == pytest.approx(1.5)
    np.testing.assert_allclose(a.itl_s, [0.1, 0.2])
    assert a.lateness_s[0] == pytest.approx(0.5)


def test_tpot_single_token_is_zero_and_failures_are_nan():
    a = RecordArrays.from_records([rec(0, 0, 0, 1, 1, 1), rec(1, 0, 0, None, None, 0, status="error")])
    assert a.tpot_s[0] == 0.0
    assert np.isnan(a.tpot_s[1]) and np.isnan(a.ttft_s[1])


def test_warmup_excluded():
    a = RecordArrays.from_records([rec(0, 0, 0, 1, 2, 5, warm=True), rec(1, 1, 1, 2, 3, 5)])
    assert list(a.request_id) == [1]


def test_slo_parse_and_errors():
    s = SLO.parse("ttft=500ms,tpot=50ms,target=95%")
    assert s.ttft_s == 0.5 and s.tpot_s == 0.05 and s.target == 0.95
    assert SLO.from_dict(s.to_dict()) == s
    with pytest.raises(SpecError, match="slo.ttft"):
        SLO.parse("ttft=fast")
    with pytest.raises(SpecError, match="unknown key"):
        SLO.parse("ttfb=1s")
    with pytest.raises(SpecError, match="slo.target"):
        SLO.parse("ttft=1s,target=1.5")
    with pytest.raises(SpecError, match="at least one"):
        SLO.parse("target=0.9")


def test_attainment_counts_failures_as_misses():
    recs = [rec(i, i, i, i + 0.1, i + 0.2, 3) for i in range(8)]
    recs.append(rec(8, 8, 8, 9.0, 9.5, 3))  # TTFT miss
    recs.append(rec(9, 9, 9, None, None, 0, status="timeout"))
    a = RecordArrays.from_records(recs)
    slo = SLO(ttft_s=0.5, tpot_s=0.1)
    att = attainment(a, slo, duration_s=10.0)
    assert att.value == pytest.approx(0.8)
    assert att.num_met == 8 and att.num_requests == 10
    assert att.good_throughput_rps == pytest.approx(0.8)
    assert att.ci_low <= 0.8 <= att.ci_high


def test_scheduled_clock_catches_client_lag():
    # Sent 1 s late: from-sent TTFT meets, from-scheduled does not.
    a = RecordArrays.from_records([rec(0, 0.0, 1.0, 1.1, 1.2, 2)])
    assert SLO(ttft_s=0.5).meets(a)[0] == False  # noqa: E712
    assert SLO(ttft_s=0.5, clock="sent").meets(a)[0] == True  # noqa: E712


def test_block_bootstrap_wider_than_iid_for_correlated_data():
    rng = np.random.default_rng(1)
    # long runs of misses: strongly autocorrelated
    x = np.repeat(rng.random(40) < 0.5, 50).astype(float)
    lo, hi = bootstrap_mean_ci(x)
    iid_half = 1.96 * np.sqrt(x.mean() * (1 - x.mean()) / len(x))
    assert (hi - lo) / 2 > 2 * iid_half
    assert block_length(2000) == 200


def test_quantile_ci_covers_truth():
    rng = np.random.default_rng(0)
    x = rng.exponential(1.0, 5000)
    lo, hi = bootstrap_quantile_ci(x, 0.9)
    assert lo < np.log(10) < hi
    assert hi - lo < 0.3


@pytest.mark.parametrize(
    ("n", "q", "lo", "hi"),
    [(100, 0.9, 0.84, 0.96), (100, 0.99, 0.97, None), (1000, 0.9, 0.881, 0.919), (1000, 0.99, 0.983, 0.997),
     (10000, 0.9, 0.894, 0.906), (10000, 0.99, 0.988, 0.992)],
)
def test_order_statistic_interval_matches_the_notes_table(n: int, q: float, lo: float, hi: float | None) -> None:
    # NOTES-statistics' table of i.i.d. 95% intervals, as quantile levels: x_(i) = i / n reads them off.
    got_lo, got_hi = order_statistic_ci((np.arange(n) + 1) / n, q)
    assert got_lo == pytest.approx(lo, abs=1.5 / n)
    assert (got_hi is None) if hi is None else got_hi == pytest.approx(hi, abs=1.5 / n)


def test_binomial_quantile_is_scipys() -> None:
    # Every n to 800 and a spread of larger ones, at each summary quantile and both ends of a 95%
    # interval: the same integer as scipy's binom.ppf (which a summary no longer imports).
    from scipy.stats import binom

    ns = np.concatenate([np.arange(1, 801), np.random.default_rng(0).integers(800, 1_000_000, 30)])
    for q in (0.5, 0.9, 0.99, 0.999, 0.05):
        for p in ((1 - 0.95) / 2, 1 - (1 - 0.95) / 2):
            want = binom.ppf(p, ns, q).astype(int)
            got = np.array([binomial_quantile(p, int(n), q) for n in ns])
            assert np.array_equal(got, want), (q, p, ns[got != want][:5])


def test_wilson_interval_is_scipys_to_the_bit() -> None:
    from scipy.stats import norm

    def wilson(k: int, n: int, level: float) -> tuple[float, float]:
        z = float(norm.ppf((1 + level) / 2))
        p, denom = k / n, 1 + z * z / n
        center, half = (p + z * z / (2 * n)) / denom, z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
        return float(max(0.0, center - half)), float(min(1.0, center + half))

    for k, n in ((0, 50), (25, 50), (97, 100), (100, 100), (9001, 10_000)):
        for level in (0.95, 0.9):
            assert wilson_ci(k, n, level=level) == wilson(k, n, level)


def test_several_quantiles_from_one_draw_are_each_quantiles_own() -> None:
    # A summary's p50/p90/p99 intervals share one set of resamples: to the bit what one call each gives.
    rng = np.random.default_rng(3)
    for n in (2, 37, 100, 2500):
        x = rng.lognormal(size=n)
        x[rng.random(n) < 0.1] = np.nan
        qs = (0.5, 0.9, 0.99)
        assert bootstrap_quantile_cis(x, qs, seed=4) == [bootstrap_quantile_cis(x, (q,), seed=4)[0] for q in qs]
        assert quantile_cis(x, qs, seed=4) == [quantile_ci(x, q, seed=4) for q in qs]


def selection_cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(8)
    n = 20_000
    return [
        ("lognormal", rng.lognormal(size=n)),
        ("queue drifting up", np.linspace(0, 5, n) + rng.exponential(size=n) * 0.1),
        ("random walk", np.abs(np.cumsum(rng.normal(size=n)))),
        ("few distinct values", rng.integers(0, 4, size=n) * 1e-3),
        ("two values", np.where(rng.random(n) < 0.5, 1.0, 2.0)),
        ("constant", np.full(n, 0.25)),
        ("rare huge tail", np.where(rng.random(n) < 0.02, rng.pareto(1.5, n) * 10, rng.normal(size=n))),
    ]


@pytest.mark.parametrize("split_above", [200, 3])
def test_interval_ends_from_selected_resamples_are_every_resamples_to_the_bit(monkeypatch, split_above) -> None:
    # resample_quantile_ends finds only the resamples near the order statistics np.quantile reads; the
    # ends must be those of every resample's quantile, for data with ties, trends and heavy tails, at
    # the extreme quantiles (0, 1) and other levels; split_above=3 splits the cells read again and again
    monkeypatch.setattr(slo_module, "SELECT_MIN_VALUES", 0)
    monkeypatch.setattr(slo_module, "SPLIT_ABOVE", split_above)
    for i, (name, x) in enumerate(selection_cases()):
        m = 2_000
        starts = block_starts(len(x), 1000, np.random.default_rng(i), m)
        for qs, levels in (((0.5, 0.9, 0.99), (0.025, 0.975)), ((0.0, 0.999, 1.0), (0.05, 0.95)), ((0.1,), (0.005, 0.995))):
            every = np.quantile(resample_quantiles(x, starts, m, qs), levels, axis=1)
            assert np.array_equal(resample_quantile_ends(x, starts, m, qs, levels), every), (name, qs)


def test_a_large_runs_quantile_intervals_are_the_partitioned_ones_to_the_bit(monkeypatch) -> None:
    # 200,000 values: 1,000 m-out-of-n resamples of 20,000, found by selection and by partitioning each
    x = np.random.default_rng(9).lognormal(size=200_000)
    qs = (0.5, 0.9, 0.99)
    selected = bootstrap_quantile_cis(x, qs, seed=2)
    monkeypatch.setattr(slo_module, "SELECT_MIN_VALUES", 10**12)
    assert selected == bootstrap_quantile_cis(x, qs, seed=2)


def test_attainment_bootstrap_counts_are_the_float_sums() -> None:
    # 0/1 values are summed a block at a time as bytes: the same interval as the float prefix sums give
    rng = np.random.default_rng(5)
    for n in (300, 4_000, 60_000):
        met = (rng.random(n) < 0.9).astype(float)
        b, starts = block_length(n), block_starts(n, 1000, np.random.default_rng(7))
        cs = np.concatenate([[0.0], np.cumsum(met)])
        last = n - (starts.shape[1] - 1) * b
        sums = (cs[starts[:, :-1] + b] - cs[starts[:, :-1]]).sum(axis=1) + cs[starts[:, -1] + last] - cs[starts[:, -1]]
        lo, hi = np.quantile(sums / n, [0.025, 0.975])
        assert bootstrap_mean_ci(met, seed=7) == (float(lo), float(hi))


def test_samples_beyond() -> None:
    assert (samples_beyond(100, 0.99), samples_beyond(1000, 0.9), samples_beyond(10000, 0.99)) == (1, 100, 100)
    assert samples_beyond(0, 0.5) == 0


def test_tail_quantile_interval_covers_where_the_bootstrap_alone_does_not() -> None:
    # p99 of 400 i.i.d. exponentials (4 values beyond it), 200 seeds: the block bootstrap alone covers the
    # true p99 far less often than its nominal 95% (resamples keep reusing the same few tail values);
    # its envelope with the order-statistic interval covers at least the nominal rate.
    true = np.log(100)
    boot = env = 0
    for s in range(200):
        x = np.random.default_rng(1000 + s).exponential(1.0, 400)
        lo, hi = bootstrap_quantile_ci(x, 0.99, seed=s)
        boot += lo <= true <= hi
        elo, ehi = quantile_ci(x, 0.99, seed=s)
        assert elo is not None and elo <= lo and (ehi is None or ehi >= hi)
        env += elo <= true and (ehi is None or true <= ehi)
    assert boot / 200 < 0.9
    assert env / 200 >= 0.94


def test_attainment_interval_is_not_degenerate_when_every_request_met() -> None:
    recs = [rec(i, i * 0.1, i * 0.1, i * 0.1 + 0.05, i * 0.1 + 0.2, 10) for i in range(100)]
    att = attainment(RecordArrays.from_records(recs), SLO(ttft_s=1.0), duration_s=10.0)
    assert att.value == 1.0 and att.ci_high == 1.0
    # The bootstrap alone says [100%, 100%]; Wilson's interval for 100/100 starts at 96.3%.
    assert att.ci_low == pytest.approx(wilson_ci(100, 100)[0]) and 0.95 < att.ci_low < 0.97
    assert wilson_ci(0, 50)[0] == pytest.approx(0.0, abs=1e-12) and wilson_ci(25, 50) == pytest.approx((0.366, 0.634), abs=1e-3)


def test_throughput_and_summary_json_roundtrip():
    recs = [rec(i, i * 0.1, i * 0.1, i * 0.1 + 0.05, i * 0.1 + 0.2, 10, chunks=[i * 0.1 + 0.05, i * 0.1 + 0.07]) for i in range(50)]
    a = RecordArrays.from_records(recs)
    tp = throughput(a)
    assert tp.offered_rps == pytest.approx(10.0)
    assert tp.request_rps == pytest.approx(50 / (4.9 + 0.2))
    s = summarize(recs, SLO(ttft_s=0.1))
    json.dumps(s.to_dict())  # serialisable
    assert s.attainment.value == 1.0
    assert s.client.is_bottleneck is False
    assert quantiles(np.array([np.nan]))["p50"] is None


def test_client_bottleneck_flagged():
    recs = [rec(i, i * 0.01, i * 0.01 + 0.05, i * 0.01 + 0.1, i * 0.01 + 0.2, 2) for i in range(100)]
    s = summarize(recs, SLO(ttft_s=0.1))
    assert s.client.is_bottleneck is True
    assert "BOTTLENECK" in s.client.warning


def test_prefix_cache_summary_and_line() -> None:
    from slobench.analysis.summary import prefix_cache, summarize
    from slobench.report.terminal import prefix_cache_text

    recs = []
    for i in range(40):
        hit = i % 4 == 0
        ttft = 0.02 if hit else 0.08
        r = rec(i, i * 0.1, i * 0.1, i * 0.1 + ttft, i * 0.1 + 0.2, 10)
        r.prompt_tokens, r.cached_tokens = 200, (160 if hit else 0)
        recs.append(r)
    recs[1].cached_tokens = None  # a request the server said nothing about is left out
    c = prefix_cache(RecordArrays.from_records(recs))
    assert c is not None and (c["num_reported"], c["num_hits"]) == (39, 10)
    assert c["cached_token_share"] == pytest.approx(1600 / (39 * 200))
    assert c["ttft_p50_hit_s"] == pytest.approx(0.02) and c["ttft_p50_miss_s"] == pytest.approx(0.08)
    assert summarize(recs, None).prefix_cache == c
    assert prefix_cache_text(c) == ("prefix cache: 21% of prompt tokens served from cache; 10 of 39 requests hit; "
                                    "TTFT p50 20.0 ms with a hit, 80.0 ms without")
    for r in recs:
        r.cached_tokens = None
    assert summarize(recs, None).prefix_cache is None and "prefix_cache" not in summarize(recs, None).to_dict()


def test_per_class_breakdown_when_a_run_mixes_classes() -> None:
    from slobench.analysis.summary import summarize
    from slobench.report.terminal import per_tag_text

    recs = []
    for i in range(30):
        slow = i % 3 == 0
        r = rec(i, i * 0.1, i * 0.1, i * 0.1 + (0.9 if slow else 0.05), i * 0.1 + 1.0, 10)
        r.tag = "doc" if slow else "chat"
        recs.append(r)
    s = summarize(recs, SLO(ttft_s=0.5))
    rows = {r.key: r for r in s.per_tag}
    assert (rows["chat"].num_requests, rows["doc"].num_requests) == (20, 10)
    assert (rows["chat"].attainment, rows["doc"].attainment) == (1.0, 0.0)
    assert rows["doc"].ttft_p50_s == pytest.approx(0.9)
    assert per_tag_text(s.per_tag).startswith("per class (TTFT p50/p99, attainment): chat 20 req")
    for r in recs:
        r.tag = "only"
    assert "per_tag" not in summarize(recs, SLO(ttft_s=0.5)).to_dict()  # one class: nothing to break down


def test_latencies_describe_completed_requests_only():
    """An HTTP 500 answered in 7 ms is no 7 ms E2E: every latency, E2E included, is over the ok requests,
    the failures counted apart; a run with no ok request has no latency at all."""
    failed = [rec(i, float(i), float(i), None, i + 0.007, 0, status="error") for i in range(3)]
    midstream = rec(3, 3.0, 3.0, 3.1, 3.2, 2, status="error", chunks=[3.1])
    s = summarize([*failed, midstream], SLO(ttft_s=1.0))
    assert s.num_ok == 0
    for d in (s.e2e, s.e2e_from_scheduled, s.ttft, s.ttft_from_scheduled, s.tpot):
        assert d.mean is None and d.count == 0
    ok = rec(4, 4.0, 4.0, 4.1, 4.5, 5, chunks=[4.1, 4.5])
    s = summarize([*failed, midstream, ok], SLO(ttft_s=1.0))
    assert s.e2e.mean == pytest.approx(0.5) and s.e2e.count == 1
    assert s.ttft.mean == pytest.approx(0.1) and s.ttft.count == 1
    assert s.num_requests == 5 and s.status_counts == {"error": 4, "ok": 1}


def test_a_whole_answer_has_no_tpot_and_never_meets_a_tpot_target():
    """Without streaming the tokens arrive together: TPOT and ITL are not measured (None), not 0 (which
    met any TPOT target); a single-token answer keeps TPOT 0 by definition."""
    whole = [rec(i, float(i), float(i), i + 0.2, i + 0.2, 40) for i in range(5)]
    s = summarize(whole, SLO(ttft_s=1.0, tpot_s=0.001))
    assert s.tpot.mean is None and s.tpot.p99 is None and s.itl.mean is None
    assert s.ttft.mean == pytest.approx(0.2) and s.e2e.mean == pytest.approx(0.2)
    assert s.attainment.value == 0.0
    assert summarize(whole, SLO(ttft_s=1.0)).attainment.value == 1.0
    assert RecordArrays.from_records([rec(0, 0, 0, 1, 1, 1)]).tpot_s[0] == 0.0
    assert s.to_dict()["tpot_s"]["mean"] is None


def test_no_stream_with_a_tpot_slo_is_refused_before_any_request(capsys):
    assert main(["run", "--no-stream", "--slo", "ttft=1s,tpot=1ms", "--url", "http://127.0.0.1:9", "--rate", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-stream" in err[0] and "tpot" in err[0]


def test_one_late_send_in_a_short_run_is_no_client_verdict():
    """30 sends at 1 req/s, one of them 40 ms late (a server sharing the client's cores): its p99 is past the
    10 ms limit, but 30 sends give no verdict either way, and the note says how many there were."""
    recs = [rec(i, float(i), float(i) + (0.04 if i == 7 else 0.0), i + 0.1, i + 0.2, 2, chunks=[i + 0.1, i + 0.2])
            for i in range(30)]
    c = summarize(recs, SLO(ttft_s=0.1)).client
    assert c.lateness_s["p99"] > c.lateness_limit_s
    assert c.is_bottleneck is False and c.warning is None
    assert c.num_sent == 30 and "from 30 sends" in c.note and ">= 100" in c.note


def test_one_late_send_in_a_long_run_is_no_bottleneck_but_many_are():
    """Over 200 sends the verdict rests on the share of late sends: 3 late (1.5%, p99 past the limit) pass,
    20 late (10%) do not."""
    def run(late_every):
        return [rec(i, i * 0.1, i * 0.1 + (0.05 if i % late_every == 0 else 0.0), i * 0.1 + 0.06, i * 0.1 + 0.08, 2,
                    chunks=[i * 0.1 + 0.06, i * 0.1 + 0.08]) for i in range(200)]

    few = summarize(run(70), SLO(ttft_s=0.1)).client
    assert few.lateness_s["p99"] > few.lateness_limit_s and few.is_bottleneck is False and few.note is None
    many = summarize(run(10), SLO(ttft_s=0.1)).client
    assert many.is_bottleneck is True
    assert "10% of 200 sends later than 10 ms" in many.warning
    assert many.late_share == pytest.approx(0.1) and many.to_dict()["num_sent"] == 200
