import json
import re
import shutil
from html import escape as html_escape

import numpy as np
import plotly.graph_objects as go
import pytest
from rich.console import Console

from slobench.analysis.headline import crossing_rate
from slobench.analysis.metrics import RecordArrays, throughput
from slobench.analysis.slo import SLO, attainment, bootstrap_mean_ci
from slobench.analysis.summary import read_columns, summarize
from slobench.cli import main as main_cli
from slobench.cli.common import print_sweep
from slobench.errors import UsageError
from slobench.report import build_report
from slobench.report.compare import compare
from slobench.report.figures import cdf_figure, client_figure, cliff_figure, percentile_figure
from slobench.report.html import SECTIONS
from slobench.report.load import load_series
from slobench.report.server_state import load_server_metrics, server_series
from slobench.report.stats import analyze, cdf_points
from slobench.report.synthetic import DEFAULT_SLO, synthetic_records, write_synthetic_sweep
from slobench.report.terminal import headline_text, print_run, run_title, sweep_errors_text, sweep_table
from slobench.report.timeline import MAX_MET_POINTS, MAX_MISS_POINTS, in_flight, timeline_figure
from slobench.run.records import RequestRecord, read_jsonl, read_jsonl_every, write_records
from slobench.run.rundir import RunWriter, load_run

HOSTILE = "<script>alert(1)</script><b>b</b>\"'&"
HOSTILE_DIR = "sw <img src=x onerror=alert(2)> \"q\""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    a = write_synthetic_sweep(root / "a", [2, 4, 6, 8, 10, 12], 300, tags=("warm", "burst", "cool"))
    b = write_synthetic_sweep(root / "b", [2, 4, 6, 9], 300, capacity_rps=7, seed=11)
    return a, b


def _section_ids(html: str) -> list[str]:
    return re.findall(r'<section id="([a-z]+)"', html)


def _num_figures(html: str) -> int:
    return int(re.search(r'<meta name="slobench-figures" content="(\d+)">', html).group(1))


def test_sections_in_order_and_self_contained(sweeps, tmp_path):
    a, b = sweeps
    one = build_report([a], tmp_path / "one.html").read_text()
    assert _section_ids(one) == list(SECTIONS[:-1])  # no comparison for a single input
    two = build_report([a, b], tmp_path / "sub" / "two.html").read_text()
    assert _section_ids(two) == list(SECTIONS)
    # plotly.js inline exactly once, one script per figure, nothing fetched from anywhere
    assert two.count("plotly.js v") == 1
    assert two.count("<script") == _num_figures(two) + 1
    start = two.index("plotly.js v")
    page = two[:start] + two[two.index("</script>", start):]  # the page without plotly.js's own source
    assert not re.search(r'\s(src|href)\s*=|url\(', page)
    # one figure per: cliff, latency, CDF per sweep, timeline per run, client
    assert _num_figures(two) == 1 + 1 + 2 + (6 + 4) + 1


def test_headline_is_the_crossing_rate_of_the_data(sweeps, tmp_path):
    a, _ = sweeps
    series = load_series(a)
    rates, values = [], []
    for run in series.runs:
        recs = load_run(run.run_dir).records
        arr = RecordArrays.from_records(recs)
        att = attainment(arr, DEFAULT_SLO, duration_s=throughput(arr).duration_s, seed=0)
        rates.append(run.rate_rps)
        values.append(att.value)
    expected = crossing_rate(rates, values, DEFAULT_SLO.target)
    assert expected is not None and 2 < expected < 12  # the synthetic cliff lies inside the sweep
    view = analyze(series, "#000000")
    assert view.headline["max_rate_meeting_rps"] == pytest.approx(expected, rel=1e-12)
    # and the interval comes from the same bootstrap slobench.analysis.slo uses
    for p, run in zip(view.points, series.runs, strict=True):
        arr = RecordArrays.from_records(load_run(run.run_dir).records)
        ref = attainment(arr, DEFAULT_SLO, duration_s=throughput(arr).duration_s, seed=0)
        assert (p.attainment.ci_low, p.attainment.ci_high) == pytest.approx((ref.ci_low, ref.ci_high), abs=1e-12)
    html = build_report([a], tmp_path / "r.html").read_text()
    assert f"up to {expected:.3g} req/s" in html
    assert html_escape(headline_text(view.headline)) in html


