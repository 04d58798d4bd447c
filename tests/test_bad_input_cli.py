"""Issue 13 item 10: bad input is exit 2 with one line that names it, never a traceback, never a wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main

URL = ["--url", "http://127.0.0.1:9/v1", "--model", "m"]  # nothing listens there: input is checked first


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "list.toml").write_text("[slo]\nttft = [1]\n")
    (tmp_path / "bool.toml").write_text("ttft = true\n")
    (tmp_path / "scalar.toml").write_text("slo = 3\n")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workload", "{d}/bin.toml"], "not UTF-8"),
        (["--workload", "{d}/dir.toml"], "is a directory"),
        (["--slo", "{d}/bin.toml"], "not UTF-8"),
        (["--slo", "{d}/dir.toml"], "cannot read SLO file"),
        (["--slo", "{d}/list.toml"], "slo.ttft"),
        (["--slo", "{d}/bool.toml"], "slo.ttft"),
        (["--slo", "{d}/scalar.toml"], "must be a table"),
        (["--slo", "ttft=1s,ttft=2s"], "given twice"),
        (["--scrape-interval", "nan"], "--scrape-interval"),
        (["--scrape-interval", "-1"], "--scrape-interval"),
        (["--rate", "1e-300"], "--rate"),
        (["--concurrency", "2", "--max-in-flight", "3"], "exclude each other"),
    ],
)
def test_bad_run_input_is_exit_2_with_one_line(files: Path, argv: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", *URL, *(a.format(d=files) for a in argv), "--out", str(files / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and needle in err[0], err
    assert not (files / "r").exists()


@pytest.mark.parametrize("flag", [["--simulate"], ["--engine", "modeled"]])
def test_an_in_process_engine_with_a_url_is_exit_2(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *flag, "--url", "http://127.0.0.1:9/v1", "--workload", "tiny"]) == 2
    assert "--url would be ignored" in capsys.readouterr().err


def test_summarize_names_the_bad_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    assert main(["run", "--simulate", "--workload", "tiny", "--num-requests", "5", "--rate", "5", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    lines = (run / "requests.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["scheduled_s"] = "x"
    (run / "requests.jsonl").write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    assert main(["summarize", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "requests.parquet: written beside a requests.jsonl of" in err[0]  # the edit made it stale: not read
    assert len(err) == 2 and "record 3: scheduled_s must be a finite number" in err[1]


@pytest.mark.parametrize("where", ["dir", "unwritable"])
def test_report_into_a_directory_or_nowhere_is_exit_2(tmp_path: Path, where: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    assert main(["run", "--simulate", "--workload", "tiny", "--num-requests", "5", "--rate", "5", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    (tmp_path / "f").write_text("a file")
    out = tmp_path if where == "dir" else tmp_path / "f" / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report -o" in err[0]
