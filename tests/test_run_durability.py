"""A run killed mid-way keeps what it finished (issue 13, item 2): every finished request is in
requests.jsonl at once, so SIGKILL loses only the requests in flight; SIGTERM ends the run as Ctrl-C does,
with summary.json written. The client is a real `slobench run` process; waits are bounded polls."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slobench.run.records import REQUESTS, read_record_dicts
from slobench.run.rundir import SUMMARY
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration

POLL_S = 0.02
DEADLINE_S = 60.0
SLACK = 20  # requests the server has ended that the client may not have read yet (1 s at 20 req/s)


@pytest.fixture(scope="module")
def server() -> Iterator[TokenServerProcess]:
    with TokenServerProcess(ttft_ms=20, itl_ms=2, log=True) as srv:  # the log: a line per request it ended
        yield srv


def start_run(server: TokenServerProcess, out: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "slobench", "run", "--url", server.base_url, "--workload", "tiny",
            "--input-len", "8", "--output-len", "8", "--rate", "20", "--num-requests", "4000",
            "--out", str(out), "--no-progress", "--scrape-interval", "0"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def poll(proc: subprocess.Popen[bytes], count: Callable[[], int], n: int, what: str) -> int:
    """count() once it reaches n; fails after DEADLINE_S or if the run ends first."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early: {proc.stderr.read().decode() if proc.stderr else ''}"
        if (got := count()) >= n:
            return got
        time.sleep(POLL_S)  # a bounded poll of state on disk
    pytest.fail(f"fewer than {n} {what} after {DEADLINE_S} s")


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_sigkill_loses_no_finished_request(server: TokenServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    before = len(server.read_log())
    proc = start_run(server, out)
    try:
        # By the time the server has ended 60 of this run's requests, the client has recorded all but the
        # few still on their way (through a 64 KiB buffer the file was empty until ~140 had finished).
        poll(proc, lambda: len(server.read_log()) - before, 60, "requests ended by the server")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    ended_by_server = len(server.read_log()) - before
    rows = read_record_dicts(out / REQUESTS)
    assert len(rows) >= ended_by_server - SLACK, (len(rows), ended_by_server)
    assert len({r["request_id"] for r in rows}) == len(rows)
    assert all(r["status"] == "ok" for r in rows)


def test_sigterm_finishes_like_ctrl_c(server: TokenServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_run(server, out)
    try:
        poll(proc, lambda: lines_in(out / REQUESTS), 20, "records in requests.jsonl")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode != -signal.SIGTERM, "killed by SIGTERM instead of finishing the run"
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["interrupted"] is True, err.decode()[-2000:]
    rows = read_record_dicts(out / REQUESTS)
    assert summary["num_requests"] == len(rows) >= 20  # every request sent is in the file, in-flight ones cancelled
    assert {r["status"] for r in rows} <= {"ok", "cancelled"}
