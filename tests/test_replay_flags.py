"""The trace flags of the load verbs: min_tokens sent on replay, row flags passed to the loader, and
flags that would be ignored refused with exit 2 and one line (issue 14, items 6 and 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slobench.cli import build_parser, main
from slobench.cli.common import options_from_args
from slobench.errors import UsageError
from slobench.load_setup import LoadSetup
from slobench.run.clock import Clock
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.workload.replay import replay
from slobench.workload.traces import load_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:00.0000000,100,10
2023-11-16 18:00:00.5000000,200,20
2023-11-16 18:00:01.0000000,300,0
2023-11-16 18:00:03.0000000,400,40
"""
URL = "http://127.0.0.1:9/v1"  # nothing listens there: reaching it would be exit 3, not 2


def trace_file(tmp_path: Path) -> Path:
    p = tmp_path / "a.csv"
    p.write_text(AZURE)
    return p


def setup_for(argv: list[str]) -> LoadSetup:
    return LoadSetup(options_from_args(build_parser().parse_args(argv)))


def test_replay_sends_min_tokens_equal_to_max_tokens(tmp_path):
    specs = replay(load_trace(trace_file(tmp_path)))
    assert [(s.max_tokens, s.min_tokens) for s in specs] == [(10, 10), (20, 20), (40, 40)]
    body = OpenAITarget(URL, TargetOptions(model="m"), Clock()).build_body(specs[0])
    assert body["min_tokens"] == body["max_tokens"] == 10
    assert all(s.min_tokens is None for s in replay(load_trace(trace_file(tmp_path)), min_tokens="none"))


def test_min_tokens_flag(tmp_path):
    path = str(trace_file(tmp_path))
    assert [s.min_tokens for s in setup_for(["run", "--trace", path]).specs(None)] == [10, 20, 40]
    setup = setup_for(["run", "--trace", path, "--min-tokens", "none"])
    assert [s.min_tokens for s in setup.specs(None)] == [None, None, None]
    assert setup.workload.to_dict()["min_tokens"] == "none"


def test_row_flags_reach_the_loader(tmp_path, capsys):
    path = str(trace_file(tmp_path))
    specs = setup_for(["run", "--trace", path, "--keep-zero-rows"]).specs(None)
    assert [(s.input_tokens, s.max_tokens) for s in specs] == [(100, 10), (200, 20), (300, 1), (400, 40)]
    assert any("kept 1 of 4 rows with zero tokens" in n for n in specs.row_report()["notes"])  # run: streamed
    setup_for(["sweep", "--trace", path, "--rates", "1"])  # sweep: loaded whole, said at once
    assert "left out 1 of 4 rows with zero tokens" in capsys.readouterr().err
    assert main(["workload", "show", path, "--keep-zero-rows"]) == 0
    assert "4 requests from 4 rows (0 unreadable, 1 with zero tokens raised to 1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workload", "chat"], "--trace and --workload conflict"),
        (["--rate", "5", "--time-scale", "0.5"], "--time-scale and --rate conflict"),
    ],
)
def test_conflicting_flags_exit_2_with_one_line(tmp_path, capsys, extra, message):
    argv = ["run", "--trace", str(trace_file(tmp_path)), "--url", URL, "--no-progress", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]  # checked before the trace is read


def test_sweep_rates_and_capacity_conflict_with_time_scale(tmp_path):
    path = str(trace_file(tmp_path))
    with pytest.raises(UsageError, match="--time-scale and --rates conflict"):
        setup_for(["sweep", "--trace", path, "--rates", "1,2", "--time-scale", "2"])


@pytest.mark.parametrize("flag", [["--time-scale", "0.5"], ["--start", "3"], ["--trace-format", "azure"],
                                  ["--no-spread"], ["--keep-zero-rows"], ["--min-tokens", "none"]])
def test_trace_flags_without_a_trace_exit_2(capsys, flag):
    assert main(["run", "--workload", "chat", "--url", URL, "--no-progress", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"slobench: error: {flag[0]} applies only to --trace"]
