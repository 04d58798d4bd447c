"""One configuration's capacity search: `slobench capacity` run as a child process, its capacity.json
read back through the run-directory reader. Tune depends on the search's command line and its file,
never on its internals, and each configuration's directory is exactly what `slobench capacity` writes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slobench.errors import SlobenchError, UsageError
from slobench.run.rundir import read_capacity
from slobench.tune.server_proc import ServerFailed, ServerRun, interrupts_held, log_tail, spawn, stop_group

SEARCH_LOG = "capacity.log"
# capacity's exits that leave a capacity.json to read: found (0), SLO missed at every rate (1), inconclusive (4)
READ_EXITS = (0, 1, 4)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What one search found: a capacity with its interval, or the reason there is none."""

    capacity: dict[str, Any] | None
    reason: str | None
    log_tail: list[str]


def capacity_argv(out_dir: Path, *, url: str | None, knob_flags: list[str], passed: list[str]) -> list[str]:
    target = ["--url", url] if url is not None else ["--simulate", *knob_flags]
    return [sys.executable, "-m", "slobench", "capacity", *target, *passed, "--out", str(out_dir),
            "--overwrite", "--no-progress"]


def check_capacity_flags(passed: list[str], *, simulate: bool) -> None:
    """The flags every configuration's search gets, checked by `slobench capacity --check-only` once, before
    any server starts: one capacity refuses would otherwise show only after each server's ready wait."""
    target = ["--simulate"] if simulate else ["--url", "http://127.0.0.1:9/v1"]  # (never contacted)
    argv = [sys.executable, "-m", "slobench", "capacity", *target, *passed, "--check-only"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise UsageError(f"the capacity search's flags: {said[-1] if said else f'exit {done.returncode}'}")


def capacity_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The search's capacity and interval, each seed's own crossing (there even when the interval was too
    wide for a capacity: what a guided tune ranks such a simulation by), and the search's notes (a client
    that was the bottleneck, probes too short), which the tune's table repeats."""
    crossings = [float(r["capacity_rps"]) for r in doc.get("replicates") or [] if r.get("capacity_rps") is not None]
    return {"capacity_rps": doc.get("capacity_rps"), "interval_rps": doc.get("interval_rps"),
            "level": doc.get("level"), "is_lower_bound": doc.get("is_lower_bound", False),
            "seed_crossings_rps": crossings, "notes": [str(n) for n in doc.get("notes") or []]}


def run_search(argv: list[str], out_dir: Path, log_dir: Path, *, server: ServerRun | None,
               grace_s: float, log_name: str = SEARCH_LOG) -> SearchResult:
    """The search to its end. ServerFailed when the server exits meanwhile; on KeyboardInterrupt the search's
    process group is stopped before the interrupt goes on."""
    log_path = log_dir / log_name
    returncode = run_child(argv, log_path, server=server, grace_s=grace_s)
    tail = log_tail(log_path)
    if returncode not in READ_EXITS:
        return SearchResult(None, f"slobench capacity exited {returncode} (log: {log_path})", tail)
    try:
        doc = read_capacity(out_dir)
    except (SlobenchError, OSError) as e:
        return SearchResult(None, f"capacity.json unreadable: {e}", tail)
    reason = doc.get("inconclusive") or (None if doc.get("capacity_rps") is not None else
                                         "; ".join(doc.get("notes") or []) or "no capacity found")
    return SearchResult(capacity_of(doc), str(reason) if reason else None, tail)


def run_child(argv: list[str], log_path: Path, *, server: ServerRun | None, grace_s: float) -> int:
    """A slobench child process to its end, its output in `log_path`; its exit status. ServerFailed when the
    server exits meanwhile; on KeyboardInterrupt the child's process group is stopped before the interrupt
    goes on."""
    proc: subprocess.Popen[bytes] | None = None
    try:
        with interrupts_held():
            proc = spawn(argv, log_path)
        while proc.poll() is None:
            if server is not None and server.proc.poll() is not None:
                with interrupts_held():
                    stop_group(proc, grace_s)
                raise server.failed(f"the server exited (code {server.proc.returncode}) mid-measurement")
            try:
                proc.wait(timeout=0.2)  # wakes at the search's end, or to look at the server again
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        if proc is not None:
            with interrupts_held():  # a second Ctrl-C waits for the search's group to be gone
                stop_group(proc, grace_s)
        raise
    if server is not None and server.proc.poll() is not None:
        raise server.failed(f"the server exited (code {server.proc.returncode}) mid-measurement")
    return int(proc.returncode)


def wait_ready(server: ServerRun, timeout_s: float, name: str) -> float:
    """The server's readiness, with a progress line on stderr at most every 5 s: elapsed, its last log line."""
    last = [0.0]

    def progress(elapsed_s: float, line: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 5.0:
            last[0] = now
            print(f"  {name}: waiting for the server, {elapsed_s:.0f} s  | {line[:100]}", file=sys.stderr)

    return server.wait_ready(timeout_s, progress)


__all__ = ["SEARCH_LOG", "SearchResult", "ServerFailed", "capacity_argv", "run_child", "run_search", "wait_ready"]
