"""slobench against the llama.cpp server of llama-cpp-python (tiny random GGUF model, CPU), with the
defaults a new user would use: `slobench run` and `sweep`, default workload (`tiny`: token-id prompts on
/v1/completions) and `--api chat`.

What this server does (llama-cpp-python 0.3.36): a token-id prompt is refused (the body schema wants a
string), `ignore_eos` is silently ignored (`min_tokens` is honoured), streams carry no `usage` even when
asked, there is no /metrics, and by default (`--interrupt_requests True`) a new request ends the stream in
progress with `[DONE]` and no finish_reason. The model cannot stop early (tiny_gguf.py), so every
complete request produced exactly max_tokens tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from run_checks import Expect, check_run_dir, describe_errors, read_records
from servers import CliResult, Served

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

NUM = 10
LLAMACPP = dict(usage_in_stream=False, exact_output=True, serves_metrics=False)


@pytest.mark.parametrize("api_args", [(), ("--api", "chat")], ids=["default", "chat"])
def test_run(llamacpp_server: Served, run_slobench: Callable[..., CliResult], api_args: tuple[str, ...]) -> None:
    res = run_slobench(llamacpp_server, "run", "--workload", "tiny", "--rate", "5", "--num-requests", str(NUM),
                       *api_args)
    assert res.returncode == 0, res.explain()
    check_run_dir(res.out, Expect(NUM, **LLAMACPP))


def test_sweep(llamacpp_server: Served, run_slobench: Callable[..., CliResult]) -> None:
    res = run_slobench(llamacpp_server, "sweep", "--workload", "tiny", "--rates", "3,6", "--num-requests", "5")
    assert res.returncode == 0, res.explain()
    for rate_dir in ("rate-3", "rate-6"):
        check_run_dir(res.out / rate_dir, Expect(5, **LLAMACPP))


def test_streams_cut_off_by_a_new_request_are_errors(
    llamacpp_interrupting_server: Served, run_slobench: Callable[..., CliResult]
) -> None:
    """With the server's default --interrupt_requests True, overlapping requests cut each other off: a cut
    stream ends with [DONE] but no finish_reason, and must be recorded as an error, never as ok with
    fewer tokens than were asked for."""
    # --api chat: text prompts, so this tests the cut-off alone, whatever becomes of token-id prompts
    res = run_slobench(llamacpp_interrupting_server, "run", "--workload", "tiny", "--api", "chat", "--rate", "40",
                       "--num-requests", "8", "--output-len", "64")
    records = read_records(res.out)
    assert len(records) == 8, res.explain()
    short = [r for r in records if r["status"] == "ok" and r["output_tokens"] < r["max_tokens"]]
    assert not short, f"cut-off streams recorded as ok: {[(r['output_tokens'], r['max_tokens']) for r in short]}"
    cut = [r for r in records if r["status"] == "error" and "cut off by the server" in (r.get("error") or "")]
    assert cut, f"8 requests at 40 req/s and none recorded as cut off; errors:\n{describe_errors(records)}"
