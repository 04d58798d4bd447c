"""The planner's evaluations as Ray tasks (`slobench plan --ray`) give the plan one process gives.

Ray left to itself reaches for this machine's network address, so the Ray test runs inside a network
namespace of its own where only loopback exists, as tests/test_ray_pool.py does: the launcher re-runs this
file under `unshare -n` with SLOBENCH_RAY_NETNS=1. It skips when ray is not installed or unshare is not
permitted, unless SLOBENCH_REQUIRE_RAY=1 (CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.fleet.simulate import ModeledEngine
from slobench.plan import PlanOptions, Setup, plan_day
from slobench.plan_day import DayRecipe
from slobench.plan_pool import PlanPool, windows_for
from slobench.slo import SLO
from slobench.workload import WorkloadSpec

pytestmark = pytest.mark.integration  # starts Ray (tens of seconds), as tests/test_ray_pool.py
IN_NETNS = os.environ.get("SLOBENCH_RAY_NETNS") == "1"
REQUIRE = os.environ.get("SLOBENCH_REQUIRE_RAY") == "1"
DAY = {
    "name": "raydays",
    "class": {"doc": {"input": {"dist": "lognormal", "median": 1200, "p99": 3000, "min": 256, "max": 3072},
                      "output": {"dist": "lognormal", "median": 8, "p99": 24, "min": 2, "max": 32}},
              "gen": {"input": {"dist": "lognormal", "median": 64, "p99": 200, "min": 16, "max": 256},
                      "output": {"dist": "lognormal", "median": 40, "p99": 100, "min": 8, "max": 128}}},
    "phase": [{"name": "am", "duration_s": 10, "rate_rps": 6, "mix": {"doc": 1}},
              {"name": "pm", "duration_s": 10, "rate_rps": 4, "mix": {"gen": 1}}],
}  # fmt: skip


def _why_not_netns() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'slobench[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip not found"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n not permitted here: {probe.stderr.strip()[:200]}"
    return None


def test_ray_plan_in_its_own_network_namespace() -> None:
    if IN_NETNS:
        pytest.skip("this is the launcher; the test is running")
    why = _why_not_netns()
    if why is not None:
        if REQUIRE:
            pytest.fail(f"SLOBENCH_REQUIRE_RAY=1 but {why}")
        pytest.skip(why)
    env = {**os.environ, "SLOBENCH_RAY_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider -x "$1"'
    proc = subprocess.run(["unshare", "-n", "bash", "-c", cmd, sys.executable, __file__], env=env,
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " skipped" in proc.stdout, tail


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    rc = main(["plan", "--workload", "day", "--slo", "ttft=1s", "--ray", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install 'slobench[ray]'" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(not IN_NETNS, reason="runs inside its own network namespace (see the launcher test)")
def test_ray_tasks_give_the_serial_plan() -> None:
    recipe = DayRecipe(workload=WorkloadSpec.from_dict(DAY), compression=360.0, window_s=3600.0, max_requests=30)
    setup = Setup(ModeledEngine("cpu-tiny", kv_blocks=1024, max_num_seqs=32, max_model_len=4096),
                  SLO.parse("ttft=400ms,tpot=20ms,target=0.9"))  # fmt: skip
    options = PlanOptions(max_instances=4, switch_s=360.0, profile_requests=20, hold=1)
    with PlanPool(recipe, setup) as pool:
        serial = plan_day(pool, windows_for(recipe), recipe, setup, options)
    with PlanPool(recipe, setup, ray="local") as pool:
        assert pool.kind == "ray(local)"
        distributed = plan_day(pool, windows_for(recipe), recipe, setup, options)
    assert distributed == serial
    assert serial["num_evaluations"] > 5
