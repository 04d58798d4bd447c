"""The behaviours of real third-party servers that made every request fail, each reproduced by the token
server with that quirk and driven through `slobench run` with the defaults: a failing or empty /models,
a server that refuses unknown fields (`ignore_eos`), one that takes text prompts only, and a stream without
`[DONE]`. The real servers themselves are in tests/conformance/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import main
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration


def run_cli(srv: TokenServerProcess, out: Path, *extra: str, n: int = 12, workload: str = "tiny",
            input_len: int = 8, output_len: int = 6) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """`slobench run` against `srv` at 50 req/s: its exit code, the records and the manifest it wrote."""
    code = main([
        "run", "--url", srv.base_url, "--model", srv.model, "--workload", workload, "--rate", "50",
        "--num-requests", str(n), "--input-len", str(input_len), "--output-len", str(output_len),
        "--out", str(out), "--no-progress", "--scrape-interval", "0", *extra,
    ])
    path = out / "requests.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
    return code, records, manifest


@pytest.mark.parametrize("quirk", ["models-500", "models-empty"])
def test_a_failing_or_empty_models_list_is_a_note_when_model_is_given(
    quirky: Any, tmp_path: Path, quirk: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, records, manifest = run_cli(quirky(quirk), tmp_path / "r")
    assert code == 0
    assert len(records) == 12 and all(r["status"] == "ok" for r in records)
    notes = manifest["target"]["capabilities"]["notes"]
    assert any("GET /models gave" in n for n in notes), notes
    assert "GET /models gave" in capsys.readouterr().err  # said once, before the run


def test_a_server_refusing_unknown_fields_gets_none_and_lengths_are_reported(
    quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # refuses ignore_eos and min_tokens (422), and its model stops early when it likes
    code, records, manifest = run_cli(quirky("strict-fields", "eos-early"), tmp_path / "r")
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert (caps["ignore_eos"], caps["min_tokens"], caps["enforces_output_length"]) == (False, False, False)
    assert any("output lengths cannot be enforced" in n for n in caps["notes"])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    out = summary["lengths"]["output"]
    assert out["requested_p50"] == 6 and out["produced_p50"] == 3 and out["share_cut_short"] == 1.0
    assert "stopped short" in capsys.readouterr().out


def test_ignore_eos_ignored_but_min_tokens_honoured_gets_full_lengths(quirky: Any, tmp_path: Path) -> None:
    # llama.cpp: takes ignore_eos silently, honours min_tokens; slobench sends both, so lengths hold
    code, records, _ = run_cli(quirky("eos-early"), tmp_path / "r")
    assert code == 0 and [r["output_tokens"] for r in records] == [6] * 12


def test_token_prompts_refused_fall_back_to_text(quirky: Any, tmp_path: Path) -> None:
    srv = quirky("text-prompts-only", log=True)
    code, records, manifest = run_cli(srv, tmp_path / "r")
    assert code == 0 and all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert caps["token_prompts"] is False and any("prompts sent as text" in n for n in caps["notes"])
    # the server counts words: 8 asked, 8 served
    assert {r["prompt_tokens"] for r in records} == {8}


def test_streams_without_done_are_complete(quirky: Any, tmp_path: Path) -> None:
    code, records, _ = run_cli(quirky("no-done"), tmp_path / "r")
    assert code == 0 and all(r["status"] == "ok" and r["output_tokens"] == 6 for r in records)


def test_no_usage_in_streams_counts_chunks_and_says_so(quirky: Any, tmp_path: Path) -> None:
    code, records, manifest = run_cli(quirky("no-usage"), tmp_path / "r")
    assert code == 0 and all(r["output_tokens"] == 6 and r["usage_output_tokens"] is None for r in records)
    assert manifest["target"]["capabilities"]["usage_in_stream"] is False


def test_cut_off_streams_are_errors_and_an_all_failed_run_exits_1(
    quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, records, _ = run_cli(quirky("interrupt"), tmp_path / "r")
    assert {r["error"] for r in records} == {"cut off by the server after 3 tokens: [DONE] came with no finish_reason"}
    assert code == 1
    assert "all 12 requests failed" in capsys.readouterr().err


def test_max_error_rate(quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(quirky("interrupt"), tmp_path / "a", "--max-error-rate", "50%")
    assert code == 1 and "above --max-error-rate 50.0%" in capsys.readouterr().err
    srv = quirky()
    code, _, _ = run_cli(srv, tmp_path / "b", "--max-error-rate", "0")
    assert code == 0
    for bad in ("x", "1.5", "-1%"):
        assert main(["run", "--url", srv.base_url, f"--max-error-rate={bad}"]) == 2


def test_a_server_refusing_everything_gets_one_line(quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, records, _ = run_cli(quirky("refuse-all"), tmp_path / "r")
    assert code == 3 and records == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the plainest request" in err[0] and "refuses every request" in err[0]


def test_a_fixed_profile_does_not_probe(quirky: Any, tmp_path: Path) -> None:
    srv = quirky("text-prompts-only", log=True)
    code, records, manifest = run_cli(srv, tmp_path / "r", "--server-profile", "tgi")
    assert code == 0 and all(r["status"] == "ok" for r in records)
    assert manifest["target"]["capabilities"]["profile"] == "tgi"
    # the plain preflight request and the 12 requests; no probes
    assert len(srv.read_log()) == 13


@pytest.mark.parametrize("path_kind", ["missing", "garbage", "empty-dir"])
def test_bad_tokenizer_is_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], path_kind: str) -> None:
    pytest.importorskip("tokenizers")
    p = tmp_path / "tok"
    if path_kind == "garbage":
        p.write_text("{not a tokenizer")
    elif path_kind == "empty-dir":
        p.mkdir()
    code = main(["run", "--url", "http://127.0.0.1:9/v1", "--model", "m", "--tokenizer", str(p)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tokenizer" in err[0], err


@pytest.mark.parametrize(("profile", "paired"), [("vllm", False), ("sglang", False), ("llamacpp", True),
                                                 ("auto", True)])
def test_min_tokens_goes_beside_ignore_eos_only_where_ignore_eos_may_be_ignored(profile: str, paired: bool) -> None:
    from slobench.run.records import RequestSpec
    from slobench.targets import OpenAITarget

    body = OpenAITarget("http://h:1/v1", TargetOptions(model="m", server_profile=profile)).build_body(
        RequestSpec(request_id=0, arrival_s=0.0, prompt=(1, 2), input_tokens=2, max_tokens=9))
    assert body.get("min_tokens") == (9 if paired else None)
    assert body.get("ignore_eos") is (None if profile == "llamacpp" else True)


def test_server_and_user_strings_are_printed_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13 item 9: a model name, path, tag or error text holding rich markup is printed as it is."""
    from slobench.analysis.slo import SLO
    from slobench.analysis.summary import summarize
    from slobench.report.terminal import print_run
    from slobench.run.records import RequestRecord

    nasty = "[/bold]m[red]x"
    recs = []
    for i in range(4):
        r = RequestRecord(i, 0.0, tag=nasty if i % 2 else "[b]", sent_s=0.0, first_token_s=0.1, done_s=0.2,
                          chunk_times_s=[0.1, 0.2], chunk_tokens=[1, 1], output_tokens=2, max_tokens=2)
        if i == 3:
            r.fail("error", f"HTTP 500: {nasty}")
        recs.append(r)
    summary = summarize(recs, SLO.parse("ttft=1s"))
    print_run(summary, title=f"{nasty} · tiny · {tmp_path}/[red]")
    out = capsys.readouterr().out
    assert nasty in out and "[red]" in out


