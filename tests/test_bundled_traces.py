"""The sample traces that ship inside the package: named without a path from `--trace`, with their license.

The full Azure traces stay outside the repository; these slices let every trace example in the guides run
offline (`.ci/wheel-check.sh` runs one from an installed wheel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.workload import load_trace
from slobench.workload.bundled import TRACES_DIR, list_traces, package_files, trace_path

SAMPLES = {"azure-code-sample": 781, "azure-conv-sample": 1445}  # rows: the first 300 s of each trace


def test_the_samples_are_small_azure_slices_with_their_license_beside_them() -> None:
    assert list_traces() == sorted(SAMPLES)
    total = 0
    for name, rows in SAMPLES.items():
        trace = load_trace(name)
        assert trace.format == "azure" and trace.num_rows == rows and not trace.problems
        assert float(trace.arrival_s[-1]) < 300.0
        total += trace_path(name).stat().st_size
    assert total < 200_000
    license_text = (TRACES_DIR / "LICENSE.CC-BY-4.0.txt").read_text(encoding="utf-8-sig")
    assert license_text.startswith("Attribution 4.0 International")
    notice = (TRACES_DIR / "README.md").read_text()
    assert "CC-BY-4.0" in notice and "Splitwise" in notice and "ISCA 2024" in notice
    assert {TRACES_DIR / "README.md", TRACES_DIR / "LICENSE.CC-BY-4.0.txt"} <= set(package_files())


def test_a_file_in_the_working_folder_wins_over_a_sample_of_its_name(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert trace_path("azure-code-sample") == TRACES_DIR / "azure-code-sample.csv"
    (tmp_path / "azure-code-sample").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert trace_path("azure-code-sample") == Path("azure-code-sample")
    assert trace_path("./no-such-sample") == Path("./no-such-sample")


def test_run_simulate_replays_a_sample_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # nothing of the checkout in the working folder
    out = tmp_path / "r"
    rc = main(["run", "--simulate", "--trace", "azure-conv-sample", "--num-requests", "40",
               "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 40
    manifest = json.loads((out / "manifest.json").read_text())
    assert Path(manifest["workload"]["trace"]["path"]) == TRACES_DIR / "azure-conv-sample.csv"


def test_an_unknown_name_is_exit_2_naming_the_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "--simulate", "--trace", "azure-sample", "--num-requests", "5", "--out", str(tmp_path / "r"),
               "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "azure-sample: trace file not found" in err and "azure-code-sample, azure-conv-sample" in err
    assert not (tmp_path / "r").exists()  # refused before the run directory was made


def test_workload_show_and_plan_take_a_sample_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["workload", "show", "azure-code-sample"]) == 0
    assert "azure, 781 requests from 781 rows" in capsys.readouterr().out
    # plan checks its traces exist before it starts: a sample's name passes that check
    rc = main(["plan", "--trace", "azure-code-sample", "--trace", "nope", "--slo", "ttft=500ms,tpot=40ms",
               "--window", "1m"])
    assert rc == 2 and "--trace nope: no such file" in capsys.readouterr().err