@pytest.mark.parametrize("seed", [0, 3])
def test_block_sum_bootstrap_equals_materialised_resamples(seed):
    # slo.bootstrap_mean_ci sums blocks through a prefix sum; check it against resamples built explicitly.
    from slobench.analysis.slo import block_length, block_starts

    rng = np.random.default_rng(seed)
    for n in (1, 7, 250, 2603):
        x = np.repeat(rng.random(n // 5 + 1) < 0.7, 5)[:n].astype(float)
        starts = block_starts(n, 1000, np.random.default_rng(seed))
        idx = (starts[:, :, None] + np.arange(block_length(n))).reshape(1000, -1)[:, :n]
        means = x[idx].mean(axis=1)
        ref = tuple(float(v) for v in np.quantile(means, [0.025, 0.975]))
        assert bootstrap_mean_ci(x, seed=seed) == pytest.approx(ref, abs=1e-12)


def test_fast_columns_equal_record_arrays(tmp_path):
    recs = synthetic_records(14, 400, capacity_rps=10, seed=2)  # past capacity: timeouts and failures too
    recs[3].is_warmup = True
    recs[10].prompt_tokens = None
    recs[20].scheduled_s = recs[21].scheduled_s  # a tie, broken by request id
    recs[30].chunk_times_s = recs[30].chunk_times_s[:1]
    for r in recs[40:80]:
        r.cached_tokens = 128  # a server that reports prefix-cache hits for some requests
    write_records(tmp_path / "requests.jsonl", recs)
    with open(tmp_path / "requests.jsonl", "a") as fh:
        fh.write('{"request_id": 999, "sched')  # torn final line, as after a crash
    ref = RecordArrays.from_records(load_run_records(tmp_path))
    got = read_columns(tmp_path).arrays
    for name in RecordArrays.__slots__:
        x, y = getattr(ref, name), getattr(got, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def load_run_records(run_dir):
    RunWriter(run_dir / "m", {})  # a manifest for load_run; the records are the ones under test
    shutil.copy(run_dir / "requests.jsonl", run_dir / "m" / "requests.jsonl")
    return load_run(run_dir / "m").records


def test_hostile_strings_are_escaped_everywhere(tmp_path):
    sweep = write_synthetic_sweep(tmp_path / HOSTILE_DIR, [3, 9], 120, model=HOSTILE, workload_name=HOSTILE,
                                  error_text=HOSTILE, tags=("a", HOSTILE))
    with open(sweep / "rate-3" / "server_metrics.jsonl", "a") as fh:  # a metric label a server controls
        fh.write(json.dumps({"t_s": 99.0, "samples": {f'vllm:num_requests_waiting{{m="{HOSTILE}"}}': 1.0}}) + "\n")
    other = write_synthetic_sweep(tmp_path / "base", [3], 120)
    html = build_report([other, sweep], tmp_path / "r.html", title=HOSTILE).read_text()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "</script><" not in html.replace("</script>\n", "")  # no script closed early by data
    assert html.count("<script") == _num_figures(html) + 1
    assert html_escape(HOSTILE) in html  # page text: escaped, quotes too
    assert "&lt;img src=x onerror=alert(2)&gt;" in html  # the run directory's name
    # text plotly draws (here a phase name) was escaped before plotly's JSON encoding: a <b> is no tag there
    in_json = html_escape(HOSTILE, quote=False).replace("/", "\\u002f").replace('"', '\\"')
    assert f'"text":"{in_json}"' in html


def test_big_run_is_decimated_and_small(tmp_path):
    n = 100_000
    recs = synthetic_records(9.0, n, capacity_rps=10, median_output_tokens=2, seed=1)
    run_dir = tmp_path / "big"
    w = RunWriter(run_dir, {"slo": DEFAULT_SLO.to_dict(), "rate_rps": 9.0})
    for r in recs:
        w.write(r)
    w.close()
    series = load_series(run_dir)
    fig, note = timeline_figure(series.runs[0], series.slo, "big")
    assert note.num_met + note.num_miss + note.num_fail > 90_000
    assert note.num_met_shown <= MAX_MET_POINTS and note.num_miss_shown <= min(note.num_miss, MAX_MISS_POINTS)
    assert note.num_met_shown < note.num_met and note.in_flight_binned
    out = build_report([run_dir], tmp_path / "big.html")
    assert out.stat().st_size < 15e6
    assert "Decimated:" in out.read_text()


def test_in_flight_steps_exact_and_binned():
    t, level, binned = in_flight(np.array([0.0, 1.0, 2.0]), np.array([3.0, 1.5, np.nan]))
    assert not binned
    assert t.tolist() == [0.0, 1.0, 1.5, 2.0, 3.0] and level.tolist() == [1, 2, 1, 2, 1]
    sent = np.arange(10_000, dtype=float)
    done = sent + 0.5
    done[5000] = 5000.0 + 50  # one long request: a spike to 2 that binning must keep
    t, level, binned = in_flight(sent, done, max_bins=100)
    assert binned and len(t) == 100 and level.max() == 2 and level.min() == 1


def test_cdf_points_bounded_and_tail_kept():
    x = np.random.default_rng(0).lognormal(size=200_000)
    v, p = cdf_points(x)
    assert len(v) <= 500 and v[-1] == x.max() and p[-1] == 1.0
    assert np.all(np.diff(v) >= 0) and np.all(np.diff(p) > 0)
    assert np.any((p > 0.999) & (p < 1))  # points inside the last 0.1%
    v, p = cdf_points(np.array([3.0, np.nan, 1.0]))
    assert v.tolist() == [1.0, 3.0] and p.tolist() == [0.5, 1.0]


def test_comparison_deltas(sweeps, tmp_path):
    a, b = sweeps
    va, vb = analyze(load_series(a), "#111111"), analyze(load_series(b), "#222222")
    c = compare(va, vb)
    assert [d.rate_rps for d in c.rates] == [2, 4, 6]  # 9 and 8/10/12 are not in common
    pa = {p.rate_rps: p for p in va.points}
    pb = {p.rate_rps: p for p in vb.points}
    for d in c.rates:
        assert d.attainment_delta_points == pytest.approx(100 * (pb[d.rate_rps].attainment.value - pa[d.rate_rps].attainment.value))
        assert d.ttft_p99_change == pytest.approx(pb[d.rate_rps].ttft_on_clock().p99 / pa[d.rate_rps].ttft_on_clock().p99 - 1)
        assert d.tpot_p99_change == pytest.approx(pb[d.rate_rps].tpot.p99 / pa[d.rate_rps].tpot.p99 - 1)
    cap_a, cap_b = va.headline["max_rate_meeting_rps"], vb.headline["max_rate_meeting_rps"]
    assert c.capacity_change == pytest.approx(cap_b / cap_a - 1)
    html = build_report([a, b], tmp_path / "c.html").read_text()
    section = html[html.index('<section id="compare">'):]
    assert f"{cap_a:.3g} → {cap_b:.3g} req/s" in section and f"{100 * c.capacity_change:+.1f}%" in section
    d6 = c.rates[-1]
    assert f"<td>{d6.attainment_delta_points:+.1f}</td>" in section


def test_figures_match_plotly_schema(sweeps):
    """The figures are plain dicts (fast); plotly's own validator still checks every property name."""
    a, b = sweeps
    views = [analyze(load_series(a), "#111111"), analyze(load_series(b), "#222222")]
    figs = [cliff_figure(views), percentile_figure(views), cdf_figure(views[0]), client_figure(views)]
    figs.append(timeline_figure(views[0].series.runs[-1], views[0].series.slo, "t")[0])
    for f in figs:
        go.Figure(f)  # raises ValueError on an unknown property


def test_log_axis_labels_are_placed_in_log_units(sweeps):
    a, _ = sweeps
    fig = percentile_figure([analyze(load_series(a), "#111111")])
    slo_labels = [ann for ann in fig["layout"]["annotations"] if ann["text"].startswith("SLO")]
    assert [ann["y"] for ann in slo_labels] == pytest.approx([np.log10(500), np.log10(50)])


def test_errors_name_the_file(sweeps, tmp_path):
    a, _ = sweeps
    broken = tmp_path / "broken"
    shutil.copytree(a, broken)
    shutil.rmtree(broken / "rate-4")
    with pytest.raises(UsageError, match=re.escape(str(broken / "rate-4"))):
        build_report([broken], tmp_path / "x.html")

    corrupt = tmp_path / "corrupt"
    shutil.copytree(a / "rate-2", corrupt)
    lines = (corrupt / "requests.jsonl").read_text().splitlines()
    lines[2] = lines[2][:40]
    (corrupt / "requests.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=re.escape(f"{corrupt / 'requests.jsonl'}:3")):
        build_report([corrupt], tmp_path / "x.html")

    bad_sweep = tmp_path / "bad_sweep"
    bad_sweep.mkdir()
    (bad_sweep / "sweep.json").write_text("{not json")
    with pytest.raises(UsageError, match=re.escape(str(bad_sweep / "sweep.json"))):
        build_report([bad_sweep], tmp_path / "x.html")

    metrics = tmp_path / "metrics"
    shutil.copytree(a / "rate-2", metrics)
    (metrics / "server_metrics.jsonl").write_text('{"t_s": 0, "samples": {}}\nnope\n{"t_s": 2, "samples": {}}\n')
    with pytest.raises(UsageError, match=re.escape(f"{metrics / 'server_metrics.jsonl'}:2")):
        build_report([metrics], tmp_path / "x.html")

    with pytest.raises(UsageError, match="neither a sweep"):
        build_report([tmp_path], tmp_path / "x.html")
    with pytest.raises(UsageError, match="no such directory"):
        build_report([tmp_path / "nope"], tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


def test_single_run_and_empty_run(tmp_path):
    recs = synthetic_records(3.0, 200, seed=4)
    w = RunWriter(tmp_path / "one", {"slo": SLO(ttft_s=0.5).to_dict(), "rate_rps": 3.0,
                                     "phases": [{"name": "ramp", "start_s": 0.0}, {"name": "hold", "start_s": 20.0}]})
    for r in recs:
        w.write(r)
    w.close()
    RunWriter(tmp_path / "empty", {"rate_rps": 1.0}).close()
    # a run with no record is refused by name, never drawn as a rate that sent nothing
    with pytest.raises(UsageError, match="empty/requests.jsonl: no readable request record"):
        build_report([tmp_path / "one", tmp_path / "empty"], tmp_path / "r.html")
    w = RunWriter(tmp_path / "no-slo", {"rate_rps": 1.0})
    for r in synthetic_records(1.0, 20, seed=5):
        w.write(r)
    w.close()
    html = build_report([tmp_path / "one", tmp_path / "no-slo"], tmp_path / "r.html").read_text()
    assert "(a lower bound: no rate tried missed)" in html
    assert "no SLO given" in html
    series = load_series(tmp_path / "one")
    assert [(p.name, p.start_s) for p in series.runs[0].phases] == [("ramp", 0.0), ("hold", 20.0)]


def test_phases_from_tags_only_when_contiguous(tmp_path):
    def run_with(tags):
        recs = [RequestRecord(request_id=i, scheduled_s=float(i), tag=t) for i, t in enumerate(tags)]
        d = tmp_path / "-".join(tags)
        RunWriter(d, {}).close()
        write_records(d / "requests.jsonl", recs)
        return load_series(d).runs[0].phases

    assert [(p.name, p.start_s) for p in run_with(["w", "w", "b", "b", "c"])] == [("w", 0.0), ("b", 2.0), ("c", 4.0)]
    assert run_with(["x", "y", "x", "y"]) == ()  # request classes, not phases
    assert run_with(["", ""]) == ()


def test_server_state_rates_and_ratios(tmp_path):
    p = tmp_path / "server_metrics.jsonl"
    lines = []
    for i, (hits, queries, pre) in enumerate([(0, 0, 0), (50, 100, 2), (50, 100, 2), (10, 200, 6)]):
        lines.append(json.dumps({"t_s": float(i), "samples": {
            'vllm:num_requests_waiting{engine="0"}': 1.0 + i, 'vllm:num_requests_waiting{engine="1"}': 2.0,
            'vllm:kv_cache_usage_perc{engine="0"}': 0.2, 'vllm:kv_cache_usage_perc{engine="1"}': 0.4,
            "vllm:prefix_cache_hits_total": float(hits), "vllm:prefix_cache_queries_total": float(queries),
            "vllm:num_preemptions_total": float(pre)}}))
    p.write_text("\n".join(lines) + '\n{"t_s": 4, "sam')  # torn last line: forgiven
    s = load_server_metrics(p)
    assert s.t_s.tolist() == [0, 1, 2, 3]
    panels = server_series(s)
    waiting = next(x for x in panels["requests"] if x.label.startswith("waiting"))
    assert waiting.values.tolist() == [3, 4, 5, 6]  # summed over engines
    kv, prefix = panels["cache"]
    assert kv.values == pytest.approx([30, 30, 30, 30])  # a fraction: averaged, in %
    assert prefix.values[0] == 50 and np.isnan(prefix.values[1])  # no queries in that interval
    assert prefix.values[2] == 0  # the counter went down (a restart): counted as zero, not negative
    assert panels["preemptions"][0].values.tolist() == [2, 0, 4]


@pytest.mark.parametrize("torn", [False, True])
def test_thinned_scrapes_are_every_kth_of_all_and_only_those_are_parsed(tmp_path, torn):
    p = tmp_path / "server_metrics.jsonl"
    lines = [json.dumps({"t_s": float(i), "samples": {"x": i}}) for i in range(23)]
    lines[4] = ""  # a blank line is no scrape
    p.write_text("\n".join(lines) + ('\n{"t_s": 99, "sam' if torn else "\n"))

    def check(d):
        return isinstance(d, dict) and "samples" in d

    everything = read_jsonl(p, "scrape", check, json.loads)
    for at_most in (1, 5, 7, 22, 100):
        rows, n = read_jsonl_every(p, "scrape", check, json.loads, at_most)
        assert n == len(everything) == 22 and rows == everything[:: -(-n // at_most)] and len(rows) <= at_most
    lines[7] = '{"t_s": 7, "samples": nope}'  # drawn at a step of 2 (the sixth scrape), not at a step of 5
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=re.escape(f"{p}:8")):
        read_jsonl_every(p, "scrape", check, json.loads, 11)
    assert read_jsonl_every(p, "scrape", check, json.loads, 5)[1] == 22  # a bad value undrawn goes unseen
    for cut in ('{"t_s": 7, "sam', "not json"):  # a line that is not one object is named, drawn or not
        lines[7] = cut
        p.write_text("\n".join(lines) + "\n")
        for at_most in (5, 11):
            with pytest.raises(UsageError, match=re.escape(f"{p}:8: bad scrape (not one JSON object")):
                read_jsonl_every(p, "scrape", check, json.loads, at_most)


def test_headline_text_says_what_is_known():
    h = {"target": 0.9, "max_rate_meeting_rps": 7.83, "interval_rps": [6.5, 8.2], "is_lower_bound": False}
    assert headline_text(h) == "attainment stays >= 90% up to 7.83 req/s; 95% interval 6.5 to 8.2 req/s"
    h = {"target": 0.9, "max_rate_meeting_rps": 24.0, "interval_rps": [24.0, 24.0], "is_lower_bound": True}
    assert headline_text(h) == "attainment stays >= 90% up to 24 req/s (a lower bound: no rate tried missed)"
    h = {"target": 0.95, "max_rate_meeting_rps": None, "interval_rps": [None, None], "is_lower_bound": False}
    assert headline_text(h) == "attainment is below 95% at every rate tried"
    assert headline_text(None).startswith("no SLO")


def test_quantiles_resting_on_few_tail_values_are_marked(tmp_path):
    # 200 requests: 100 beyond the p50 (enough), 20 beyond the p90 and 2 beyond the p99 (marked).
    from rich.console import Console

    from slobench.analysis.summary import summarize
    from slobench.report.terminal import THIN_MARK, print_run

    recs = synthetic_records(5.0, 200, seed=3)
    summary = summarize(recs, DEFAULT_SLO)
    assert (summary.ttft.beyond["p50"], summary.ttft.beyond["p99"]) == (100, 2)
    assert summary.ttft.ci["p99"][1] is None  # 200 values cannot bound a p99 from above
    console = Console(record=True, width=200)
    print_run(summary, console)
    text = console.export_text()
    ttft_row = next(line for line in text.splitlines() if "TTFT ms (from sent)" in line)
    cells = [c.strip() for c in ttft_row.split("│") if c.strip()]
    assert not cells[2].endswith(THIN_MARK) and cells[3].endswith(THIN_MARK) and cells[4].endswith(THIN_MARK)
    assert "fewer than 100 requests beyond this quantile" in text

    write_synthetic_sweep(tmp_path / "few", [2.0, 4.0], 200)
    write_synthetic_sweep(tmp_path / "many", [2.0, 4.0], 12_000)
    few = build_report([tmp_path / "few"], tmp_path / "few.html").read_text()
    many = build_report([tmp_path / "many"], tmp_path / "many.html").read_text()
    assert "fewer than 100 requests beyond this quantile" in few and THIN_MARK in few
    assert "fewer than 100 requests beyond this quantile" not in many


def test_rate_table_shows_prefix_cache_hits_when_the_server_reports_them(tmp_path):
    write_synthetic_sweep(tmp_path / "s", [2.0, 4.0], 60)
    plain = build_report([tmp_path / "s"], tmp_path / "plain.html").read_text()
    assert "prompt tokens cached" not in plain  # nothing reported: no column
    path = tmp_path / "s" / "rate-2" / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, d in enumerate(rows):
        d["cached_tokens"] = 128 if i % 2 == 0 else 0
    path.write_text("".join(json.dumps(d) + "\n" for d in rows))
    html = build_report([tmp_path / "s"], tmp_path / "cache.html").read_text()
    assert "prompt tokens cached" in html
    assert re.search(r"<td>\d+% · [\d.]+ / [\d.]+</td>", html)  # the reporting run's cell
    assert "<td>-</td></tr>" in html  # the run without counts says so


def test_the_median_is_never_marked_thin():
    from slobench.analysis.summary import Dist
    from slobench.report.html import _ms3

    assert _ms3(Dist(p50=1e-3, p90=2e-3, p99=3e-3, count=50)) == "1.0 / 2.0† / 3.0†"
    assert _ms3(Dist(p50=1e-3, p90=2e-3, p99=3e-3, count=20_000)) == "1.0 / 2.0 / 3.0"
    assert _ms3(Dist(count=0)) == "- / - / -"


def test_header_says_where_the_load_went():
    from slobench.report.html import _target_text

    assert _target_text({"url": "http://h:1/v1"}) == "http://h:1/v1"
    assert _target_text({"url": "http://h:1/v1", "client_workers": 4}) == "http://h:1/v1 (sent from 4 client processes)"
    sim = {"kind": "simulated", "knobs": {"profile": "h100-llama-1b"}, "fleet": {"replicas": 4, "router": "round-robin"}}
    assert _target_text(sim) == "simulated engine (virtual clock, profile h100-llama-1b), 4 replicas behind round-robin"
    assert _target_text({}) == "-"


def test_rate_table_shows_replicas_of_a_routed_fleet(tmp_path):
    assert main_cli(["sweep", "--simulate", "--workload", "tiny", "--rates", "10,40", "--num-requests", "60",
                     "--replicas", "3", "--router", "round-robin", "--slo", "ttft=200ms", "--out", str(tmp_path / "f"),
                     "--no-progress"]) in (0, 1)
    html = build_report([tmp_path / "f"], tmp_path / "f.html").read_text()
    assert "per replica: requests · TTFT p99 ms · attainment" in html
    assert re.search(r"<td>#0 20 · \d+ · [\d.]+%; #1 20 · \d+ · [\d.]+%; #2 20 · \d+ · [\d.]+%</td>", html)
    assert "simulated engine (virtual clock, profile cpu-tiny), 3 replicas behind round-robin" in html
    write_synthetic_sweep(tmp_path / "plain", [2.0], 50)
    assert "per replica" not in build_report([tmp_path / "plain"], tmp_path / "p.html").read_text()


def test_rate_table_shows_request_classes(tmp_path):
    main_cli(["sweep", "--simulate", "--workload", "day-shift", "--rates", "4,12", "--num-requests", "150",
              "--profile", "h100-llama-1b", "--slo", "ttft=300ms,tpot=40ms", "--out", str(tmp_path / "d"),
              "--no-progress"])
    html = build_report([tmp_path / "d"], tmp_path / "d.html").read_text()
    assert "per class: requests · TTFT p99 ms · attainment" in html
    assert re.search(r"morning/chat \d+ · \d+ · [\d.]+%; morning/doc \d+ · \d+ · [\d.]+%", html)


def test_rows_past_capacity_are_marked(tmp_path):
    from slobench.report.terminal import OVERLOAD_MARK, OVERLOAD_NOTE

    main_cli(["sweep", "--simulate", "--workload", "chat", "--rates", "20,40", "--duration", "30", "--profile",
              "h100-llama-1b", "--slo", "ttft=300ms,tpot=40ms", "--out", str(tmp_path / "o"), "--no-progress"])
    html = build_report([tmp_path / "o"], tmp_path / "o.html").read_text()
    cells = re.findall(r"<td>([\d.]+% \[[^<]*)</td>", html)
    assert len(cells) == 2 and not cells[0].endswith(OVERLOAD_MARK) and cells[1].endswith(OVERLOAD_MARK)
    assert OVERLOAD_NOTE.split(":")[0].strip() in html


def test_fleet_report_without_an_slo(tmp_path):
    main_cli(["sweep", "--simulate", "--workload", "tiny", "--rates", "10", "--num-requests", "40", "--replicas", "2",
              "--out", str(tmp_path / "n"), "--no-progress"])
    html = build_report([tmp_path / "n"], tmp_path / "n.html").read_text()
    assert re.search(r"<td>#0 \d+ · \d+; #1 \d+ · \d+</td>", html)  # no attainment without an SLO


SERVER_MESSAGE = "server error mid-stream: Token id 29987 is out of vocabulary\x1b[2J\x1b]0;pwned\x07 <b>x</b>"


def test_the_first_error_of_each_kind_is_shown_in_its_own_words(tmp_path):
    """The terminal and the report name each error kind with the server's own first message: escaped,
    terminal escape sequences removed, truncated, credentials redacted."""
    recs = synthetic_records(9.0, 200, capacity_rps=6, median_output_tokens=8, seed=2, error_text=SERVER_MESSAGE)
    recs[0].fail("error", "HTTP 500: Bearer sk-secret " + "y" * 400)
    s = summarize(recs, DEFAULT_SLO)
    kinds = s.error_counts
    assert s.error_examples["server error mid-stream"] == "Token id 29987 is out of vocabulary <b>x</b>"
    assert s.error_examples["HTTP 500"].startswith("Bearer <redacted> yyy") and len(s.error_examples["HTTP 500"]) == 200
    console = Console(record=True, width=300)
    print_run(s, console=console)
    text = console.export_text()
    n = kinds["server error mid-stream"]
    assert f'server error mid-stream × {n}: "Token id 29987 is out of vocabulary <b>x</b>"' in text
    assert "\x1b" not in text and "sk-secret" not in text
    sweep = write_synthetic_sweep(tmp_path / "s", [9.0], 200, capacity_rps=6, error_text=SERVER_MESSAGE)
    html = build_report([sweep], tmp_path / "r.html").read_text()
    assert "Token id 29987 is out of vocabulary &lt;b&gt;x&lt;/b&gt;" in html and "pwned" not in html


LENGTH_REFUSAL = "too long: HTTP 400: This model's maximum context length is 64 tokens. However, you requested 90"


def test_a_sweeps_errors_are_named_once_a_kind_with_the_rate_first_seen(tmp_path):
    """Across a sweep's rates each error kind is one line: its count over every rate, the lowest rate it
    was seen at and its first message there, cleaned as a run's are."""
    low = synthetic_records(2.0, 100, capacity_rps=10, seed=1, error_text=LENGTH_REFUSAL)
    high = synthetic_records(9.0, 100, capacity_rps=10, seed=2, error_text=LENGTH_REFUSAL)
    low[5].fail("error", LENGTH_REFUSAL)
    high[0].fail("error", SERVER_MESSAGE)
    high[1].fail("error", LENGTH_REFUSAL.replace("90", "95"))
    by_rate = {rate: summarize(recs, DEFAULT_SLO) for rate, recs in ((2.0, low), (9.0, high))}
    lines = sweep_errors_text([(9.0, by_rate[9.0]), (2.0, by_rate[2.0])])  # in any order
    too_long = sum(s.error_counts["too long"] for s in by_rate.values())
    assert lines[0] == "errors across the rates:"
    assert lines[1] == (f'  too long × {too_long} (first at 2 req/s): "HTTP 400: This model\'s maximum context '
                        'length is 64 tokens. However, you requested 90"')
    assert '  server error mid-stream × 1 (first at 9 req/s): "Token id 29987 is out of vocabulary <b>x</b>"' in lines
    assert sweep_errors_text([]) == []
    # the sweep verb prints them under its table, the report under its rate table
    sweep = write_synthetic_sweep(tmp_path / "s", [2.0, 9.0], 400, capacity_rps=6, error_text=SERVER_MESSAGE)
    doc = json.loads((sweep / "sweep.json").read_text())
    console = Console(record=True, width=300)
    print_sweep(doc, console, "sweep")
    text = console.export_text()
    assert "errors across the rates:" in text and "server error mid-stream × " in text and "\x1b" not in text
    html = build_report([sweep], tmp_path / "r.html").read_text()
    block = html[html.index("errors across the rates"):]
    assert re.search(r"<code>server error mid-stream</code> × \d+, first at (2|9) req/s: <code>&quot;Token id "
                     r"29987 is out of vocabulary &lt;b&gt;x&lt;/b&gt;&quot;</code>", block)
    assert "pwned" not in html


def test_legends_only_for_marks_in_the_table_and_titles_without_dangling_separators():
    calm = summarize(synthetic_records(2.0, 50, capacity_rps=10, seed=1), DEFAULT_SLO)
    table = sweep_table([{"rate_rps": 2.0, "summary": calm}])
    assert not calm.overloaded and "past capacity" not in str(table.caption)
    over = summarize(synthetic_records(14.0, 400, capacity_rps=10, seed=1), DEFAULT_SLO)
    assert over.overloaded and "past capacity" in str(sweep_table([{"rate_rps": 14.0, "summary": over}]).caption)
    assert run_title("simulated", "", "completions API", "run1") == "simulated · completions API · run1"


def test_run_header_names_the_api(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short run directory: a long one is folded mid-word where the title wraps
    assert main_cli(["run", "--simulate", "--workload", "tiny", "--rate", "20", "--num-requests", "20",
                     "--out", "r"]) == 0
    head = " ".join(line.strip() for line in capsys.readouterr().out.split("┏")[0].splitlines())  # a title may wrap
    assert head == "simulated · workload tiny · completions API · r"


def test_a_run_too_short_for_a_client_verdict_is_not_called_healthy(tmp_path):
    """30 sends give no verdict on the client either way: the report says so instead of "kept its schedule"."""
    short = write_synthetic_sweep(tmp_path / "short", [2.0], 30)
    html = build_report([short], tmp_path / "r.html").read_text()
    assert "no verdict on the load generator from 30 sends" in html and "kept its schedule" not in html
    long = write_synthetic_sweep(tmp_path / "long", [2.0], 200)
    assert "kept its schedule" in build_report([long], tmp_path / "l.html").read_text()
