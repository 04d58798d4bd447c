"""History over commits: the JSONL file, change-point detection on synthetic histories, the HTML page."""

import json

import numpy as np
import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.gate import Samples, Threshold, compare_metric
from slobench.history import append_entry, entry_from_results, find_change_points, read_history
from slobench.history.synthetic import drift_levels, replicate_values, step_levels

SLO = {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None, "target": 0.9, "clock": "scheduled"}
MANIFEST = {"workload": {"name": "tiny", "arrival": {"process": "poisson", "rate_rps": 3.0}},
            "workload_name": "tiny", "slo": SLO, "slobench_version": "0.1.0", "options": {"num_requests": 50}}
HOSTILE = "<script>alert(1)</script>\"'&"


def capacity_doc(caps: dict[int, float], rate_metrics: dict[tuple[float, int], dict[str, float]] | None = None,
                 *, mode: str = "fixed-rates") -> dict:
    probes = [{"rate_rps": r, "seed": s, "phase": "replicate", "attainment": m.get("attainment"), "metrics": m}
              for (r, s), m in (rate_metrics or {}).items()]
    vals = list(caps.values())
    return {"kind": "capacity", "schema_version": 1, "mode": mode, "manifest": MANIFEST, "probes": probes,
            "capacity_rps": float(np.mean(vals)) if mode == "search" else None,
            "interval_rps": [min(vals), max(vals)] if mode == "search" else None,
            "replicates": [{"seed": s, "capacity_rps": c} for s, c in caps.items()]}


def write_doc(path, doc):
    path.mkdir(parents=True, exist_ok=True)
    (path / "capacity.json").write_text(json.dumps(doc))
    return path


def baseline_file(path, per_seed: dict[int, float], key="capacity"):
    s = Samples(str(path), {"name": "tiny", "hash": "h1", "spec": {}}, dict(SLO), "0.1.0")
    for seed, v in per_seed.items():
        s.add(key, seed, v, str(path))
    path.write_text(json.dumps(s.to_baseline()))
    return path


# --- the file ---------------------------------------------------------------------------------------------


def test_history_file_round_trips_and_stays_small(tmp_path):
    rm = {(4.0, s): {"attainment": 0.95 + s / 100, "ttft.p50": 0.1, "ttft.p99": 0.2 + s / 100,
                     "tpot.p50": 0.02, "tpot.p99": 0.03, "e2e.p50": 1.0} for s in (1, 2, 3)}
    run = write_doc(tmp_path / "cap", capacity_doc({1: 10.0, 2: 11.0, 3: 12.0}, rm))
    hist = tmp_path / "h" / "history.jsonl"
    assert main(["history", "add", str(run), "--commit", "abc123", "--date", "2026-11-30T10:00:00Z",
                 "--verdict", "pass", "--history", str(hist)]) == 0
    assert main(["history", "add", str(run / "capacity.json"), "--commit", "def456", "--date", "2026-12-01",
                 "--verdict", "regression", "--history", str(hist)]) == 0
    lines = hist.read_text().splitlines()
    assert len(lines) == 2 and all(len(line) < 700 for line in lines)  # a few hundred bytes a commit
    back = read_history(hist)
    assert [e["commit"] for e in back] == ["abc123", "def456"]
    assert back[0]["date"] == "2026-11-30T10:00:00+00:00" and back[1]["date"] == "2026-12-01T00:00:00+00:00"
    assert [e["verdict"] for e in back] == ["pass", "fail"]  # the gate's "regression" is a fail
    m = back[0]["metrics"]
    assert set(m) == {"capacity", "attainment@4", "ttft.p50@4", "ttft.p99@4", "tpot.p50@4", "tpot.p99@4"}
    mean, lo, hi, sd, n = m["capacity"]
    assert (mean, sd, n) == (11.0, 1.0, 3) and lo < 11.0 < hi
    assert m["attainment@4"][0] == pytest.approx(0.97) and m["attainment@4"][2] <= 1.0  # clipped to [0, 1]
    # what was written is exactly what the entry builder makes
    again = entry_from_results([run], commit="abc123", date="2026-11-30T10:00:00Z", verdict="pass")
    assert again == back[0]


