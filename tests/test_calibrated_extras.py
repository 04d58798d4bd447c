"""A calibrated profile carries its whole served model into every simulation of it: the request's fixed cost
`o` (moved onto every time after the send) and the fitted step-time noise, which `slobench calibrate` writes
to the profile's provenance. `run --simulate` and `plan` apply both unless `--request-overhead` / `--jitter`
say otherwise, and say so; bundled and roofline profiles carry neither and simulate exactly as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import SpecError
from slobench.fleet.simulate import calibrated_extras, simulate_records
from slobench.run.rundir import load_run
from slobench.workload import generate, load_workload

O_S, JITTER = 0.025, 0.15


def _calibrated(tmp_path: Path, **prov: Any) -> Path:
    base = CostProfile.load("cpu-tiny")
    path = tmp_path / "cal.json"
    path.write_text(replace(base, name="cal", provenance={"kind": "calibrated", **prov}).to_json())
    return path


def _times(records: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.sent_s, r.first_token_s, r.done_s, tuple(r.chunk_times_s), r.output_tokens) for r in records]


def test_the_overhead_moves_every_time_after_the_send_and_nothing_else() -> None:
    specs = generate(load_workload("tiny"), rate_rps=20.0, num_requests=60, seed=3)
    plain = simulate_records(specs, {"profile": "cpu-tiny"})
    moved = simulate_records(specs, {"profile": "cpu-tiny"}, request_overhead_s=O_S)
    assert len(plain) == len(moved) == 60
    for p, m in zip(plain, moved, strict=True):
        assert m.sent_s == p.sent_s == p.scheduled_s  # the send is where it was
        assert m.first_token_s == pytest.approx(p.first_token_s + O_S)  # TTFT grows by o exactly
        assert m.done_s == pytest.approx(p.done_s + O_S)
        assert m.chunk_times_s == pytest.approx([t + O_S for t in p.chunk_times_s])  # TPOT, ITL: unchanged
    with pytest.raises(SpecError, match="request_overhead_s"):
        simulate_records(specs, {"profile": "cpu-tiny"}, request_overhead_s=-0.01)


def test_the_extras_are_read_from_the_provenance_and_checked(tmp_path: Path) -> None:
    assert calibrated_extras(CostProfile.load("cpu-tiny")) == (0.0, 0.0)  # bundled: none
    path = _calibrated(tmp_path, request_overhead_s=O_S, step_jitter_sd=JITTER)
    assert calibrated_extras(CostProfile.load(path)) == (O_S, JITTER)
    only_o = _calibrated(tmp_path, request_overhead_s=O_S)  # a probe-only calibration: o, no noise
    assert calibrated_extras(CostProfile.load(only_o)) == (O_S, 0.0)
    bad = _calibrated(tmp_path, request_overhead_s="13ms")
    with pytest.raises(SpecError, match="provenance.request_overhead_s"):
        calibrated_extras(CostProfile.load(bad))


def _sim(tmp_path: Path, name: str, profile: Path | str, *flags: str) -> Any:
    out = tmp_path / name
    rc = main(["run", "--workload", "tiny", "--rate", "15", "--num-requests", "40", "--seed", "2", "--simulate",
               "--profile", str(profile), "--out", str(out), "--no-progress", *flags])
    assert rc == 0
    return load_run(out)


def test_run_simulate_applies_a_calibrated_profile_unless_told_not_to(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cal = _calibrated(tmp_path, request_overhead_s=O_S, step_jitter_sd=JITTER)
    capsys.readouterr()
    default = _sim(tmp_path, "default", cal)
    err = capsys.readouterr().err
    assert "25.0 ms" in err and "sd 0.15" in err and "--request-overhead 0" in err, err  # it says what it adds
    target = default.manifest["target"]
    assert target["jitter_sd"] == JITTER and target["request_overhead_s"] == O_S
    assert target["calibrated_extras"] == str(cal)
    # the same noise without o: every TTFT exactly o shorter, every TPOT the same
    no_o = _sim(tmp_path, "no-o", cal, "--request-overhead", "0")
    assert no_o.manifest["target"]["jitter_sd"] == JITTER and no_o.manifest["target"]["request_overhead_s"] == 0
    for d, n in zip(default.records, no_o.records, strict=True):
        assert d.first_token_s == pytest.approx(n.first_token_s + O_S)
        assert d.chunk_times_s == pytest.approx([t + O_S for t in n.chunk_times_s])
    # neither: the bundled profile's run, to the bit (the coefficients are cpu-tiny's)
    neither = _sim(tmp_path, "neither", cal, "--request-overhead", "0", "--jitter", "0")
    bundled = _sim(tmp_path, "bundled", "cpu-tiny")
    assert _times(neither.records) == _times(bundled.records)
    assert _times(neither.records) != _times(no_o.records)  # the noise did move steps
    # flags win over the profile, and a bad one is one line naming it
    given = _sim(tmp_path, "given", cal, "--request-overhead", "5ms", "--jitter", "0")
    assert given.manifest["target"]["request_overhead_s"] == pytest.approx(0.005)
    for g, n in zip(given.records, neither.records, strict=True):
        assert g.first_token_s == pytest.approx(n.first_token_s + 0.005)
    capsys.readouterr()
    assert main(["run", "--workload", "tiny", "--simulate", "--profile", str(cal), "--request-overhead", "soon",
                 "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "--request-overhead" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_bad_calibrated_value_is_refused_before_anything_runs(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = _calibrated(tmp_path, step_jitter_sd=-1)
    assert main(["run", "--workload", "tiny", "--simulate", "--profile", str(bad), "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "step_jitter_sd" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_plan_applies_a_calibrated_profile(tmp_path: Path) -> None:
    from slobench.cli import build_parser
    from slobench.cli.plan import _build

    cal = _calibrated(tmp_path, request_overhead_s=O_S, step_jitter_sd=JITTER)
    base = ["plan", "--workload", "day", "--slo", "ttft=500ms,tpot=40ms", "--profile", str(cal)]
    _, setup, _ = _build(build_parser().parse_args(base))
    assert (setup.request_overhead_s, setup.jitter_sd) == (O_S, JITTER)
    _, setup, _ = _build(build_parser().parse_args([*base, "--request-overhead", "0", "--jitter", "0.05"]))
    assert (setup.request_overhead_s, setup.jitter_sd) == (0.0, 0.05)
    _, setup, _ = _build(build_parser().parse_args([*base[:-1], "cpu-tiny"]))
    assert (setup.request_overhead_s, setup.jitter_sd) == (0.0, 0.0)
    # and every evaluation simulates with them
    from slobench.fleet.plan import Fleet, simulate_fleet

    _, setup, _ = _build(build_parser().parse_args([*base, "--jitter", "0"]))
    specs = generate(load_workload("tiny"), rate_rps=10.0, num_requests=20, seed=1)
    with_o = simulate_fleet(setup, specs, Fleet(colocated=1))
    without = simulate_fleet(replace(setup, request_overhead_s=0.0), specs, Fleet(colocated=1))
    assert [r.first_token_s for r in with_o] == pytest.approx([r.first_token_s + O_S for r in without])


def test_the_overhead_flag_takes_any_duration_and_zero_in_any_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    from slobench.errors import UsageError
    from slobench.load_setup import calibrated_flags, parse_overhead_s

    assert parse_overhead_s(None) is None
    assert parse_overhead_s("13ms") == pytest.approx(0.013) and parse_overhead_s("0.02") == pytest.approx(0.02)
    assert [parse_overhead_s(z) for z in ("0", "0.00", "0ms", "0e0")] == [0.0] * 4
    for bad in ("-1ms", "soon", "5min"):
        with pytest.raises(UsageError, match="--request-overhead"):
            parse_overhead_s(bad)
    # both flags given: the profile is never loaded, nor said to add anything
    def boom() -> CostProfile:
        raise AssertionError("loaded")

    assert calibrated_flags("5ms", 0.1, boom, "p.json", "plan") == (pytest.approx(0.005), 0.1, None)
    assert capsys.readouterr().err == ""
    with pytest.raises(UsageError, match="--jitter"):
        calibrated_flags(None, float("nan"), boom, "p.json", "plan")


def test_a_calibrated_servers_batch_limit_is_the_default_and_more_is_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # calibrate records how many requests the server decoded at once when it was fewer than it sent
    # (llama-cpp-python's server: 1): --simulate and plan simulate that server unless told otherwise
    path = _calibrated(tmp_path, request_overhead_s=O_S, served_max_num_seqs=1)
    base = ["run", "--simulate", "--profile", str(path), "--workload", "tiny", "--rate", "20", "--num-requests", "30",
            "--no-progress", "--seed", "2"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "--max-num-seqs 1, from" in err and "decoded at most 1 request at a time" in err, err
    assert load_run(tmp_path / "a").manifest["target"]["knobs"]["max_num_seqs"] == 1
    assert main([*base, "--max-num-seqs", "1", "--out", str(tmp_path / "b")]) == 0
    assert "decoded at most" not in capsys.readouterr().err  # said by the user: nothing to add
    # the same requests, one at a time either way: the same records
    assert _times(load_run(tmp_path / "a").records) == _times(load_run(tmp_path / "b").records)
    assert main([*base, "--max-num-seqs", "8", "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "--max-num-seqs 8 simulates one that batches more" in err and "--max-num-seqs 1 simulates that" in err, err
    # batching 8 is another server: at 20 req/s its requests overlap, so its records differ
    assert _times(load_run(tmp_path / "c").records) != _times(load_run(tmp_path / "a").records)
    plain = _calibrated(tmp_path, request_overhead_s=O_S)  # nothing recorded: the default 64, nothing said
    assert main([*base[:3], str(plain), *base[4:], "--out", str(tmp_path / "d")]) == 0
    assert "decoded at most" not in capsys.readouterr().err
    assert load_run(tmp_path / "d").manifest["target"]["knobs"]["max_num_seqs"] == 64


def test_plan_takes_the_calibrated_servers_batch_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slobench.cli import build_parser
    from slobench.cli.plan import PLAN_MAX_NUM_SEQS, _build

    cal = _calibrated(tmp_path, request_overhead_s=O_S, served_max_num_seqs=2)
    base = ["plan", "--workload", "day", "--slo", "ttft=500ms,tpot=40ms", "--profile", str(cal)]
    _, setup, _ = _build(build_parser().parse_args(base))
    assert setup.engine.max_num_seqs == 2
    assert "--max-num-seqs 2, from" in capsys.readouterr().err
    _, setup, _ = _build(build_parser().parse_args([*base, "--max-num-seqs", "16"]))
    assert setup.engine.max_num_seqs == 16
    assert "batches more" in capsys.readouterr().err
    _, setup, _ = _build(build_parser().parse_args([*base[:-1], "cpu-tiny"]))
    assert setup.engine.max_num_seqs == PLAN_MAX_NUM_SEQS
    from reference_engine.serve_args import served_max_num_seqs

    for bad in (0, True, "2", 1.5):  # not a batch limit: ignored, the default stands
        assert served_max_num_seqs(str(_calibrated(tmp_path, served_max_num_seqs=bad))) is None
    assert served_max_num_seqs(str(tmp_path / "missing.json")) is None  # the profile's loading reports it
    assert served_max_num_seqs("roofline:h100/llama-3.1-8b") is None
