"""`slobench gate --update-baseline-on-pass`: a baseline that follows main, refreshed only by a pass."""

import json

import numpy as np

from slobench.cli import main
from slobench.gate import Samples, load_samples

SLO = {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None, "target": 0.9, "clock": "scheduled"}
WORKLOAD = {"name": "tiny", "hash": "abc", "spec": {"spec": {"name": "tiny"}}}
BASE = list(20 + np.random.default_rng(0).normal(0, 0.2, 5))


def write(path, values):
    s = Samples(str(path), dict(WORKLOAD), dict(SLO), "0.1.0")
    for seed, v in enumerate(values, 1):
        s.add("capacity", seed, v, str(path))
    path.write_text(json.dumps(s.to_baseline()))
    return path


def gate(base, cand, *extra):
    return main(["gate", "--baseline", str(base), "--candidate", str(cand), "--max-drop", "capacity=5%",
                 "--update-baseline-on-pass", *extra])


def test_a_pass_refreshes_the_baseline_from_the_candidate(tmp_path, capsys):
    base = write(tmp_path / "main.json", BASE)
    cand = write(tmp_path / "cand.json", [v * 1.01 for v in BASE])  # 1% better: a pass
    assert gate(base, cand) == 0
    assert "baseline updated" in capsys.readouterr().out
    assert load_samples([base]).metrics == load_samples([cand]).metrics


def test_a_regression_or_inconclusive_run_leaves_it_and_says_why(tmp_path, capsys):
    base = write(tmp_path / "main.json", BASE)
    before = base.read_bytes()
    worse = write(tmp_path / "worse.json", [v * 0.85 for v in BASE])
    assert gate(base, worse) == 1
    assert "baseline not updated: the verdict is regression" in capsys.readouterr().err
    noisy = write(tmp_path / "noisy.json", [14.0, 26.0])  # two wild replicates: inconclusive
    assert gate(base, noisy) == 4
    assert "baseline not updated: the verdict is inconclusive" in capsys.readouterr().err
    assert base.read_bytes() == before


def test_only_one_committed_baseline_file_can_be_refreshed(tmp_path, capsys):
    base = write(tmp_path / "main.json", BASE)
    other = write(tmp_path / "other.json", BASE)
    assert gate(base, base, "--baseline", str(other)) == 2
    assert "exactly one --baseline" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    doc = {"kind": "capacity", "schema_version": 1, "manifest": {"workload_name": "tiny", "slo": SLO}, "probes": [],
           "replicates": []}
    (run / "capacity.json").write_text(json.dumps(doc))
    before = (run / "capacity.json").read_bytes()
    assert gate(run / "capacity.json", base) == 2
    assert "not a baseline file" in capsys.readouterr().err
    assert (run / "capacity.json").read_bytes() == before
