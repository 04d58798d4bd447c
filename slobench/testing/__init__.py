"""Test helpers shipped with slobench: a scheduled-token OpenAI-compatible server and a way to run it.

`TokenServerProcess` runs `python -m slobench.testing.token_server` in a child process (its own core and
event loop, like a real server) and waits for its `LISTENING <port>` line with a bounded deadline.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["TokenServerProcess"]


class TokenServerProcess:
    """Start with `with TokenServerProcess(ttft_ms=50, itl_ms=5) as srv: srv.base_url ...`.

    `log=True` gives the server a per-request log in a temporary file; `read_log()` returns its lines.
    """

    def __init__(
        self,
        *,
        ttft_ms: float = 50.0,
        itl_ms: float = 5.0,
        model: str = "test-model",
        serve_models: bool = True,
        log: bool | str | Path = False,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 15.0,
    ) -> None:
        self.host = host
        self.model = model
        # stderr goes to a file, not a pipe nobody drains, so a chatty server can never block on it.
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = tempfile.TemporaryDirectory(
            prefix="slobench-token-server-"
        )
        self._stderr_path = Path(self._tmpdir.name) / "stderr.txt"
        if log is True:
            self.log_path: Path | None = Path(self._tmpdir.name) / "server.jsonl"
        else:
            self.log_path = Path(log) if log else None
        self._args = [
            sys.executable, "-m", "slobench.testing.token_server",
            "--host", host, "--port", "0",
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--model", model,
        ]  # fmt: skip
        if not serve_models:
            self._args.append("--no-models")
        if self.log_path is not None:
            self._args += ["--log", str(self.log_path)]
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> TokenServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self._stderr_path, "wb") as err:
            self._proc = subprocess.Popen(self._args, stdout=subprocess.PIPE, stderr=err, env=env)
        self.port = self._wait_listening()
        return self

    def _wait_listening(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self._startup_timeout_s
        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        buf = b""
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(timeout=left):
                    continue
                piece = os.read(self._proc.stdout.fileno(), 4096)
                if not piece:
                    break  # the child exited
                buf += piece
                for line in buf.split(b"\n")[:-1]:
                    if line.startswith(b"LISTENING "):
                        return int(line.split()[1])
        finally:
            sel.close()
        err = self._stop_and_collect_stderr()
        raise RuntimeError(f"token server did not start within {self._startup_timeout_s} s: {err[-2000:]}")

    def _stop_and_collect_stderr(self) -> str:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        return self.stderr_text()

    def stderr_text(self) -> str:
        """What the server wrote on stderr (tracebacks, warnings): useful in a failing test's message."""
        try:
            return self._stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def read_log(self) -> list[dict[str, Any]]:
        """The server's per-request lines so far (each is written and flushed when its request ends)."""
        if self.log_path is None:
            raise RuntimeError("this server was started without log=True")
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def __enter__(self) -> TokenServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
