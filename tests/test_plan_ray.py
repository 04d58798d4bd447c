"""The planner's evaluations as Ray tasks (`slobench plan --ray`) give the plan one process gives.

The Ray test runs inside a network namespace of its own where only loopback exists (tests/netns.py), as
tests/test_ray_pool.py's do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slobench.analysis.slo import SLO
from slobench.cli import main
from slobench.fleet.plan import PlanOptions, Setup, plan_day
from slobench.fleet.plan_day import DayRecipe
from slobench.fleet.plan_pool import PlanPool, windows_for
from slobench.fleet.simulate import ModeledEngine
from slobench.workload import WorkloadSpec
from tests.netns import in_netns, rerun_in_own_netns

pytestmark = pytest.mark.integration  # starts Ray (tens of seconds), as tests/test_ray_pool.py
DAY = {
    "name": "raydays",
    "class": {"doc": {"input": {"dist": "lognormal", "median": 1200, "p99": 3000, "min": 256, "max": 3072},
                      "output": {"dist": "lognormal", "median": 8, "p99": 24, "min": 2, "max": 32}},
              "gen": {"input": {"dist": "lognormal", "median": 64, "p99": 200, "min": 16, "max": 256},
                      "output": {"dist": "lognormal", "median": 40, "p99": 100, "min": 8, "max": 128}}},
    "phase": [{"name": "am", "duration_s": 10, "rate_rps": 6, "mix": {"doc": 1}},
              {"name": "pm", "duration_s": 10, "rate_rps": 4, "mix": {"gen": 1}}],
}


def test_ray_plan_in_its_own_network_namespace() -> None:
    rerun_in_own_netns(__file__, timeout_s=600)


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    rc = main(["plan", "--workload", "day", "--slo", "ttft=1s", "--ray", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install 'slobench[ray]'" in err and len(err.strip().splitlines()) == 1, err


@in_netns
def test_ray_tasks_give_the_serial_plan() -> None:
    recipe = DayRecipe(workload=WorkloadSpec.from_dict(DAY), compression=360.0, window_s=3600.0, max_requests=30)
    setup = Setup(ModeledEngine("cpu-tiny", kv_blocks=1024, max_num_seqs=32, max_model_len=4096),
                  SLO.parse("ttft=400ms,tpot=20ms,target=0.9"))
    options = PlanOptions(max_instances=4, switch_s=360.0, profile_requests=20, hold=1)
    with PlanPool(recipe, setup) as pool:
        serial = plan_day(pool, windows_for(recipe), recipe, setup, options)
    with PlanPool(recipe, setup, ray="local") as pool:
        assert pool.kind == "ray(local)"
        distributed = plan_day(pool, windows_for(recipe), recipe, setup, options)
    assert distributed == serial
    assert serial["num_evaluations"] > 5
