"""Run a server in a child process that prints `LISTENING <port>` once bound, and stop it cleanly.

Used for the scheduled-token test server, the bundled engine in `slobench demo`, the tests and the
benchmarks. Waiting is bounded and event-driven (select on the child's stdout), never a fixed sleep.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self


async def listen_until_stopped(port: int, cleanup: Callable[[], Awaitable[None]]) -> None:
    """A test server's life once it is bound: `LISTENING <port>` on stdout (what `ServerProcess` waits
    for), then serve until SIGINT or SIGTERM, then `cleanup`."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"LISTENING {port}", flush=True)
    try:
        await stop.wait()
    finally:
        await cleanup()


def server_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A test server's command line: `--host` and `--port` (0: a free one, announced as LISTENING)."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed as LISTENING <port>)")
    return p


def run_server(main_async: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
               args: argparse.Namespace) -> None:
    """Run a test server's `main_async(args)` until it is stopped; Ctrl-C exits 130 without a traceback."""
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit(130)


class ServerProcess:
    """`with ServerProcess(["-m", "pkg.server", "--port", "0"]) as srv: srv.base_url`."""

    name = "server"

    def __init__(
        self,
        module_args: Sequence[str],
        *,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        # stderr goes to a file, not a pipe nobody drains, so a chatty server can never block on it.
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = tempfile.TemporaryDirectory(prefix="slobench-srv-")
        self.tmp_path = Path(self._tmpdir.name)
        self._stderr_path = self.tmp_path / "stderr.txt"
        self._args = [sys.executable, *module_args]
        self._env = env
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self._env or {})}
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
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        err = self.stderr_text()
        self.stop()
        raise RuntimeError(f"{self.name} did not start within {self._startup_timeout_s} s: {err[-2000:]}")

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EngineServerProcess(ServerProcess):
    """The bundled reference engine (`python -m reference_engine.server`) with the given knobs."""

    name = "reference engine"

    def __init__(
        self,
        *engine_args: str,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 120.0,
        torch_threads: int | None = None,
    ) -> None:
        # On a small machine the client needs a core of its own, or its lateness measures torch's threads.
        env = {"OMP_NUM_THREADS": str(torch_threads)} if torch_threads else None
        super().__init__(
            ["-m", "reference_engine.server", "--host", host, "--port", "0", *engine_args],
            host=host,
            startup_timeout_s=startup_timeout_s,
            env=env,
        )
