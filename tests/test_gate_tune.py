"""`slobench gate` with tune directories on both sides: each stands for its best configuration's capacity
search, said on stderr; a regression of that configuration fails the gate, different workloads or SLOs
and a tune with nothing measured are exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from slobench.analysis.slo import SLO
from slobench.cli import main
from slobench.tune.result import TuneRow, write_tune
from tests.tune_helpers import synthetic_tune


def gate(base: Path, cand: Path, *extra: str) -> int:
    return main(["gate", "--baseline", str(base), "--candidate", str(cand), *extra])


def test_the_best_configurations_are_gated_and_the_gate_says_which(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = synthetic_tune(tmp_path / "base")
    same = synthetic_tune(tmp_path / "same", scale=1.001)
    assert gate(base, same) == 0
    out, err = capsys.readouterr()
    assert f"gate: {base} is a tune: its best configuration (config=seqs-8, 11 req/s per GPU on 1 GPU)" in err
    assert str(base / "seqs-8" / "capacity") in err and f"gate: {same} is a tune" in err
    assert "seqs-8/capacity/capacity.json" in out  # the sources the verdict names

    slower = synthetic_tune(tmp_path / "slower", scale=0.8)
    assert gate(base, slower, "--max-drop", "capacity=5%") == 1
    assert "capacity" in capsys.readouterr().out


def test_tunes_of_other_workloads_or_slos_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = synthetic_tune(tmp_path / "base")
    tighter = synthetic_tune(tmp_path / "tighter", slo=SLO(ttft_s=0.2, tpot_s=0.05))
    assert gate(base, tighter) == 2
    err = capsys.readouterr().err
    assert "refusing to compare" in err and "ttft_s 0.5 vs 0.2" in err and str(tighter) in err
    other = synthetic_tune(tmp_path / "other", workload="chat")
    assert gate(base, other) == 2
    assert "workload name 'synthetic' vs 'chat'" in capsys.readouterr().err


def test_a_tune_with_nothing_measured_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = synthetic_tune(tmp_path / "base")
    empty = tmp_path / "empty"
    empty.mkdir()
    write_tune(empty, [TuneRow("a", {"n": 1}, "failed", 1, ["srv"], reason="never ready")], {"simulate": False})
    assert gate(base, empty) == 2
    assert "no configuration has a capacity: nothing to gate" in capsys.readouterr().err
