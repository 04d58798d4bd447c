"""`slobench tune` with real servers in child processes: the bundled engine, servers that never become
ready, exit at once or exit mid-run, Ctrl-C, --resume; nothing left running after any of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from slobench.run.rundir import read_capacity

SEARCH = ["--workload", "tiny", "--slo", "ttft=200ms,tpot=50ms", "--replicates", "3", "--num-requests", "48",
          "--capacity-args", "--tolerance 0.3"]

FAKE_SERVER = '''
import http.server, os, subprocess, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "midrun":  # a helper process that shrugs off SIGTERM: only SIGKILL to the group ends it
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
if mode == "never":
    time.sleep(3600)
if mode == "exit":
    print("boom: this server cannot start", flush=True)
    sys.exit(3)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # /health and /v1/models answer (either may be the readiness probe, in either order)
        body = b'{"object": "list", "data": [{"id": "fake", "object": "model"}]}' if self.path == "/v1/models" else b""
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # the measurement's first request
        print("dying mid-run", flush=True)
        os._exit(7)

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def processes_marked(mark: str) -> list[int]:
    """Processes alive (not zombies) whose environment holds `mark`: the tune's children inherit it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in env and state != "Z":
            found.append(int(entry.name))
    return found


def start_tune(args: list[str], mark: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SLOBENCH_TUNE_TEST_MARK": mark}
    return subprocess.Popen([sys.executable, "-m", "slobench", "tune", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def finish(proc: subprocess.Popen[str], mark: str) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200] for pid in processes_marked(mark)}
    assert left == {}, "a server or search outlived the tune"
    return proc.returncode, out, err


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
def test_servers_that_fail_are_rows_and_the_tune_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    out = tmp_path / "tune"
    mark = uuid.uuid4().hex
    proc = start_tune(["--serve-cmd", f"{sys.executable} {script} {{mode}} {{port}}", "--param",
                       "mode=never,exit,midrun", "--ready-timeout", "2", "--stop-grace", "1", "--out", str(out),
                       *SEARCH], mark)
    code, stdout, stderr = finish(proc, mark)
    assert code == 4, stderr  # no configuration measured
    doc = json.loads((out / "tune.json").read_text())
    rows = {r["params"]["mode"]: r for r in doc["configs"]}
    assert {r["status"] for r in rows.values()} == {"failed"}
    assert "not ready within --ready-timeout 2 s" in rows["never"]["reason"]
    assert "exited (code 3) before it was ready" in rows["exit"]["reason"]
    assert any("boom" in line for line in rows["exit"]["log_tail"])
    assert "mid-measurement" in rows["midrun"]["reason"]
    assert any("dying mid-run" in line for line in rows["midrun"]["log_tail"])
    assert doc["best"] is None and doc["schema_version"] == 1
    assert "boom" in stdout  # the table shows each failure's log


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_server_keeps_the_rows_exit_130(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "tune"
    mark = uuid.uuid4().hex
    proc = start_tune(["--param", "max_num_seqs=16,32", "--out", str(out), "--stop-grace", "5", *SEARCH], mark)
    assert proc.stderr is not None
    for line in proc.stderr:  # the first server answered: its search has begun
        if "ready after" in line:
            break
    else:
        pytest.fail("the tune ended before its first server was ready")
    proc.send_signal(sig)
    code, _, stderr = finish(proc, mark)
    assert code == 130, stderr
    doc = json.loads((out / "tune.json").read_text())
    assert [r["status"] for r in doc["configs"]] == ["interrupted"]
    assert doc["configs"][0]["params"] == {"max_num_seqs": 16}
    assert (out / "max_num_seqs-16" / "server.log").exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
def test_bundled_engine_live_four_configurations_the_larger_batch_wins(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    mark = uuid.uuid4().hex
    short = ["--workload", "tiny", "--slo", "ttft=200ms,tpot=50ms", "--replicates", "2", "--num-requests", "8",
             "--capacity-args", "--tolerance 0.5 --start-rate 8 --max-probes 3"]
    proc = start_tune(["--param", "max_num_seqs=1,16", "--param", "block_size=16,32", "--out", str(out), *short],
                      mark)
    code, stdout, stderr = finish(proc, mark)
    assert code == 0, stderr
    doc = json.loads((out / "tune.json").read_text())
    assert len(doc["configs"]) == 4
    assert doc["best"]["max_num_seqs"] == 16  # one request at a time carries far less within the SLO
    for row in doc["configs"]:
        if row["params"]["max_num_seqs"] == 1 and row["status"] == "measured":
            assert row["capacity"]["capacity_rps"] < min(
                r["capacity"]["capacity_rps"] for r in doc["configs"] if r["params"]["max_num_seqs"] == 16)
    best = next(r for r in doc["configs"] if r["params"] == doc["best"])
    assert best["status"] == "measured"
    cap = read_capacity(out / best["capacity_dir"])  # what `slobench capacity` wrote, read by its reader
    assert cap["capacity_rps"] == best["capacity"]["capacity_rps"]
    assert best["ready_s"] is not None and (out / best["server_log"]).stat().st_size > 0
    assert "--max-num-seqs 16" in best["command_line"]
    assert "--max-num-seqs 16" in stdout.split("command:")[1]  # the winner's command under the table


def test_simulate_ranks_four_configurations_and_resume_keeps_them(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    args = ["--simulate", "--param", "max_num_seqs=1,16", "--param", "kv_blocks=16,2048", "--out", str(out), *SEARCH]
    first = subprocess.run([sys.executable, "-m", "slobench", "tune", *args], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    doc = json.loads((out / "tune.json").read_text())
    assert doc["best"] == {"max_num_seqs": 16, "kv_blocks": 2048}
    assert len(doc["configs"]) == 4
    best = next(r for r in doc["configs"] if r["params"] == doc["best"])
    assert best["status"] == "simulated" and best["capacity"] is None
    low, high = best["simulated_capacity"]["interval_rps"]
    assert low <= best["simulated_capacity"]["capacity_rps"] <= high
    assert first.stdout.splitlines()[1].split()[1:3] == ["max_num_seqs=16", "kv_blocks=2048"]  # first row

    again = subprocess.run([sys.executable, "-m", "slobench", "tune", *args], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr  # a finished tune is never overwritten
    other = subprocess.run([sys.executable, "-m", "slobench", "tune", *args, "--resume", "--seed", "7"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "other settings" in other.stderr  # rows of another search never mixed
    stamp = (out / best["capacity_dir"] / "capacity.json").stat().st_mtime_ns
    resumed = subprocess.run([sys.executable, "-m", "slobench", "tune", *args, "--resume"], capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    finished = [r for r in doc["configs"] if r["status"] in ("simulated", "inconclusive")]
    assert resumed.stderr.count("kept (--resume)") == len(finished)
    assert (out / best["capacity_dir"] / "capacity.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "tune.json").read_text())["best"] == doc["best"]
