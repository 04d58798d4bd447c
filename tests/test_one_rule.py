"""Issue 12's regressions: one path for every verb's requests, and one rule for what the terminal and the
HTML report both show (error kinds, per-replica and per-class TTFT on the SLO's clock)."""

from __future__ import annotations

import json
from pathlib import Path

from slobench.analysis.slo import SLO
from slobench.analysis.summary import error_kind, read_columns, summarize
from slobench.cli import main
from slobench.report.load import load_series
from slobench.report.stats import run_point
from slobench.run.rundir import load_run


def test_capacity_simulate_on_a_trace_runs(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{i // 10:02d}.{(i % 10) * 100000:06d},{20 + i % 7},{4 + i % 5}" for i in range(200)]
    trace.write_text("\n".join(rows) + "\n")
    code = main(["capacity", "--simulate", "--trace", str(trace), "--slo", "ttft=1s,tpot=200ms",
                 "--num-requests", "60", "--replicates", "2", "--out", str(tmp_path / "cap")])
    assert code in (0, 1)  # it ran: 0 or 1 is the verdict, never the crash (AttributeError, exit 1 before)
    assert json.loads((tmp_path / "cap" / "capacity.json").read_text())


def test_error_kinds_group_numbers_but_keep_http_statuses() -> None:
    assert error_kind("cut off by the server after 3 tokens: [DONE] came with no finish_reason") == \
        error_kind("cut off by the server after 17 tokens: [DONE] came with no finish_reason")
    assert error_kind("HTTP 500: boom") != error_kind("HTTP 503: busy")
    assert error_kind("request timed out after 0.5 s") == "request timed out after N s"


def test_terminal_and_report_agree_on_errors_and_per_replica_rows(tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert main(["run", "--simulate", "--replicas", "2", "--router", "round-robin", "--workload", "tiny",
                 "--rate", "30", "--num-requests", "80", "--kv-blocks", "40", "--slo", "ttft=50ms",
                 "--out", str(run), "--no-progress"]) in (0, 1)
    loaded = load_run(run)
    # give some records errors of one kind with different numbers, as real servers do
    lines = (run / "requests.jsonl").read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        d = json.loads(line)
        if i % 9 == 0:
            d["status"], d["error"] = "error", f"cut off by the server after {i} tokens: [DONE] came with no finish_reason"
        out.append(json.dumps(d))
    (run / "requests.jsonl").write_text("\n".join(out) + "\n")
    loaded = load_run(run)
    slo = SLO.parse("ttft=50ms")
    terminal = summarize(loaded.records, slo)
    report = run_point(load_series(run, slo=slo).runs[0], slo)
    assert terminal.error_counts == read_columns(run).error_counts == report.error_counts
    assert list(terminal.error_counts.values()) == [len(range(0, len(lines), 9))]
    assert report.per_replica == terminal.per_replica
    assert len(terminal.per_replica) == 2
    # the terminal's text and the HTML's cells come from those same rows, on the SLO's clock
    from slobench.report.html import _group_cell
    from slobench.report.terminal import per_replica_text

    for row in terminal.per_replica:
        assert f"#{row.key} {row.num_requests} req, TTFT " in per_replica_text(terminal.per_replica)
        assert f"#{row.key} {row.num_requests} · {row.ttft_p99_s * 1e3:.0f}" in _group_cell(report.per_replica, "replica", "#")


def test_an_unexpected_exception_is_exit_5_never_1(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import slobench.cli as cli

    def boom(args):  # type: ignore[no-untyped-def]
        raise AttributeError("a bug")

    monkeypatch.setitem(cli.HANDLERS, "summarize", boom)
    assert cli.main(["summarize", "anything"]) == 5
    err = capsys.readouterr().err
    assert "internal error (AttributeError: a bug)" in err and "please report it" in err
    assert "  5  internal error" in cli.EXIT_CODES  # and --help says so
