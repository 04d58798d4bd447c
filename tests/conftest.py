"""Shared fixtures. Servers run in child processes on 127.0.0.1, each on a free port it bound itself.

- `token_server`: one scheduled-token server for the whole session (TTFT 50 ms, ITL 5 ms, model
  `test-model`, per-request log on). Yields a `TokenServerProcess`: `.base_url` (".../v1"), `.port`,
  `.model`, `.read_log()`. Pass `x_request_id` in a request's extra_body to find its log line.
- `token_server_url`: just that server's base URL.
- `start_token_server(**kwargs)`: a factory for a server with other settings (see TokenServerProcess);
  every server it starts is stopped at the end of the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from slobench.testing import TokenServerProcess


@pytest.fixture(scope="session")
def token_server() -> Iterator[TokenServerProcess]:
    with TokenServerProcess(ttft_ms=50.0, itl_ms=5.0, log=True) as srv:
        yield srv


@pytest.fixture(scope="session")
def token_server_url(token_server: TokenServerProcess) -> str:
    return token_server.base_url


@pytest.fixture
def start_token_server() -> Iterator[Callable[..., TokenServerProcess]]:
    started: list[TokenServerProcess] = []

    def start(**kwargs: object) -> TokenServerProcess:
        srv = TokenServerProcess(**kwargs).start()  # type: ignore[arg-type]
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
