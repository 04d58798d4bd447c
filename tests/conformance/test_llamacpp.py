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
from pathlib import Path

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


def test_calibrate_fits_a_profile_of_a_server_that_serves_one_request_at_a_time(
    llamacpp_server: Served, tmp_path: Path
) -> None:
    """llama-cpp-python decodes one request at a time and takes text only, with a character-level
    vocabulary here (~4.4 tokens a prompt word). calibrate used to send 1,024-word prompts (4,700 tokens,
    past the 2,048 context: a failed probe) and then stop at "batch 4 never decoded all together"; now it
    sizes the text to the server's count and probes decode at the one batch the server runs."""
    import subprocess
    import sys

    from reference_engine.executor.modeled_executor import CostProfile

    out = tmp_path / "llamacpp.json"
    p = subprocess.run([sys.executable, "-m", "slobench", "calibrate", "--url", llamacpp_server.base_url, "-o",
                        str(out), "--no-refine", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "decoded at most 1 request at a time" in p.stdout and "--max-num-seqs 1" in p.stdout, p.stdout
    assert "tokens a word" in p.stdout, p.stdout
    prof = CostProfile.load(out)
    assert prof.provenance is not None
    # one decode step of one sequence takes some time; the prefill of 1,024 tokens takes more than of 16
    assert prof.step_s(0, 1, 100) > 0
    assert prof.step_s(1024, 0, 1024, 1024 * 1025 // 2) > prof.step_s(16, 0, 16, 136)
    labels = [q["label"] for q in prof.provenance["probes"]]
    assert not any(label.startswith("batch 4") for label in labels), labels


def test_calibrate_says_how_to_serve_concurrent_load(llamacpp_interrupting_server: Served, tmp_path: Path) -> None:
    """With the server's default --interrupt_requests True, the probes sent together cut each other off:
    calibrate stops with exit 2 and names the server option, instead of "is it within the server's limits?"."""
    import subprocess
    import sys

    out = tmp_path / "never.json"
    p = subprocess.run([sys.executable, "-m", "slobench", "calibrate", "--url", llamacpp_interrupting_server.base_url,
                        "-o", str(out), "--no-refine", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "--interrupt_requests False" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not out.exists()
