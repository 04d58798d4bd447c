"""Starting third-party servers on 127.0.0.1 for the conformance suite, and running the slobench CLI.

The fixtures that use these live in conftest.py; the types are here so test modules can import them.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tiny_gguf import write_tiny_gguf

from slobench.testing.process import EngineServerProcess, ServerProcess

REQUIRE_ENV = "SLOBENCH_REQUIRE_CONFORMANCE"
LITELLM_KEY = "sk-slobench-conformance-0123456789"  # test-only master key of a proxy bound to 127.0.0.1
LITELLM_KEY_ENV = "SLOBENCH_LITELLM_KEY"
ROOT = Path(__file__).resolve().parents[2]


def require(module: str, package: str) -> None:
    """Skip (or, with SLOBENCH_REQUIRE_CONFORMANCE=1, fail) when `module` cannot be imported."""
    if importlib.util.find_spec(module) is not None:
        return
    reason = f"{package} is not installed (run .ci/conformance-deps.sh)"
    if required(package):
        pytest.fail(f"{reason}; {REQUIRE_ENV} requires it", pytrace=False)
    pytest.skip(reason)


def required(package: str) -> bool:
    """SLOBENCH_REQUIRE_CONFORMANCE=1 requires every server; a comma list (`litellm`) only those named.
    CI names LiteLLM alone: llama-cpp-python compiles for ~7 minutes, more than its 20-minute budget
    leaves (run `bash .ci/conformance-deps.sh` and `=1` to include it)."""
    want = os.environ.get(REQUIRE_ENV, "")
    return want == "1" or package.split("[")[0] in {w.strip() for w in want.split(",")}


def free_port() -> int:
    """A port free right now on 127.0.0.1, for servers that cannot bind port 0 and say which they got."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PolledServerProcess(ServerProcess):
    """A server that prints no `LISTENING <port>`: it gets a free port on its command line, and is ready
    when `ready_path` answers 200. Polling is bounded by `startup_timeout_s`; between polls the wait is
    on the child itself, so a server that dies at start is reported at once, with its stderr."""

    def __init__(self, module_args: list[str], *, port: int, ready_path: str, name: str, **kwargs: Any) -> None:
        super().__init__(module_args, **kwargs)
        self.name = name
        self._port = port
        self._ready_path = ready_path

    def _wait_listening(self) -> int:
        assert self._proc is not None
        url = f"http://{self.host}:{self._port}{self._ready_path}"
        deadline = time.monotonic() + self._startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(url).status_code == 200:
                        return self._port
                except httpx.TransportError:
                    pass
                try:
                    self._proc.wait(timeout=0.1)  # returns only when the child has exited
                    break
                except subprocess.TimeoutExpired:
                    continue
        err = self.stderr_text()
        self.stop()
        raise RuntimeError(f"{self.name} not ready at {url} within {self._startup_timeout_s} s: {err[-3000:]}")


@dataclass(frozen=True)
class Served:
    """A started server: what a test needs to point slobench at it."""

    base_url: str  # .../v1
    model: str
    env: dict[str, str]  # extra environment for the slobench process (the API key)
    api_key_env: str | None
    proc: ServerProcess


def start_llamacpp(tmp: Path, *, interrupt_requests: bool) -> Iterator[Served]:
    require("llama_cpp", "llama-cpp-python[server]")
    require("sse_starlette", "llama-cpp-python[server]")
    require("gguf", "gguf")
    model = write_tiny_gguf(tmp / "tiny.gguf")
    port = free_port()
    srv = PolledServerProcess(
        [
            "-m", "llama_cpp.server",
            "--model", str(model),
            "--model_alias", "tiny-gguf",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--n_ctx", "2048",
            "--n_threads", "1",
            "--interrupt_requests", str(interrupt_requests),
        ],
        port=port,
        ready_path="/v1/models",
        name="llama.cpp server",
        startup_timeout_s=60.0,
    )
    srv.start()
    try:
        yield Served(srv.base_url, "tiny-gguf", {}, None, srv)
    finally:
        srv.stop()


def start_litellm(tmp: Path, engine: EngineServerProcess) -> Iterator[Served]:
    # top-level names only: find_spec("litellm.proxy...") would import litellm, which fetches a price
    # list from GitHub on import (~10 s of retries offline); fastapi_sso comes with the proxy extra
    require("litellm", "litellm[proxy]")
    require("fastapi_sso", "litellm[proxy]")
    config = tmp / "litellm.yaml"
    # openai/: any OpenAI-compatible server; it passes token-id prompts and extra fields (ignore_eos) on.
    # (hosted_vllm/ refuses token-id prompts in 1.108.7: 500 "Unmapped prompt format".)
    config.write_text(
        "model_list:\n"
        "  - model_name: tiny\n"
        "    litellm_params:\n"
        "      model: openai/tiny\n"
        f"      api_base: {engine.base_url}\n"
        "      api_key: none\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    port = free_port()
    # LITELLM_LOCAL_MODEL_COST_MAP: no fetch of the price list from GitHub (three tries, ~10 s offline)
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True"}
    srv = PolledServerProcess(
        ["-m", "litellm.proxy.proxy_cli", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        port=port,
        ready_path="/health/liveliness",
        name="LiteLLM proxy",
        startup_timeout_s=90.0,
        env=env,
    )
    srv.start()
    try:
        yield Served(srv.base_url, "tiny", {LITELLM_KEY_ENV: LITELLM_KEY}, LITELLM_KEY_ENV, srv)
    finally:
        srv.stop()


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


def run_cli(served: Served, verb: str, out: Path, *args: str, timeout_s: float = 120.0) -> CliResult:
    """`python -m slobench VERB --url ... --model ... --out OUT --no-progress ARGS` against `served`."""
    cmd = [sys.executable, "-m", "slobench", verb, "--url", served.base_url, "--model", served.model,
           "--out", str(out), "--no-progress", *args]
    if served.api_key_env:
        cmd += ["--api-key-env", served.api_key_env]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **served.env},
                       cwd=ROOT)
    return CliResult(p.returncode, p.stdout, p.stderr, out)