# ---- issue 13 item 8: exit codes and files on incomplete data ------------------------------------------


def test_warmup_that_leaves_nothing_to_measure_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--url", "http://127.0.0.1:9/v1", "--model", "m", "--warmup", "10",
                 "--num-requests", "5"]) == 2
    assert "leaves nothing to measure" in capsys.readouterr().err


def test_summary_files_never_hold_nan(tmp_path: Path) -> None:
    import math

    from slobench.run.rundir import write_json_atomic

    write_json_atomic(tmp_path / "s.json", {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -math.inf}})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": None, "b": [1.0, None], "c": {"d": None}}


async def test_an_interrupted_sweep_point_is_marked_and_left_out_of_the_headline(tmp_path: Path) -> None:
    from slobench.analysis.slo import SLO
    from slobench.analysis.summary import RunSummary
    from slobench.experiments.probe import ProbeResult
    from slobench.experiments.sweep import run_sweep

    def summary(n: int, ok_share: float) -> RunSummary:
        return RunSummary.from_dict({"num_requests": n, "num_ok": n, "attainment": {
            "value": ok_share, "ci_low": ok_share - 0.05, "ci_high": min(1.0, ok_share + 0.05)}})

    async def run_one(rate: float, seed: int, run_dir: Path | None, manifest: dict[str, Any]) -> ProbeResult:
        if rate == 1:
            return ProbeResult(summary(100, 0.5))  # misses at the first rate
        return ProbeResult(summary(1, 1.0), interrupted=True)  # one request into the second rate, then Ctrl-C

    doc = await run_sweep([1, 20], run_one, out_dir=tmp_path, slo=SLO.parse("ttft=1s,target=0.9"), manifest={})
    assert doc["interrupted"] and doc["runs"][1]["interrupted"]
    assert doc["headline"]["max_rate_meeting_rps"] is None  # not "stays >= 90% up to 20 req/s"


