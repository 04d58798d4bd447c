"""Every file a user or a repository supplies is opened one way (`slobench.input_file`): a regular file once
symlinks are resolved, within its kind's cap named in the message, opened without blocking. A baseline
committed as a symlink to /dev/zero, a FIFO in a run directory or in place of a workload or trace, and a
directory are refused by name (exit 2) at once, without reading a byte of them. The checks that could hang
or fill memory on a reader without these rules run in a child process, bounded in time and memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from slobench.ci_action import run_action
from slobench.errors import UsageError
from slobench.gate import Samples
from slobench.history.record import append_entry
from slobench.input_file import InputKind, read_input_bytes
from slobench.report.synthetic import synthetic_records
from slobench.run import rundir
from slobench.run.columnar import PARQUET
from slobench.run.records import REQUESTS
from slobench.run.rundir import RunWriter, read_json

MEMORY_LIMIT = 3 << 30  # address space for the child: a reader of /dev/zero runs out at this, not at RAM's end


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def slobench(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`slobench ARGV` in a child process, bounded: 60 s (a FIFO read by name never returns) and
    MEMORY_LIMIT of address space."""
    return subprocess.run([sys.executable, "-m", "slobench", *argv], capture_output=True, text=True, timeout=60,
                          cwd=cwd, preexec_fn=_limited)


def _run_dir(path: Path) -> Path:
    w = RunWriter(path, {"seed": 1})
    for r in synthetic_records(4, 40, capacity_rps=10, seed=1):
        w.write(r)
    w.finish({})
    return path


def test_a_baseline_symlinked_to_dev_zero_is_refused_by_name(tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    base.symlink_to("/dev/zero")  # what a pull request can commit: git stores symlinks
    cand = tmp_path / "cand.json"
    s = Samples("x", {"name": "tiny", "hash": "abc"}, None, "0.1.0")
    for seed in (1, 2, 3):
        s.add("capacity", seed, 10.0, "x")
    cand.write_text(json.dumps(s.to_baseline()))
    got = slobench("gate", "--baseline", str(base), "--candidate", str(cand), cwd=tmp_path)
    assert got.returncode == 2, got.stderr
    assert "a symlink to /dev/zero" in got.stderr and "character device, not a regular file" in got.stderr
    assert "out of memory" not in got.stderr


def test_a_fifo_named_requests_parquet_does_not_hang_summarize(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    (run / PARQUET).unlink()
    os.mkfifo(run / PARQUET)
    got = slobench("summarize", str(run), cwd=tmp_path)  # from requests.jsonl, with a note naming the FIFO
    assert got.returncode == 0, got.stderr
    assert f"{PARQUET}: is a FIFO (named pipe), not a regular file" in got.stderr
    assert f"reading {REQUESTS}" in got.stderr


@pytest.mark.parametrize("what", ["workload", "trace", "slo"])
def test_a_fifo_in_place_of_an_input_file_is_refused_by_name(tmp_path: Path, what: str) -> None:
    fifo = tmp_path / ("w.toml" if what != "trace" else "t.jsonl")
    os.mkfifo(fifo)
    argv = {"workload": ["workload", "show", str(fifo)], "trace": ["workload", "show", str(fifo)],
            "slo": ["summarize", str(_run_dir(tmp_path / "run")), "--slo", str(fifo)]}[what]
    got = slobench(*argv, cwd=tmp_path)
    assert got.returncode == 2, got.stderr
    assert "is a FIFO (named pipe), not a regular file" in got.stderr


def test_a_directory_in_place_of_summary_json_is_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    (run / "summary.json").unlink()
    (run / "summary.json").mkdir()
    with pytest.raises(UsageError, match=r"summary.json is a directory, not a regular file"):
        rundir.read_summary(run)


def test_an_oversized_file_is_refused_with_its_cap_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "baseline.json"
    doc.write_text(json.dumps({"kind": "baseline", "pad": "x" * 5000}))
    monkeypatch.setattr(rundir, "JSON_DOC", InputKind("JSON result file", 4096))
    with pytest.raises(UsageError, match=r"baseline.json: 5,0\d\d bytes, over the 4,096 bytes a JSON result file "
                                         r"may hold; not read"):
        read_json(doc)


def test_a_file_larger_than_it_says_is_held_to_the_cap() -> None:
    # /proc files report a size of 0: the reader still stops one byte past the cap
    with pytest.raises(UsageError, match=r"over the 100 bytes a status file may hold"):
        read_input_bytes("/proc/self/status", InputKind("status file", 100))
    assert b"Name:" in read_input_bytes("/proc/self/status", InputKind("status file", 1 << 20))


def test_a_history_file_symlinked_to_a_device_is_refused_not_written_into(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.symlink_to("/dev/null")  # appending "succeeded" and kept nothing
    with pytest.raises(UsageError, match=r"a symlink to /dev/null\) is a character device, not a regular file"):
        append_entry(history, {"schema": 1})


def test_the_ci_action_refuses_a_baseline_symlinked_to_a_device_before_any_search(tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    base.symlink_to("/dev/zero")
    env = {"INPUT_SLO": "ttft=500ms", "INPUT_BASELINE": str(base), "INPUT_OUT_DIR": str(tmp_path / "ci"),
           "INPUT_URL": "http://127.0.0.1:9/v1"}  # nothing listens there: a search would be exit 3, not this
    with pytest.raises(UsageError, match=r"a symlink to /dev/zero\) is a character device, not a regular file"):
        run_action(env)