def test_a_search_keeps_only_the_capacity_and_its_own_interval(tmp_path):
    rm = {(8.0 + s, s): {"attainment": 0.9} for s in (1, 2)}  # bracket edges: they move between commits
    run = write_doc(tmp_path / "s", capacity_doc({1: 9.0, 2: 11.0}, rm, mode="search"))
    e = entry_from_results([run], commit="c1")
    assert list(e["metrics"]) == ["capacity"] and e["metrics"]["capacity"][:3] == [10.0, 9.0, 11.0]


def test_bad_input_is_refused_with_the_reason(tmp_path, capsys):
    run = write_doc(tmp_path / "cap", capacity_doc({1: 10.0, 2: 11.0}))
    hist = tmp_path / "h.jsonl"
    for extra, why in ((["--verdict", "maybe"], "--verdict"), (["--date", "yesterday"], "--date")):
        assert main(["history", "add", str(run), "--commit", "a", "--history", str(hist), *extra]) == 2
        assert why in capsys.readouterr().err
    assert not hist.exists()
    other = baseline_file(tmp_path / "other.json", {1: 10.0, 2: 11.0})  # another workload hash
    assert main(["history", "add", str(run), "--commit", "a", "--history", str(hist)]) == 0
    assert main(["history", "add", str(other), "--commit", "b", "--history", str(hist)]) == 2
    assert "refusing to append" in capsys.readouterr().err
    hist.write_text(hist.read_text() + "{not json\n")
    with pytest.raises(UsageError, match="line 2"):
        read_history(hist)


def test_append_mends_a_missing_final_newline(tmp_path):
    hist = tmp_path / "h.jsonl"
    e = entry_from_results([baseline_file(tmp_path / "b.json", {1: 10.0, 2: 11.0})], commit="a")
    hist.write_text(json.dumps(e))  # no newline: edited by hand
    append_entry(hist, {**e, "commit": "b"})
    assert [x["commit"] for x in read_history(hist)] == ["a", "b"]


# --- change points -----------------------------------------------------------------------------------------


def per_commit_gate(history):
    th = Threshold.parse("capacity=5%", "drop")
    return [compare_metric("capacity", th, a, b).verdict for a, b in zip(history, history[1:], strict=False)]


def test_a_2pct_per_commit_drift_passes_the_gate_every_commit_but_is_found():
    rng = np.random.default_rng(7)
    history = replicate_values(drift_levels(10, per_commit=-0.02), rng)
    assert per_commit_gate(history) == ["pass"] * 9  # each 2% step is inside the 5% threshold
    means = [np.mean(list(h.values())) for h in history]
    assert means[-1] / means[0] - 1 < -0.12  # ... and together they cost ~17%
    found = find_change_points(means, alpha=0.01, min_shift=0.05)
    assert found, "the drift was not detected"
    assert all(c.shift < -0.05 for c in found)
    assert 2 <= found[0].index <= 8


def test_noise_only_histories_are_silent():
    rng = np.random.default_rng(11)
    for _ in range(10):
        history = replicate_values(drift_levels(10, per_commit=0.0), rng)
        means = [np.mean(list(h.values())) for h in history]
        assert find_change_points(means, alpha=0.01, min_shift=0.05) == []
        # not only the size floor keeps it silent: the test itself finds no shift
        assert find_change_points(means, alpha=0.01, min_shift=0.0) == []


def test_a_step_is_located_and_a_deterministic_series_is_handled():
    rng = np.random.default_rng(3)
    means = [np.mean(list(h.values())) for h in replicate_values(step_levels(16, at=9, size=-0.1), rng)]
    [c] = find_change_points(means)
    assert c.index == 9 and c.shift == pytest.approx(-0.1, abs=0.02)
    flat = [20.0] * 12  # a simulated engine: identical every commit
    assert find_change_points(flat) == []
    stepped = [20.0] * 6 + [18.0] * 6
    assert [c.index for c in find_change_points(stepped)] == [6]