def test_an_interrupted_run_exits_130(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    with TokenServerProcess(ttft_ms=1, itl_ms=20) as srv:
        out = tmp_path / "r"
        proc = subprocess.Popen(
            [sys.executable, "-m", "slobench", "run", "--url", srv.base_url, "--model", srv.model, "--workload",
             "tiny", "--rate", "20", "--num-requests", "40", "--output-len", "200", "--out", str(out),
             "--no-progress", "--scrape-interval", "0", "--slo", "ttft=10s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        while not (out / "requests.jsonl").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)  # bounded poll for the run to start, not a wait for a result
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True



def test_a_server_without_metrics_is_a_note(quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    srv = quirky("no-metrics")
    code = main(["run", "--url", srv.base_url, "--model", srv.model, "--workload", "tiny", "--rate", "50",
                 "--num-requests", "4", "--out", str(tmp_path / "r"), "--no-progress", "--scrape-interval", "0.05"])
    assert code == 0
    assert "note: no server metrics scraped" in capsys.readouterr().out
    assert not (tmp_path / "r" / "server_metrics.jsonl").exists()


def test_a_transient_failure_at_preflight_is_tried_again(quirky: Any, tmp_path: Path) -> None:
    code, records, _ = run_cli(quirky("flaky-start"), tmp_path / "r")
    assert code == 0 and len(records) == 12 and all(r["status"] == "ok" for r in records)


def test_an_error_line_never_shows_a_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--url", "http://user:hunter2@127.0.0.1:9/v1", "--model", "m", "--workload", "tiny"]) == 3
    err = capsys.readouterr().err
    assert "hunter2" not in err and "127.0.0.1:9" in err


def test_the_text_memo_is_bounded_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import slobench.targets.openai as oa
    from slobench.run.records import RequestSpec

    monkeypatch.setattr(oa, "_MEMO_CHARS", 1000)
    t = oa.OpenAITarget("http://h:1/v1", TargetOptions(model="m", api="chat"))
    for i in range(50):
        t.build_body(RequestSpec(request_id=i, arrival_s=0.0, prompt=tuple(range(i, i + 40)), input_tokens=40,
                                 max_tokens=1))
        assert t._texts_chars <= 1000 + 40 * 7


def test_the_report_says_what_the_terminal_says_of_fallbacks_and_lengths(quirky: Any, tmp_path: Path) -> None:
    from slobench.report import build_report

    code, _, _ = run_cli(quirky("strict-fields", "eos-early"), tmp_path / "r")
    assert code == 0
    page = build_report([str(tmp_path / "r")], tmp_path / "report.html").read_text()
    assert "output lengths not enforced" in page  # the header: the server may stop early
    assert "ignore_eos refused" in page  # each fallback, as printed before the run
    assert "50% stopped short" not in page and "100% stopped short" in page  # the run card, as the terminal


def test_a_small_vocabulary_keeps_token_prompts(tmp_path: Path) -> None:
    """The bundled engine's tiny model has a byte-level vocabulary (~260 ids): the token-id probe must use ids
    inside it, or preflight falls back to text and every prompt grows ~5x (the torch demo ran 8x slower)."""
    import asyncio

    from slobench.targets import OpenAITarget
    from slobench.testing.process import EngineServerProcess

    pytest.importorskip("torch")
    with EngineServerProcess("--executor", "torch", "--model", "tiny", torch_threads=1) as srv:  # vocab 512
        target = OpenAITarget(srv.base_url, TargetOptions(model="tiny"))
        asyncio.run(target.preflight())
    assert target.caps.token_prompts is True, target.caps.notes
