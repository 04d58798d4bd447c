"""slobench against a LiteLLM proxy in front of the bundled reference engine (modeled executor), with
the defaults a new user would use: `slobench run` and `sweep`, default workload (`tiny`: token-id
prompts on /v1/completions) and `--api chat`, the master key passed with --api-key-env.

The engine honours ignore_eos, so every complete request produced exactly max_tokens tokens, and it
reports usage, which LiteLLM relays in streams; LiteLLM itself serves no Prometheus /metrics unless its
prometheus callback is configured (it is not here).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from run_checks import Expect, check_run_dir
from servers import CliResult, Served

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

NUM = 10
LITELLM = dict(usage_in_stream=True, exact_output=True, serves_metrics=False)


@pytest.mark.parametrize("api_args", [(), ("--api", "chat")], ids=["default", "chat"])
def test_run(litellm_proxy: Served, run_slobench: Callable[..., CliResult], api_args: tuple[str, ...]) -> None:
    res = run_slobench(litellm_proxy, "run", "--workload", "tiny", "--rate", "5", "--num-requests", str(NUM),
                       *api_args)
    assert res.returncode == 0, res.explain()
    check_run_dir(res.out, Expect(NUM, **LITELLM))


def test_sweep(litellm_proxy: Served, run_slobench: Callable[..., CliResult]) -> None:
    res = run_slobench(litellm_proxy, "sweep", "--workload", "tiny", "--rates", "3,6", "--num-requests", "5")
    assert res.returncode == 0, res.explain()
    for rate_dir in ("rate-3", "rate-6"):
        check_run_dir(res.out / rate_dir, Expect(5, **LITELLM))
