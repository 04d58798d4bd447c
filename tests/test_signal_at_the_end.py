"""A signal at any point from a run's first send to its last file written ends it one way: exit 130, every
file whole (requests.jsonl, requests.parquet, summary.json marked interrupted), no `.tmp` left. The signal is
sent by the `slobench run` process to itself from inside the stage under test (a patched function), so each
stage is hit every time, whatever the machine's speed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slobench.run.columnar import PARQUET
from slobench.run.records import REQUESTS, read_record_dicts
from slobench.run.rundir import SUMMARY
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration

# Runs `slobench run` with one function patched to signal the process, then go on as it would.
DRIVER = """
import os, signal, sys
import slobench.run.runner, slobench.run.columnar, slobench.run.rundir, slobench.load_setup
stage, signame, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
owner, name = {
    "warmup-cut": (slobench.run.runner, "_cut_warmup"),
    "jsonl-rewrite": (slobench.run.rundir, "write_records"),  # requests.jsonl.tmp being written
    "summarize": (slobench.run.runner, "summarize"),
    "parquet": (slobench.run.columnar.ParquetLog, "close"),
    "summary.json": (slobench.run.rundir, "write_summary"),
    "after-run": (slobench.load_setup.LoadSetup, "note_refusals"),
}[stage]
original = getattr(owner, name)
def fire(*a, **k):
    os.kill(os.getpid(), getattr(signal, signame))
    return original(*a, **k)
setattr(owner, name, fire)
from slobench.cli import main
sys.exit(main(argv))
"""

STAGES = ("warmup-cut", "jsonl-rewrite", "summarize", "parquet", "summary.json", "after-run")


@pytest.fixture(scope="module")
def server() -> Iterator[TokenServerProcess]:
    with TokenServerProcess(ttft_ms=5, itl_ms=1) as srv:
        yield srv


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_signal_after_the_last_send_still_writes_every_file(server: TokenServerProcess, tmp_path: Path,
                                                              stage: str, signame: str) -> None:
    out = tmp_path / "run"
    argv = ["run", "--url", server.base_url, "--workload", "tiny", "--input-len", "8", "--output-len", "4",
            "--rate", "200", "--num-requests", "30", "--warmup", "auto", "--out", str(out), "--no-progress",
            "--scrape-interval", "0"]
    proc = subprocess.run([sys.executable, "-c", DRIVER, stage, signame, *argv], capture_output=True, timeout=120,
                          cwd=tmp_path)
    err = proc.stderr.decode()[-2000:]
    assert proc.returncode == 130, (proc.returncode, -getattr(signal, signame), err)
    assert "interrupted" in err
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["interrupted"] is True, err
    rows = read_record_dicts(out / REQUESTS)
    assert len(rows) == 30
    assert summary["num_requests"] == sum(not r.get("is_warmup") for r in rows) > 0  # the file and summary agree
    assert (out / PARQUET).exists(), sorted(p.name for p in out.iterdir())
    assert not list(out.glob("*.tmp")), sorted(p.name for p in out.iterdir())
    # the directory reads back as any finished run does: summarize agrees with it
    again = subprocess.run([sys.executable, "-m", "slobench", "summarize", str(out)], capture_output=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
