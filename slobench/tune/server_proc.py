"""One server of a tune: started in its own process group, its output in a log file, waited for until it
answers, stopped whole (the group: SIGTERM, then SIGKILL after a grace period), its port seen free after.

A server that exits before it is ready, or never answers within the ready timeout, is a `ServerFailed`
carrying the reason and the last lines of its log: the tune records it and goes on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

READY_PATHS = ("/health", "/v1/models")  # the bundled engine, vLLM, SGLang and llama.cpp answer one of these
LOG_TAIL_LINES = 20


class ServerFailed(Exception):
    """The server did not start, or exited: `reason` says which, `log_tail` is its last lines."""

    def __init__(self, reason: str, log_tail: list[str]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, read from /proc; where there is no /proc,
    the group's leader alone if signal 0 reaches the group."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_group_gone(proc: subprocess.Popen[bytes], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    delay_s = 0.01
    while True:
        proc.poll()  # reap the leader, or it lingers as a zombie
        if not group_members(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay_s)  # polling a process group: the kernel offers no wait on a whole group
        delay_s = min(delay_s * 2, 0.2)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace_s`; the leader reaped."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the leader's pid is the group's id
        except ProcessLookupError:
            break
        if wait_group_gone(proc, wait_s):
            break
    try:
        proc.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        print(f"slobench: warning: process {proc.pid} still running after SIGKILL", file=sys.stderr)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends, then raised as KeyboardInterrupt: an interrupt
    landing between the fork and the caller holding the child's handle would orphan the child."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        raise KeyboardInterrupt


def spawn(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`argv` in a new session (its own process group, out of reach of the terminal's Ctrl-C: the tune stops
    it), stdout and stderr appended to `log_path`. Call it inside `interrupts_held`, and hold the handle
    before the block ends."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ServerRun:
    """A started server: `wait_ready`, `check_alive` while it is measured, `stop` (always)."""

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, *, host: str = "127.0.0.1",
                 grace_s: float = 30.0) -> None:
        self.port = port
        self.host = host
        self.log_path = log_path
        self.grace_s = grace_s
        self.proc = spawn(argv, log_path)

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def failed(self, reason: str) -> ServerFailed:
        return ServerFailed(reason, log_tail(self.log_path))

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise self.failed(f"the server exited (code {code})")

    def wait_ready(self, timeout_s: float, progress: Callable[[float, str], None] | None = None) -> float:
        """Seconds until the server answered one of READY_PATHS; ServerFailed if it exits or the timeout
        passes first. Polls with a growing delay (0.05 s to 2 s), reporting elapsed time and the log's last
        line."""
        start = time.monotonic()
        delay_s = 0.05
        while True:
            elapsed_s = time.monotonic() - start
            code = self.proc.poll()
            if code is not None:
                raise self.failed(f"the server exited (code {code}) before it was ready, after {elapsed_s:.1f} s")
            if any(answers(self.root_url + p) for p in READY_PATHS):
                return elapsed_s
            if elapsed_s >= timeout_s:
                raise self.failed(f"not ready within --ready-timeout {timeout_s:g} s (no answer on "
                                  f"{' or '.join(READY_PATHS)} at port {self.port})")
            if progress is not None:
                tail = log_tail(self.log_path, 1)
                progress(elapsed_s, tail[-1] if tail else "")
            time.sleep(min(delay_s, max(0.0, timeout_s - elapsed_s)))  # a poll's backoff, not a wait for a result
            delay_s = min(delay_s * 1.5, 2.0)

    def stop(self, port_timeout_s: float = 30.0) -> None:
        stop_group(self.proc, self.grace_s)
        deadline = time.monotonic() + port_timeout_s
        while not port_is_free(self.port, self.host):
            if time.monotonic() > deadline:
                print(f"slobench: warning: port {self.port} still taken {port_timeout_s:g} s after the server "
                      f"stopped", file=sys.stderr)
                return
            time.sleep(0.1)  # a poll of the port, not a wait for a result
