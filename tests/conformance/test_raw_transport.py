"""The conformance runs again with `--transport raw` (slobench/targets/rawhttp.py) named on the command
line: the lean HTTP/1.1 client must read the real servers' streams (LiteLLM's proxy, llama.cpp's server)
so that the same checks hold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from run_checks import Expect, check_run_dir
from servers import CliResult, Served

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

NUM = 10
SERVERS = {
    "litellm_proxy": dict(usage_in_stream=True, exact_output=True, serves_metrics=False),
    # llama.cpp refuses token-id prompts and ignores ignore_eos: the preflight finds both (test_llamacpp.py)
    "llamacpp_server": dict(usage_in_stream=False, exact_output=True, serves_metrics=False),
}


@pytest.mark.parametrize("api_args", [(), ("--api", "chat")], ids=["default", "chat"])
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_run_with_the_raw_transport(
    request: pytest.FixtureRequest, run_slobench: Callable[..., CliResult], server: str, api_args: tuple[str, ...]
) -> None:
    served: Served = request.getfixturevalue(server)
    res = run_slobench(served, "run", "--workload", "tiny", "--rate", "5", "--num-requests", str(NUM),
                       "--transport", "raw", *api_args)
    assert res.returncode == 0, res.explain()
    check_run_dir(res.out, Expect(NUM, **SERVERS[server]))  # type: ignore[arg-type]
