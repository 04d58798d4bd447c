"""A simulation told the machine's speed as it varied (`SpeedTrace`): each step's modeled time is scaled by
the speed when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError
from slobench.fleet.replica import SpeedTrace
from slobench.fleet.simulate import simulate_records
from slobench.workload import generate, load_workload


def _knobs(tmp_path: Path, factor: float) -> dict[str, object]:
    path = tmp_path / f"p{factor}.json"
    path.write_text(CostProfile.load("cpu-tiny").scaled(factor).to_json())
    return {"profile": str(path), "kv_blocks": 256, "max_num_seqs": 16}


def _times(records: list) -> list[tuple]:  # type: ignore[type-arg]
    return [(r.first_token_s, r.done_s, tuple(r.chunk_times_s)) for r in records]


def _flat(records: list) -> list[float]:  # type: ignore[type-arg]
    return [t for r in records for t in (r.first_token_s, r.done_s, *r.chunk_times_s)]


SPECS = generate(load_workload("tiny"), rate_rps=60.0, num_requests=150, seed=4)  # queues build: steps batch


def test_a_constant_speed_is_a_scaled_profile(tmp_path: Path) -> None:
    slow = simulate_records(SPECS, _knobs(tmp_path, 1.3))
    traced = simulate_records(SPECS, _knobs(tmp_path, 1.0), speed=SpeedTrace((0.0,), (1.3,)))
    assert _flat(traced) == pytest.approx(_flat(slow), rel=1e-9, abs=1e-12)
    plain = simulate_records(SPECS, _knobs(tmp_path, 1.0))
    assert _times(plain) != _times(traced)


def test_the_speed_applies_from_its_time_on(tmp_path: Path) -> None:
    mid = SPECS[len(SPECS) // 2].arrival_s
    plain = simulate_records(SPECS, _knobs(tmp_path, 1.0))
    traced = simulate_records(SPECS, _knobs(tmp_path, 1.0), speed=SpeedTrace((0.0, mid), (1.0, 2.0)))
    done_before = [i for i, r in enumerate(plain) if r.done_s is not None and r.done_s < mid]
    assert done_before and all(_times(traced)[i] == _times(plain)[i] for i in done_before)
    assert sum(r.done_s for r in traced) > sum(r.done_s for r in plain)  # the second half ran at half speed
    # with jitter as well, the same draws in the same order: one replica still repeats itself
    a = simulate_records(SPECS, _knobs(tmp_path, 1.0), jitter_sd=0.1, speed=SpeedTrace((0.0, mid), (1.0, 2.0)))
    b = simulate_records(SPECS, _knobs(tmp_path, 1.0), jitter_sd=0.1, speed=SpeedTrace((0.0, mid), (1.0, 2.0)))
    assert _times(a) == _times(b) != _times(traced)


def test_bad_traces_are_refused() -> None:
    for times, factors, why in (((), (), "one factor"), ((0.0, 1.0), (1.0,), "one factor"),
                                ((1.0, 0.0), (1.0, 1.0), "ascending"), ((0.0,), (0.0,), "> 0")):
        with pytest.raises(SpecError, match=why):
            SpeedTrace(times, factors)