def test_too_short_a_history_has_no_change_points():
    assert find_change_points([1.0, 2.0, 3.0, 4.0]) == []


# --- the page -----------------------------------------------------------------------------------------------


def write_history(tmp_path, levels, *, commits=None, rng_seed=5, verdicts=None):
    rng = np.random.default_rng(rng_seed)
    hist = tmp_path / "history.jsonl"
    for i, per in enumerate(replicate_values(levels, rng)):
        b = baseline_file(tmp_path / f"b{i}.json", per)
        commit = (commits or [f"c{i:02d}"] * len(levels))[i] if commits else f"c{i:02d}"
        e = entry_from_results([b], commit=commit, date=f"2026-11-{i + 1:02d}",
                               verdict=(verdicts or ["pass"] * len(levels))[i])
        append_entry(hist, e)
    return hist


def test_report_marks_the_drift_and_says_every_commit_passed(tmp_path, capsys):
    hist = write_history(tmp_path, drift_levels(10, per_commit=-0.02))
    out = tmp_path / "history.html"
    assert main(["history", "report", str(hist), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "change point: capacity" in text and "worse" in text
    page = out.read_text()
    assert 'name="slobench-figures" content="1"' in page
    assert "every commit passed the gate" in page and 'id="changes"' in page
    assert "https://" not in page.split("<body>", 1)[1]  # nothing fetched: plotly is inline
    assert main(["history", "report", str(hist), "-o", str(out), "--fail-on-change"]) == 1


def test_report_on_noise_finds_nothing(tmp_path, capsys):
    hist = write_history(tmp_path, drift_levels(10, per_commit=0.0))
    out = tmp_path / "history.html"
    assert main(["history", "report", str(hist), "-o", str(out), "--fail-on-change"]) == 0
    assert "change point" not in capsys.readouterr().out
    assert "No change point" in out.read_text()


def test_min_shift_option_and_hostile_commit_ids_are_text(tmp_path):
    commits = [f"{HOSTILE}{i}" for i in range(10)]
    hist = write_history(tmp_path, drift_levels(10, per_commit=-0.02), commits=commits)
    out = tmp_path / "h.html"
    assert main(["history", "report", str(hist), "-o", str(out), "--min-shift", "capacity=50%"]) == 0
    page = out.read_text()
    assert "No change point" in page  # a 50% floor is above the drift
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page


def test_one_run_directory_and_sweeps_per_seed_become_lines(tmp_path):
    from slobench.report.synthetic import write_synthetic_sweep

    sweeps = [write_synthetic_sweep(tmp_path / f"s{seed}", [2, 5], 120, seed=seed) for seed in (1, 2, 3)]
    e = entry_from_results(sweeps, commit="abc")  # one sweep per seed: the replicates
    assert e["source"] == "sweep" and {"attainment@2", "ttft.p99@5", "tpot.p50@5"} <= set(e["metrics"])
    assert all(m[4] == 3 for m in e["metrics"].values())
    only5 = entry_from_results(sweeps, commit="abc", rates=[5])
    assert set(only5["metrics"]) == {k for k in e["metrics"] if k.endswith("@5")}
    run = next(p for p in sweeps[0].iterdir() if p.is_dir())  # one run: its own bootstrap intervals
    r = entry_from_results([run], commit="abc")
    mean, lo, hi, sd, n = r["metrics"][next(k for k in r["metrics"] if k.startswith("ttft.p99@"))]
    assert n == 1 and sd is None and lo is not None and lo <= mean <= (hi if hi is not None else mean)
    att = r["metrics"][next(k for k in r["metrics"] if k.startswith("attainment@"))]
    assert att[1] is not None and att[1] <= att[0] <= att[2]
