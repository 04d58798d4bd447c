"""One probe seam (issue 12, item 2): a live run and a simulated one go through the same Probe and write
the same run directory; sweep and capacity drive probes and never import the runner."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from slobench.analysis.slo import SLO
from slobench.experiments.probe import LiveProbe, ProbeMeasure, VirtualProbe
from slobench.experiments.sweep import run_sweep
from slobench.fleet.simulate import ModeledEngine
from slobench.run.clock import Clock
from slobench.run.rundir import load_run
from slobench.run.runner import RunOptions
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess
from slobench.workload import generate, load_workload

SRC = Path(__file__).resolve().parent.parent / "slobench"
SLO_ = SLO.parse("ttft=500ms,tpot=50ms")
TINY = load_workload("tiny")


def make_specs(rate: float | None, seed: int) -> list:  # type: ignore[type-arg]
    return generate(TINY, rate_rps=rate, num_requests=12, seed=seed, input_len=16, output_len=6)


def _imported(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
    return mods


def test_sweep_and_capacity_never_import_the_runner() -> None:
    for name in ("sweep.py", "capacity.py"):
        assert "slobench.run.runner" not in _imported(SRC / "experiments" / name), name


async def test_live_and_virtual_probes_write_one_run_directory_shape(tmp_path: Path,
                                                                    token_server: TokenServerProcess) -> None:
    virtual = VirtualProbe(make_specs, ModeledEngine(), slo=SLO_)
    v = await virtual(8.0, 3, tmp_path / "virtual", {"made_by": "test", "rate_rps": 8.0})
    clock = Clock()
    options = TargetOptions(model=token_server.model, extra_body={"x_ttft_ms": 5, "x_itl_ms": 1})
    async with OpenAITarget(token_server.base_url, options, clock) as target:
        live = LiveProbe(make_specs, target, slo=SLO_, opts=RunOptions(progress=False), clock=clock)
        r = await live(8.0, 3, tmp_path / "live", {"made_by": "test", "rate_rps": 8.0})
    assert not v.interrupted and not r.interrupted
    for res, d in ((v, "virtual"), (r, "live")):
        run = load_run(tmp_path / d)
        assert len(run.records) == 12 and run.summary is not None
        assert run.summary.attainment.value == res.summary.attainment.value  # what it returned, on disk
        assert run.manifest["made_by"] == "test" and run.summary is not None and run.summary.num_ok == 12
    assert load_run(tmp_path / "virtual").manifest["clock"] == {"kind": "virtual"}
    # the same requests (same seed) went to both: the same prompt lengths, in the same order
    assert ([x.input_tokens for x in load_run(tmp_path / "virtual").records]
            == [x.input_tokens for x in load_run(tmp_path / "live").records])
    # what the terminal, the report and the gate read is there in both, under the same keys
    core = {"num_requests", "num_ok", "attainment", "ttft_s", "tpot_s"}
    assert core <= set(v.summary.to_dict()) and core <= set(r.summary.to_dict())


async def test_a_sweep_and_a_capacity_measure_drive_any_probe(tmp_path: Path) -> None:
    probe = VirtualProbe(make_specs, ModeledEngine(), slo=SLO_)
    doc = await run_sweep([2.0, 4.0], probe, out_dir=tmp_path / "sweep", slo=SLO_, manifest={"m": 1}, seed=5)
    assert [r["rate_rps"] for r in doc["runs"]] == [2.0, 4.0]
    assert json.loads((tmp_path / "sweep" / "rate-2" / "manifest.json").read_text())["rate_rps"] == 2.0
    seen: list[tuple[float, int]] = []
    measure = ProbeMeasure(probe, out_dir=tmp_path / "cap", manifest={"m": 1},
                           on_probe=lambda rate, seed, s: seen.append((rate, seed)))
    s = await measure(4.0, 7)
    assert s.run_dir == "probe-00-rate-4-seed-7" and s.rate_rps == 4.0 and seen == [(4.0, 7)]
    # the sweep's point and the probe at one rate differ only by seed: same rate, other requests
    assert (tmp_path / "cap" / "probe-00-rate-4-seed-7" / "summary.json").is_file()
