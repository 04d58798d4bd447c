"""`sweep --rates auto` on the bundled engine (the demo's engine, SLO and workload, simulated in process with
the modeled executor): whatever the step cost, the rates it picks straddle the cliff.

The old demo swept fixed rates 4-32 req/s: on a machine fast enough every rate met the SLO and no cliff
showed. Here the engine's step cost is 1x and 4x the demo's profile; each sweep must hold a rate that meets
the SLO below a rate that misses it (or runs past capacity), its headline a crossing inside the range.
Only structure is asserted (virtual clock: no wall time involved).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.summary import RunSummary
from slobench.cli import main
from slobench.cli.engine import DEMO_SLO, demo_engine_args
from slobench.experiments.auto_rates import (
    POINT_FACTORS,
    POINT_SERVICE_TIMES,
    AutoPlan,
    RunSize,
    plan_rates,
    straddling_rates,
)

TARGET = 0.9


def demo_sweep_args(profile: str) -> list[str]:
    """The demo's engine knobs (its modeled executor with `profile`), workload and SLO, on the simulator."""
    engine = demo_engine_args("modeled", profile)
    knobs = [a for a in engine if a not in ("--executor", "modeled")]
    return ["sweep", "--simulate", *knobs, "--workload", "tiny", "--slo", DEMO_SLO, "--rates", "auto"]


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_auto_rates_straddle_the_cliff_at_any_step_cost(tmp_path: Path, scale: float) -> None:
    profile = tmp_path / f"cpu-tiny-x{scale:g}.json"
    profile.write_text(CostProfile.load("cpu-tiny").scaled(scale).to_json())
    out = tmp_path / "sweep"
    assert main([*demo_sweep_args(str(profile)), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "sweep.json").read_text())
    plan = doc["auto_rates"]
    rates = [r["rate_rps"] for r in doc["runs"]]
    assert rates == plan["rates_rps"] and len(rates) == len(POINT_FACTORS)
    # the bracket doubled until a probe missed: its two edges, a factor two apart
    lo, hi = plan["bracket_rps"]
    assert lo is not None and hi is not None and hi == pytest.approx(2 * lo, rel=0.01)
    summaries = {r["rate_rps"]: json.loads((out / r["run_dir"] / "summary.json").read_text()) for r in doc["runs"]}
    first, last = summaries[min(rates)], summaries[max(rates)]
    assert first["attainment"]["value"] >= TARGET and not (first.get("queue_drift") or {}).get("overloaded")
    assert last["attainment"]["value"] < TARGET or last["queue_drift"]["overloaded"]
    h = doc["headline"]
    assert not h["is_lower_bound"] and min(rates) <= h["max_rate_meeting_rps"] < max(rates)
    # every point as long as the same number of service times: a slower engine, longer points
    assert plan["point_duration_s"] == pytest.approx(POINT_SERVICE_TIMES * plan["service_s"])
    for r in rates:
        a = summaries[r]
        assert a["num_requests"] >= 40


def test_auto_points_scale_with_the_service_time() -> None:
    fast = AutoPlan(0.1, (10.0, 20.0), 11.0, straddling_rates(11.0, 20.0), 8.0, ())
    assert fast.size(11.0) == RunSize(duration_s=8.0)
    assert fast.size(1.0) == RunSize(duration_s=40.0)  # a low rate still holds 40 requests
    rates = straddling_rates(11.0, 20.0)
    assert rates[0] < 11.0 * 0.5 and 11.0 in rates and rates[-1] == 22.0 and sum(r > 11.0 for r in rates) == 2
    assert straddling_rates(11.0, 30.0)[-1] == 30.0  # the top reaches the rate the bracket saw miss


def test_auto_needs_an_slo_and_its_own_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sweep", "--simulate", "--workload", "tiny", "--rates", "auto", "--out", str(tmp_path / "s")]
    assert main(base) == 2
    assert "--rates auto looks for the SLO's crossing: give --slo too" in capsys.readouterr().err
    assert main([*base, "--slo", DEMO_SLO, "--num-requests", "50"]) == 2
    assert "drop --num-requests" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def fake_measure(capacity_rps: float, service_s: float, seen: list[tuple[float, RunSize]],
                 cold_s: float | None = None) -> Any:
    """A server meeting the SLO below `capacity_rps` and missing it above; its first probe's requests take
    `cold_s` (a cold engine) when given."""

    async def measure(rate: float, size: RunSize, name: str) -> RunSummary:
        e2e = cold_s if cold_s is not None and not seen else service_s
        seen.append((rate, size))
        value = 1.0 if rate <= capacity_rps else 0.3
        s = RunSummary.from_dict({"num_requests": 50, "num_ok": 50, "e2e_s": {"p50": e2e},
                                  "attainment": {"value": value, "num_requests": 50}})
        return replace(s, rate_rps=rate)

    return measure


def test_the_bracket_doubles_from_one_request_per_service_time() -> None:
    seen: list[tuple[float, RunSize]] = []
    plan = asyncio.run(plan_rates(fake_measure(37.0, 0.1, seen), TARGET))
    assert [r for r, _ in seen] == [4.0, 10.0, 20.0, 40.0]  # the service probe, then 1/0.1 s doubled
    assert plan.bracket_rps == (20.0, 40.0) and 20 <= plan.crossing_rps < 40
    assert plan.rates_rps[-1] >= 40.0 and min(plan.rates_rps) < 20.0
    assert seen[0][1] == RunSize(num_requests=8) and seen[1][1].duration_s == pytest.approx(2.0)  # 20 requests at 10 req/s


def test_a_first_rate_that_misses_is_halved_a_few_times_at_most() -> None:
    seen: list[tuple[float, RunSize]] = []
    plan = asyncio.run(plan_rates(fake_measure(0.0, 0.5, seen), TARGET))
    assert [r for r, _ in seen] == [4.0, 2.0, 1.0, 0.5, 0.25]
    assert plan.bracket_rps == (None, 0.25)


def test_a_cold_first_probe_does_not_stretch_the_points() -> None:
    seen: list[tuple[float, RunSize]] = []
    plan = asyncio.run(plan_rates(fake_measure(37.0, 0.1, seen, cold_s=0.5), TARGET))
    assert [r for r, _ in seen][:2] == [4.0, 2.0]  # the bracket starts from the cold service time ...
    assert plan.service_s == 0.1 and plan.point_duration_s == pytest.approx(POINT_SERVICE_TIMES * 0.1)  # ... the points not
