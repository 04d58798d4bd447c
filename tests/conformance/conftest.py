"""Real third-party servers on 127.0.0.1, started by the tests, for the conformance suite (issue 11).

- `llamacpp_server`: the llama.cpp server of `llama-cpp-python[server]` on a tiny random GGUF model the
  suite writes itself (tiny_gguf.py), with `--interrupt_requests False` so requests queue as on a
  serving deployment. `llamacpp_interrupting_server`: the same with the server's default
  (`--interrupt_requests True`: a new request ends the stream in progress with `[DONE]` and no finish).
- `litellm_proxy`: a LiteLLM proxy (`litellm[proxy]`, with a master key) in front of the bundled
  reference engine (modeled executor, model `tiny`).
- `run_slobench(served, verb, *args)`: the real CLI against a server, into a fresh `--out`.

Each fixture skips, naming the missing package, unless SLOBENCH_REQUIRE_CONFORMANCE=1 (CI), where a
missing package fails instead. `.ci/conformance-deps.sh` installs them. Every process started here is
stopped (SIGTERM, then SIGKILL) when its fixture ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from servers import CliResult, Served, run_cli, start_litellm, start_llamacpp

from slobench.testing.process import EngineServerProcess


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: starts a real third-party server on 127.0.0.1")


@pytest.fixture(scope="session")
def llamacpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from start_llamacpp(tmp_path_factory.mktemp("llamacpp"), interrupt_requests=False)


@pytest.fixture(scope="session")
def llamacpp_interrupting_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from start_llamacpp(tmp_path_factory.mktemp("llamacpp-int"), interrupt_requests=True)


@pytest.fixture(scope="session")
def reference_engine() -> Iterator[EngineServerProcess]:
    with EngineServerProcess("--executor", "modeled", "--model", "tiny") as srv:
        yield srv


@pytest.fixture(scope="session")
def litellm_proxy(tmp_path_factory: pytest.TempPathFactory, reference_engine: EngineServerProcess) -> Iterator[Served]:
    yield from start_litellm(tmp_path_factory.mktemp("litellm"), reference_engine)


@pytest.fixture
def run_slobench(tmp_path: Path) -> Callable[..., CliResult]:
    counter = iter(range(1000))

    def run(served: Served, verb: str, *args: str, timeout_s: float = 120.0) -> CliResult:
        return run_cli(served, verb, tmp_path / f"{verb}-{next(counter)}", *args, timeout_s=timeout_s)

    return run
