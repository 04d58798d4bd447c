"""Whether measured runs agree with each other (`slobench.profiles.run_consistency`): runs the simulator makes
on one server at several rates agree, whatever the base profile; a run made on a server whose steps are 25%
slower is named, by about that share, at the same batch; `calibrate --from-runs` prints the check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.fleet.published import Run, simulated_times_ms, specs_of
from slobench.fleet.simulate import ModeledEngine, SimOptions, simulate_records
from slobench.profiles.run_consistency import decode_lives, describe, run_speeds

SERVER = CostProfile("server", 0.010, 5e-5, 4e-4, 2e-6)  # ~10.5 ms a decode step at batch 1


def _run(name: str, profile: CostProfile, rate_rps: float, n: int, seed: int, scheduler: str) -> Run:
    """Requests at `rate_rps` served by the simulator priced by `profile`; each time then off by ~3%."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate_rps, n - 1))])
    run = Run(name, starts, rng.integers(16, 400, n), rng.integers(20, 120, n), np.zeros(n), np.zeros(n))
    engine = ModeledEngine(profile, kv_blocks=4096, max_num_seqs=64, max_batched_tokens=2048, scheduler=scheduler)
    ttft, tpot = simulated_times_ms(simulate_records(specs_of(run), engine, SimOptions()))
    noise = rng.lognormal(0.0, 0.03, (2, n))
    return Run(name, starts, run.prompt_len, run.output_len, ttft * noise[0], tpot * noise[1])


@pytest.fixture(scope="module", params=["vllm-v0", "chunked"])
def runs(request: pytest.FixtureRequest) -> tuple[str, list[Run]]:
    s = request.param
    same = [_run(f"r{rate:g}", SERVER, rate, 120, seed, s) for rate, seed in ((8.0, 1), (14.0, 2), (20.0, 3))]
    return s, same


def test_runs_from_one_server_agree(runs: tuple[str, list[Run]]) -> None:
    scheduler, same = runs
    for base in (SERVER, SERVER.scaled(0.8)):  # a base profile that is off by a share moves no run against another
        speeds = run_speeds(same, base, scheduler)
        assert all(s.offset is not None for s in speeds)
        assert not any(s.flagged for s in speeds), describe(speeds)
        assert max(abs(s.offset or 0.0) for s in speeds) < 0.05


def test_a_run_on_a_slower_server_is_named(runs: tuple[str, list[Run]]) -> None:
    scheduler, same = runs
    slow = _run("slow", SERVER.scaled(1.25), 11.0, 120, 4, scheduler)
    speeds = run_speeds([*same, slow], SERVER, scheduler)
    by = {s.name: s for s in speeds}
    assert by["slow"].flagged and not any(by[n].flagged for n in ("r8", "r14", "r20"))
    # about a quarter (its prompts are slower too, and priced as the others'), the others within 5%
    assert 0.18 < (by["slow"].offset or 0.0) < 0.40
    assert max(abs(by[n].offset or 0.0) for n in ("r8", "r14", "r20")) < 0.05
    text = "\n".join(describe(speeds))
    assert "warning: slow decodes at a different speed" in text and "<- differs" in text


def test_each_life_is_timed_outside_the_prompts_beside_it(runs: tuple[str, list[Run]]) -> None:
    scheduler, same = runs
    lives = decode_lives(same[-1], SERVER, scheduler)
    # with the server's own profile a measured step is the profile's within the noise at every batch: the
    # prompts beside each life are priced, and the batch is averaged over its steps, not its time
    assert len(lives.batch) > 60 and lives.batch.max() > 4
    ratio = lives.measured_ms / lives.step_ms
    assert abs(float(np.median(ratio)) - 1) < 0.03
    big = lives.batch > np.median(lives.batch)
    assert abs(float(np.median(ratio[big])) - float(np.median(ratio[~big]))) < 0.04


def test_calibrate_from_runs_prints_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.json"
    base.write_text(SERVER.to_json())
    paths = []
    for r in (_run("a", SERVER, 8.0, 60, 1, "chunked"), _run("b", SERVER.scaled(1.3), 14.0, 60, 2, "chunked"),
              _run("c", SERVER, 20.0, 60, 3, "chunked")):
        p = tmp_path / f"{r.name}.jsonl"
        p.write_text("".join(json.dumps({"start_s": float(t), "prompt_len": int(a), "output_len": int(b),
                                         "ttft_ms": float(x), "tpot_ms": float(y)}) + "\n"
                             for t, a, b, x, y in zip(r.start_s, r.prompt_len, r.output_len, r.ttft_ms, r.tpot_ms,
                                                      strict=True)))
        paths.append(str(p))
    assert main(["calibrate", "--from-runs", *paths, "--profile", str(base), "-o", str(tmp_path / "cal.json"),
                 "--bootstrap", "20", "--kv-blocks", "4096", "--max-num-seqs", "64", "--max-batched-tokens", "2048",
                 "--fit-all"]) == 0
    out = capsys.readouterr().out
    assert "runs against each other" in out and "warning: b decodes at a different speed" in out
