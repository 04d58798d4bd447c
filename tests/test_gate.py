"""The regression gate on synthetic replicate values and files (no server)."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from slobench.cli import main
from slobench.errors import SpecError, UsageError
from slobench.gate import Samples, Threshold, compare_metric, gate, load_samples

SLO = {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None, "target": 0.9, "clock": "scheduled"}
WORKLOAD = {"name": "tiny", "hash": "abc", "spec": {"spec": {"name": "tiny", "input": {"max": 256}}}}


def samples(metrics, *, slo=SLO, workload=WORKLOAD, source="x"):
    s = Samples(source, dict(workload), dict(slo) if slo else None, "0.1.0")
    for key, values in metrics.items():
        for seed, v in enumerate(values, 1):
            s.add(key, seed, v, source)
    return s


def write_baseline(path, s):
    path.write_text(json.dumps(s.to_baseline()))
    return str(path)


def run_gate(tmp_path, base, cand, *extra, monkeypatch=None):
    b = write_baseline(tmp_path / "base.json", base)
    c = write_baseline(tmp_path / "cand.json", cand)
    return main(["gate", "--baseline", b, "--candidate", c, *extra])


RNG = np.random.default_rng(0)
BASE_CAP = list(20 + RNG.normal(0, 0.2, 5))


def test_identical_inputs_pass(tmp_path, capsys):
    s = samples({"capacity": BASE_CAP})
    assert run_gate(tmp_path, s, s) == 0
    assert "pass" in capsys.readouterr().out


def test_big_significant_drop_fails(tmp_path, capsys):
    base = samples({"capacity": BASE_CAP})
    cand = samples({"capacity": [v * 0.85 for v in BASE_CAP]})
    assert run_gate(tmp_path, base, cand, "--max-drop", "capacity=5%") == 1
    out = capsys.readouterr().out
    assert "regression" in out and "15.0%" in out


def test_large_but_noisy_change_with_two_replicates_is_inconclusive(tmp_path, capsys):
    base = samples({"capacity": [20.0, 26.0]})
    cand = samples({"capacity": [14.0, 24.0]})  # -20% on average, but the seeds disagree wildly
    code = run_gate(tmp_path, base, cand, "--max-drop", "capacity=5%")
    assert code == 4
    out = capsys.readouterr().out
    assert "inconclusive" in out and "replicates per side" in out
    res = gate(base, cand, [Threshold.parse("capacity=5%", "drop")])
    c = res.checks[0]
    assert c.more_replicates is not None and c.more_replicates >= 1
    assert f"about {c.more_replicates + 2} replicates" in c.message


def test_more_replicates_decide_what_two_could_not():
    rng = np.random.default_rng(1)
    base_vals = 20 + rng.normal(0, 2, 2)
    cand_vals = base_vals * 0.8 + rng.normal(0, 2, 2)
    c2 = compare_metric("capacity", Threshold.parse("capacity=5%", "drop"),
                        dict(enumerate(base_vals)), dict(enumerate(cand_vals)))
    assert c2.verdict == "inconclusive"
    n = c2.more_replicates + 2
    base_n = 20 + rng.normal(0, 2, n + 5)
    cand_n = base_n * 0.8 + rng.normal(0, 2, n + 5)
    cn = compare_metric("capacity", Threshold.parse("capacity=5%", "drop"),
                        dict(enumerate(base_n)), dict(enumerate(cand_n)))
    assert cn.verdict == "regression"


def test_tiny_significant_change_below_threshold_passes(tmp_path):
    base = samples({"capacity": BASE_CAP})
    cand = samples({"capacity": [v * 0.98 for v in BASE_CAP]})  # -2%, perfectly consistent: significant
    res = gate(base, cand, [Threshold.parse("capacity=5%", "drop")])
    assert res.checks[0].p_value < 0.01
    assert res.verdict == "pass" and res.exit_code == 0
    assert run_gate(tmp_path, base, cand, "--max-drop", "capacity=5%") == 0


def test_big_change_in_the_good_direction_passes():
    base = samples({"ttft.p99@4": [0.2, 0.21, 0.19, 0.2, 0.2]})
    cand = samples({"ttft.p99@4": [0.1, 0.11, 0.09, 0.1, 0.1]})
    assert gate(base, cand, [Threshold.parse("ttft.p99=10%", "rise")]).verdict == "pass"


def test_latency_rise_fails_and_rate_without_at_expands():
    base = samples({"ttft.p99@2": [0.2] * 5, "ttft.p99@4": [0.30, 0.31, 0.29, 0.30, 0.30]})
    cand = samples({"ttft.p99@2": [0.2] * 5, "ttft.p99@4": [0.40, 0.41, 0.39, 0.40, 0.40]})
    res = gate(base, cand, [Threshold.parse("ttft.p99=10%", "rise")])
    assert [c.key for c in res.checks] == ["ttft.p99@2", "ttft.p99@4"]
    assert [c.verdict for c in res.checks] == ["pass", "regression"]


def test_attainment_points_and_absolute_thresholds():
    base = samples({"attainment@4": [0.95, 0.96, 0.94, 0.95, 0.95]})
    cand = samples({"attainment@4": [0.92, 0.93, 0.91, 0.92, 0.92]})  # -3 points
    assert gate(base, cand, [Threshold.parse("attainment@4=2pt", "drop")]).verdict == "regression"
    assert gate(base, cand, [Threshold.parse("attainment@4.0=5pt", "drop")]).verdict == "pass"
    lat = samples({"tpot.p99@4": [0.040] * 5})
    lat2 = samples({"tpot.p99@4": [0.047, 0.0471, 0.0469, 0.047, 0.047]})
    assert gate(lat, lat2, [Threshold.parse("tpot.p99@4=5ms", "rise")]).verdict == "regression"
    assert gate(lat, lat2, [Threshold.parse("tpot.p99@4=10ms", "rise")]).verdict == "pass"


def test_unpaired_seeds_use_welch():
    base = Samples("b", WORKLOAD, SLO, "0")
    cand = Samples("c", WORKLOAD, SLO, "0")
    for i, v in enumerate([20.0, 20.2, 19.8, 20.1, 19.9]):
        base.add("capacity", i, v, "b")
        cand.add("capacity", 100 + i, v * 0.8, "c")
    c = gate(base, cand, [Threshold.parse("capacity=5%", "drop")]).checks[0]
    assert not c.is_paired and c.verdict == "regression"


def test_default_thresholds_cover_what_both_measured():
    base = samples({"capacity": BASE_CAP, "attainment@4": [0.95] * 5, "ttft.p99@4": [0.2] * 5})
    res = gate(base, base)
    assert [c.key for c in res.checks] == ["capacity", "attainment@4", "ttft.p99@4"]
    assert res.verdict == "pass"


def test_different_workloads_are_refused(tmp_path, capsys):
    base = samples({"capacity": BASE_CAP})
    other = {"name": "chat", "hash": "def", "spec": {"spec": {"name": "chat", "input": {"max": 512}}}}
    cand = samples({"capacity": BASE_CAP}, workload=other)
    assert run_gate(tmp_path, base, cand) == 2
    err = capsys.readouterr().err
    assert "workload name 'tiny' vs 'chat'" in err and "input.max 256 vs 512" in err


def test_different_slos_are_refused(tmp_path, capsys):
    base = samples({"capacity": BASE_CAP})
    cand = samples({"capacity": BASE_CAP}, slo={**SLO, "ttft_s": 0.3})
    assert run_gate(tmp_path, base, cand) == 2
    assert "SLO ttft_s 0.5 vs 0.3" in capsys.readouterr().err


def test_missing_baseline_names_the_file(tmp_path, capsys):
    c = write_baseline(tmp_path / "cand.json", samples({"capacity": BASE_CAP}))
    missing = tmp_path / "nope.json"
    assert main(["gate", "--baseline", str(missing), "--candidate", c]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file" in err


@pytest.mark.parametrize(
    "text,why",
    [('{"kind": "baseline", "metrics"', "not valid JSON"),
     ('{"kind": "nonsense"}', "not a capacity result"),
     ('{"kind": "baseline", "workload": {}, "metrics": {"capacity": {"replicates": [{"seed": 1}]}}}', "corrupt"),
     ('[1, 2]', "not a capacity result")],
)
def test_corrupt_baseline_names_the_file_and_why(tmp_path, capsys, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    c = write_baseline(tmp_path / "cand.json", samples({"capacity": BASE_CAP}))
    assert main(["gate", "--baseline", str(bad), "--candidate", c]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and why in err


def test_metric_missing_on_one_side_is_bad_input():
    base = samples({"capacity": BASE_CAP})
    with pytest.raises(UsageError, match="attainment@8: not in the baseline"):
        gate(base, base, [Threshold.parse("attainment@8=2pt", "drop")])
    with pytest.raises(UsageError, match="no offered rate measured by both"):
        gate(base, base, [Threshold.parse("ttft.p99=10%", "rise")])


@pytest.mark.parametrize("text", ["capacity", "capacity=-5%", "=5%", "capacity=5 bananas"])
def test_bad_thresholds(text):
    with pytest.raises(SpecError):
        Threshold.parse(text, "drop")


def test_junit_and_markdown_and_step_summary(tmp_path, monkeypatch):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = samples({"capacity": BASE_CAP, "ttft.p99@4": [0.2] * 5})
    cand = samples({"capacity": [v * 0.8 for v in BASE_CAP], "ttft.p99@4": [0.2] * 5})
    junit, md, js = tmp_path / "gate.xml", tmp_path / "gate.md", tmp_path / "gate.json"
    code = run_gate(tmp_path, base, cand, "--max-drop", "capacity=5%", "--max-rise", "ttft.p99=10%",
                    "--junit", str(junit), "--markdown", str(md), "--json", str(js))
    assert code == 1
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 2
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and failed[0].get("name").startswith("capacity")
    assert root.find("testsuite").get("failures") == "1"
    text = md.read_text()
    assert "| `capacity` |" in text and "regression" in text and "-20.0%" in text
    assert summary.read_text().startswith("earlier step\n") and text in summary.read_text()
    assert json.loads(js.read_text())["verdict"] == "regression"


def test_write_baseline_round_trips(tmp_path):
    s = samples({"capacity": BASE_CAP, "attainment@4": [0.9, 0.91]})
    src = write_baseline(tmp_path / "a.json", s)
    out = tmp_path / "baselines" / "b.json"
    assert main(["gate", "--candidate", src, "--write-baseline", str(out)]) == 0
    back = load_samples([out])
    assert back.metrics == s.metrics and back.slo == s.slo and back.workload == s.workload


def _capacity_doc(seed_caps, rate_att):
    manifest = {"workload": {"name": "tiny", "arrival": {"process": "poisson", "rate_rps": 3.0}},
                "workload_name": "tiny", "slo": SLO, "slobench_version": "0.1.0", "options": {"num_requests": 50}}
    probes = [{"rate_rps": r, "seed": s, "phase": "replicate", "attainment": a, "metrics": {"attainment": a}}
              for (r, s), a in rate_att.items()]
    return {"kind": "capacity", "schema_version": 1, "manifest": manifest, "probes": probes,
            "replicates": [{"seed": s, "capacity_rps": c} for s, c in seed_caps.items()]}


def test_capacity_and_sweep_files_load_by_seed_and_rate(tmp_path):
    doc = _capacity_doc({1: 10.0, 2: 11.0}, {(4.0, 1): 0.95, (4.0, 2): 0.97})
    (tmp_path / "capacity.json").write_text(json.dumps(doc))
    s = load_samples([tmp_path])  # a directory stands for the capacity.json inside
    assert s.metrics["capacity"] == {1: 10.0, 2: 11.0}
    assert s.metrics["attainment@4"] == {1: 0.95, 2: 0.97}
    assert s.workload["name"] == "tiny"
    sweeps = []
    for seed in (1, 2, 3):
        d = tmp_path / f"sweep{seed}"
        d.mkdir()
        man = {**doc["manifest"], "seed": seed}
        runs = [{"rate_rps": 4.0, "summary": {"attainment": {"value": 0.9 + seed / 100}, "ttft_s": {"p99": 0.1}}}]
        (d / "sweep.json").write_text(json.dumps({"kind": "sweep", "schema_version": 1, "manifest": man, "runs": runs}))
        sweeps.append(d)
    sw = load_samples(sweeps)  # one sweep per seed: the replicates
    assert sw.metrics["attainment@4"] == {1: 0.91, 2: 0.92, 3: 0.93}
    assert sw.metrics["ttft.p99@4"] == {1: 0.1, 2: 0.1, 3: 0.1}
    assert sw.workload["hash"] == s.workload["hash"]  # the offered rate is not the workload's identity


def test_gate_options_validated():
    s = samples({"capacity": BASE_CAP})
    with pytest.raises(SpecError):
        gate(s, s, alpha=0.7)


def test_an_inconclusive_capacity_is_never_a_pass(tmp_path, capsys):
    """A capacity search that located no capacity gives the gate no capacity to pass on: its per-seed
    crossings (-12 and +13 req/s here) are not read, and the capacity check is inconclusive (exit 4)."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d, caps, why in ((good, {1: 10.0, 2: 10.1}, None), (bad, {1: -12.0, 2: 13.0}, "interval reaches 0")):
        d.mkdir()
        doc = _capacity_doc(caps, {(4.0, 1): 0.95, (4.0, 2): 0.97})
        (d / "capacity.json").write_text(json.dumps({**doc, "inconclusive": why}))
    s = load_samples([bad])
    assert "capacity" not in s.metrics and s.inconclusive == {"capacity": "interval reaches 0"}
    res = gate(load_samples([good]), s)
    check = next(c for c in res.checks if c.key == "capacity")
    assert check.verdict == "inconclusive" and "interval reaches 0" in check.message
    assert res.exit_code == 4
    assert main(["gate", "--baseline", str(good), "--candidate", str(bad), "--max-drop", "capacity=5%"]) == 4
    assert "not measured" in capsys.readouterr().out
