"""`--out` never mixes two runs (issue 13, item 3): an existing run, sweep or search is refused with exit 2
and one line, before anything is sent, unless --overwrite, which replaces only slobench's own files."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.run.outdir import claim_out_dir, new_out_dir


def test_a_new_or_empty_directory_is_claimed(tmp_path: Path) -> None:
    # checked writable, and nothing left behind until the run starts (a run that fails to start leaves no folder)
    assert claim_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and not (tmp_path / "a").exists()
    (tmp_path / "empty").mkdir()
    assert claim_out_dir(tmp_path / "empty") == tmp_path / "empty"


@pytest.mark.parametrize("layout", [["manifest.json"], ["requests.jsonl"], ["sweep.json"], ["capacity.json"],
                                    ["rate-4/manifest.json"]])
def test_an_earlier_run_is_refused_then_replaced_with_overwrite(tmp_path: Path, layout: list[str]) -> None:
    out = tmp_path / "run"
    for rel in layout:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("{}")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="already holds a slobench run.*--overwrite"):
        claim_out_dir(out)
    claim_out_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # only slobench's files went


def test_a_file_or_a_path_under_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        claim_out_dir(f)
    with pytest.raises(UsageError, match="cannot write there"):
        claim_out_dir(f / "run")


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on: a request would be exit 3, not 2
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_cli_refuses_an_existing_run_before_any_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    argv = ["run", "--simulate", "--workload", "tiny", "--rate", "5", "--num-requests", "20", "--out", str(out)]
    assert main(argv) in (0, 1)
    first = json.loads((out / "manifest.json").read_text())
    capsys.readouterr()

    for verb_argv in (["run", "--url", _dead_url(), "--model", "m"], ["sweep", "--url", _dead_url(), "--model", "m",
                                                                     "--rates", "1,2"]):
        rc = main([*verb_argv, "--workload", "tiny", "--num-requests", "5", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "--overwrite" in err, err

    assert main([*argv, "--overwrite", "--seed", "7"]) in (0, 1)
    second = json.loads((out / "manifest.json").read_text())
    assert first["seed"] == 0 and second["seed"] == 7
    rows = (out / "requests.jsonl").read_text().splitlines()
    assert len(rows) == 20  # the old run's records are gone, not appended to


def test_overwrite_never_replaces_a_folder_of_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("run-20261203-100000", "sweep-20261203-100001/rate-4"):
        (runs / name).mkdir(parents=True)
        (runs / name / "manifest.json").write_text("{}")
    for overwrite in (False, True):
        with pytest.raises(UsageError, match=r"holds 2 other run\(s\).*never a folder of runs"):
            claim_out_dir(runs, overwrite=overwrite)
    assert (runs / "run-20261203-100000" / "manifest.json").exists()
    assert (runs / "sweep-20261203-100001" / "rate-4" / "manifest.json").exists()


def test_overwrite_replaces_a_search_with_its_probe_folders(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    (out / "probe-00-rate-2-seed-0").mkdir(parents=True)
    (out / "probe-00-rate-2-seed-0" / "requests.jsonl").write_text("")
    (out / "capacity.json").write_text("{}")
    claim_out_dir(out, overwrite=True)
    assert list(out.iterdir()) == []


def test_default_names_claimed_at_once_are_all_different(tmp_path: Path) -> None:
    # the same stamp from eight threads released together: an exclusive mkdir gives each its own directory
    barrier = threading.Barrier(8)

    def claim(_: int) -> Path:
        barrier.wait()
        return new_out_dir("run", tmp_path / "runs", stamp="20261203-100000")

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(claim, range(8)))
    assert len(set(got)) == 8 and all(p.is_dir() for p in got)
    assert sorted(p.name for p in got)[:2] == ["run-20261203-100000", "run-20261203-100000-2"]


def test_two_cli_runs_in_the_same_second_get_two_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261203-100000")  # the clock does not move
    argv = ["run", "--simulate", "--workload", "tiny", "--rate", "5", "--num-requests", "6", "--no-progress"]
    assert main([*argv, "--seed", "1"]) in (0, 1) and main([*argv, "--seed", "2"]) in (0, 1)
    dirs = sorted((tmp_path / "runs").iterdir())
    assert [d.name for d in dirs] == ["run-20261203-100000", "run-20261203-100000-2"]
    assert [json.loads((d / "manifest.json").read_text())["seed"] for d in dirs] == [1, 2]
    assert [len((d / "requests.jsonl").read_text().splitlines()) for d in dirs] == [6, 6]


def test_a_default_run_that_fails_to_start_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--url", _dead_url(), "--model", "m", "--workload", "tiny", "--num-requests", "5"]) == 3
    assert list((tmp_path / "runs").iterdir()) == []
