"""The engine's step log: what each step held, how long it took, and a profile scored against it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.step_log import (
    FIELDS,
    StepLog,
    machine_speed,
    predicted_s,
    read_step_log,
    speed_ratio,
    speeds_across,
)
from slobench.testing import EngineServerProcess

PROFILE = CostProfile("lin", 0.004, 2e-5, 3e-4, 1e-6, attention_per_pair_s=1e-9, per_request_s=5e-4)


def run_engine(profile: CostProfile, log: Path, prompts: int = 12) -> LLMEngine:
    """A virtual-clock engine running `prompts` requests of several lengths, some sharing a prefix, with a
    step budget that chunks the long ones."""
    ex = ModeledExecutor(profile, block_size=16, num_blocks=256, vocab_size=256, eos_token_id=None)
    engine = LLMEngine(EngineConfig(block_size=16, num_blocks=256, max_model_len=1024, max_num_batched_tokens=256),
                       ex, VirtualClock())
    engine.step_log = StepLog(log, clock_now_s=engine.clock.now_s())
    shared = list(range(40, 104))
    for i in range(prompts):
        prompt = (shared if i % 3 == 0 else []) + [50 + (7 * i + k) % 150 for k in range(20 + 37 * i)]
        engine.add_request(prompt, max_tokens=3 + 2 * i, ignore_eos=True)
    while engine.has_work():
        engine.step()
    engine.step_log.close()
    return engine


def test_each_step_logged_with_what_the_profile_charged(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    engine = run_engine(PROFILE, log)
    rows = read_step_log(log)
    assert rows.header["format"] == "slobench-step-log/1"
    assert len(rows.steps) == engine.num_steps > 12
    assert all(set(FIELDS) <= set(s) for s in rows.steps)
    # the modeled executor's steps take exactly what the profile says of the logged composition: so the
    # log's features are the executor's (every term of the profile is non-zero, first tokens included)
    assert sum(s["s"] for s in rows.steps) == pytest.approx(engine.executor.total_modeled_s, rel=1e-4)  # type: ignore[attr-defined]
    assert predicted_s(PROFILE, rows.steps) == pytest.approx(engine.executor.total_modeled_s, rel=1e-4)  # type: ignore[attr-defined]
    assert sum(s["f"] for s in rows.steps) == 12  # every request's first token, once
    assert any(s["p"] and s["d"] for s in rows.steps)  # mixed steps are there
    assert any(s["p"] == 256 for s in rows.steps)  # and chunks at the budget
    # steps follow one another on the engine's clock
    assert all(b["t"] >= a["t"] + a["s"] - 1e-6 for a, b in zip(rows.steps, rows.steps[1:], strict=False))


def test_speed_ratio_finds_a_slower_machine(tmp_path: Path) -> None:
    """The engine steps 1.3x slower than the profile: the ratio says 1.3 however the steps were composed."""
    run_engine(PROFILE.scaled(1.3), tmp_path / "slow.jsonl")
    rows = read_step_log(tmp_path / "slow.jsonl")
    assert speed_ratio(PROFILE, rows.steps) == pytest.approx(1.3, rel=1e-3)
    assert speed_ratio(PROFILE.scaled(1.3), rows.steps) == pytest.approx(1.0, rel=1e-3)
    assert speed_ratio(PROFILE, []) is None


def test_machine_speed_compares_runs_of_other_compositions(tmp_path: Path) -> None:
    """A step-time model fitted on the reference's steps scores another run on its own steps: a run of other
    requests on a machine 1.25x slower reads 1.25, and the same machine reads 1, whatever the batches held."""
    lin = CostProfile("lin", 0.004, 2e-5, 3e-4, 1e-6)  # what fit_steps can represent exactly
    run_engine(lin, tmp_path / "ref.jsonl", prompts=12)
    run_engine(lin.scaled(1.25), tmp_path / "slow.jsonl", prompts=5)
    run_engine(lin, tmp_path / "same.jsonl", prompts=7)
    ref, slow, same = (read_step_log(tmp_path / f"{n}.jsonl").steps for n in ("ref", "slow", "same"))
    assert machine_speed(ref, slow) == pytest.approx(1.25, rel=2e-3)
    assert machine_speed(ref, same) == pytest.approx(1.0, rel=2e-3)
    assert machine_speed(ref[:3], slow) is None and machine_speed(ref, []) is None


def test_speeds_across_parts_are_against_their_mean(tmp_path: Path) -> None:
    lin = CostProfile("lin", 0.004, 2e-5, 3e-4, 1e-6)
    run_engine(lin, tmp_path / "a.jsonl", prompts=8)
    run_engine(lin.scaled(1.5), tmp_path / "b.jsonl", prompts=8)
    a, b = (read_step_log(tmp_path / f"{n}.jsonl").steps for n in ("a", "b"))
    fast, slow, none = speeds_across([a, b, []])
    assert none is None and fast is not None and slow is not None
    assert slow / fast == pytest.approx(1.5, rel=0.05)  # one model for both: their ratio is the machines'
    assert fast < 1 < slow


def test_the_demo_keeps_the_step_log_and_says_how_fast_each_point_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slobench.cli import main
    from slobench.cli.engine import _keep_step_log

    out = tmp_path / "demo"
    assert main(["demo", "--executor", "modeled", "--rates", "10,30", "--refine-knee", "0", "--num-requests", "30",
                 "--out", str(out), "--no-report"]) == 0
    text = capsys.readouterr().out
    said = re.search(r"machine speed \(the engine's own steps, engine-steps.jsonl\): the points ran x([0-9.]+) "
                     r"\((10|30) req/s\) to x([0-9.]+) \((10|30) req/s\) of the sweep's mean step time", text)
    assert said is not None, text
    # modeled steps sleep what the profile says, plus the OS's wake-up lateness (which a loaded machine
    # stretches: whether the spread passes the warning's 1.15 is the machine's, not asserted here)
    lo, hi = float(said[1]), float(said[3])
    assert 0.5 < lo <= hi < 2.0 and {said[2], said[4]} == {"10", "30"}
    rows = read_step_log(out / "engine-steps.jsonl")
    assert rows.header["executor"] == "modeled" and len(rows.steps) > 60
    # a machine whose speed moved between the points is said to have moved
    import reference_engine.step_log as step_log

    spare = tmp_path / "steps.jsonl"
    spare.write_text((out / "engine-steps.jsonl").read_text())
    monkeypatch.setattr(step_log, "speeds_across", lambda parts: [0.9, 1.2][: len(parts)])
    line = _keep_step_log(spare, out)
    assert line is not None and "x0.90 (10 req/s) to x1.20 (30 req/s)" in line and "moved during the sweep" in line
    assert not spare.exists()
    assert _keep_step_log(tmp_path / "gone.jsonl", tmp_path / "no-sweep") is None  # nothing measured: nothing said


def test_a_log_that_cannot_be_written_stops_and_the_engine_serves_on(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    engine = run_engine(PROFILE, log, prompts=2)  # closes the log at the end: every later write fails
    assert engine.step_log is not None and engine.step_log.failed is None
    n = engine.num_steps
    engine.add_request([60, 61, 62, 63], max_tokens=3, ignore_eos=True)
    while engine.has_work():
        engine.step()
    assert engine.num_steps == n + 3 and engine.step_log.failed  # it served; the log said why it stopped
    assert len(read_step_log(log).steps) == n


def test_between_selects_by_unix_time(tmp_path: Path) -> None:
    run_engine(PROFILE, tmp_path / "s.jsonl")
    rows = read_step_log(tmp_path / "s.jsonl")
    origin = rows.header["origin_unix"]
    mid = rows.steps[len(rows.steps) // 2]["t"]
    early, late = rows.between(origin - 1, origin + mid), rows.between(origin + mid, origin + 1e6)
    assert len(early) + len(late) == len(rows.steps) and early and late
    assert max(s["t"] for s in early) < mid <= min(s["t"] for s in late)


def test_read_step_log_errors_name_the_line(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    run_engine(PROFILE, log, prompts=3)
    text = log.read_text()
    n = len(read_step_log(log).steps)
    # a last line cut off mid-write (the server still stepping) is left out, not an error
    (tmp_path / "cut.jsonl").write_text(text + '{"t": 1.0, "s": 0.0')
    assert len(read_step_log(tmp_path / "cut.jsonl").steps) == n
    lines = text.splitlines()
    (tmp_path / "bad.jsonl").write_text("\n".join([*lines[:2], "not json", *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        read_step_log(tmp_path / "bad.jsonl")
    (tmp_path / "short.jsonl").write_text("\n".join([lines[0], '{"t": 1, "s": 2}']) + "\n")
    with pytest.raises(ValueError, match="line 2 lacks one of the fields"):
        read_step_log(tmp_path / "short.jsonl")
    (tmp_path / "nohead.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(ValueError, match="line 1 is not a step log header"):
        read_step_log(tmp_path / "nohead.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_step_log(tmp_path / "empty.jsonl")


def test_server_writes_the_log_as_it_serves(tmp_path: Path) -> None:
    """`--step-log` on the server: every step is on disk while it still runs, and the header's origin puts
    the steps at the wall-clock time they ran."""
    log = tmp_path / "server-steps.jsonl"
    with EngineServerProcess("--executor", "modeled", "--step-log", str(log)) as srv:
        t0 = time.time()
        r = httpx.post(srv.base_url + "/completions", json={"model": "tiny", "prompt": "hello there",
                                                            "max_tokens": 6, "ignore_eos": True}, timeout=30)
        t1 = time.time()
        assert r.status_code == 200
        rows = read_step_log(log)  # the server is still up: nothing waits for it to close the file
        assert rows.header["executor"] == "modeled"
        assert len(rows.steps) == 6  # one prefill that samples the first token, five decodes
        assert rows.steps[0]["p"] == r.json()["usage"]["prompt_tokens"] and rows.steps[0]["f"] == 1
        assert [s["d"] for s in rows.steps[1:]] == [1] * 5
        assert len(rows.between(t0 - 0.05, t1 + 0.05)) == 6


def test_server_refuses_an_unwritable_log(tmp_path: Path) -> None:
    from reference_engine.server import main

    with pytest.raises(SystemExit) as e:
        main(["--executor", "modeled", "--port", "0", "--step-log", str(tmp_path / "no" / "such" / "dir.jsonl")])
    assert e.value.code == 2
