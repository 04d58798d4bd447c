"""Client-side routing over several replicas (slobench.fleet.client_routed, slobench.fleet.routing): the policies,
agreement with the simulated fleet, and `--url A,B` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slobench.analysis.metrics import RecordArrays
from slobench.cli import main
from slobench.errors import SpecError
from slobench.fleet.client_routed import FleetTarget
from slobench.fleet.routing import Router
from slobench.fleet.simulate import simulate_records
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase
from slobench.targets.engine import EngineTarget
from slobench.testing import TokenServerProcess
from slobench.workload import generate, load_workload

QUIET = RunOptions(progress=False)
KNOBS = {"executor": "modeled", "profile": "cpu-tiny", "kv_blocks": 512}


def test_router_policies() -> None:
    r = Router("least-outstanding", 3)
    picks = []
    for _ in range(5):
        i = r.pick((1, 2, 3))
        r.started(i)
        picks.append(i)
    assert picks == [0, 1, 2, 0, 1] and r.outstanding == [2, 2, 1]
    r.finished(0)
    r.finished(0)
    assert r.pick((9,)) == 0
    rr = Router("round-robin", 2)
    assert [rr.pick("x") for _ in range(4)] == [0, 1, 0, 1]
    aff = Router("prefix-affinity", 4)
    assert len({aff.pick("same system prompt " * 20 + str(k)) for k in range(5)}) == 1  # only the head counts
    with pytest.raises(SpecError, match="router"):
        Router("random", 2)
    with pytest.raises(SpecError, match="replicas"):
        Router("round-robin", 0)


async def test_in_process_fleet_matches_the_simulated_fleet() -> None:
    # The same 120 requests on two real-time in-process engines behind the client's router and on the
    # simulated fleet: same split, and TTFT within a few ms (real time adds ~0.2 ms a step).
    specs = generate(load_workload("tiny"), rate_rps=20.0, num_requests=120, seed=5)
    fleet: dict = {}
    simulated = simulate_records(specs, KNOBS, replicas=2, fleet=fleet)
    clock = Clock()
    async with FleetTarget([EngineTarget(KNOBS, clock, model_name="tiny") for _ in range(2)]) as target:
        res = await run(specs, target, opts=QUIET, handle_sigint=False)
    assert res.summary.num_ok == 120
    assert res.summary.fleet["replicas"] == 2 and sum(res.summary.fleet["requests_per_replica"]) == 120
    assert min(res.summary.fleet["requests_per_replica"]) >= 40
    real = RecordArrays.from_records(res.records)
    sim = RecordArrays.from_records(simulated)
    assert abs(np.median(real.ttft_s) - np.median(sim.ttft_s)) < 0.004, (np.median(real.ttft_s), np.median(sim.ttft_s))
    assert (real.output_tokens == sim.output_tokens).all()


def test_fleet_targets_must_share_the_run_clock() -> None:
    class T(TargetBase):
        def __init__(self) -> None:
            self.clock = Clock()

    with pytest.raises(SpecError, match="share one clock"):
        FleetTarget([T(), T()])
    with pytest.raises(SpecError, match="at least one"):
        FleetTarget([])


def test_cli_several_urls(tmp_path: Path) -> None:
    with TokenServerProcess(ttft_ms=20, itl_ms=2, log=True) as a, TokenServerProcess(ttft_ms=20, itl_ms=2, log=True) as b:
        out = tmp_path / "run"
        rc = main(["run", "--url", f"{a.base_url},{b.base_url}", "--router", "round-robin", "--workload", "tiny",
                   "--rate", "40", "--num-requests", "30", "--slo", "ttft=5s", "--out", str(out), "--no-progress",
                   "--scrape-interval", "0.2"])
        assert rc == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_ok"] == 30 and summary["fleet"]["requests_per_replica"] == [15, 15]
        assert [r["num_requests"] for r in summary["per_replica"]] == [15, 15]
        # on the SLO's clock (from the scheduled send): the 20 ms schedule plus client and server lateness,
        # which two servers and the client on 2 busy cores push to ~7 ms
        assert all(0.019 < r["ttft_p50_s"] < 0.040 and r["attainment"] == 1.0 for r in summary["per_replica"]), (
            summary["per_replica"])
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["target"]["fleet"] == {"replicas": 2, "router": "round-robin"}
        assert len(a.read_log()) >= 15 and len(b.read_log()) >= 15  # both servers were loaded
        first = json.loads((out / "server_metrics.jsonl").read_text().splitlines()[0])["samples"]
        assert any('replica="0"' in k for k in first) and any('replica="1"' in k for k in first)
    assert main(["run", "--url", " , ", "--workload", "tiny", "--num-requests", "2", "--no-progress",
                 "--out", str(tmp_path / "x")]) == 2


def test_prompts_for_affinity_are_hashed_by_their_head() -> None:
    r = Router("prefix-balanced", 3)
    spec = RequestSpec(0, 0.0, tuple(range(100, 200)), 100, 4)
    home = r.pick(spec.prompt)
    assert home == r.pick(tuple(range(100, 164)) + (7,) * 50)  # same first 64 ids, same home


def test_per_replica_summary_shows_an_affinity_hot_spot() -> None:
    from slobench.analysis.slo import SLO
    from slobench.fleet.simulate import simulate_run
    from slobench.report.terminal import per_replica_text

    specs = generate(load_workload("system-prompts"), rate_rps=20.0, duration_s=20, seed=2)
    knobs = {"profile": "h100-llama-1b", "kv_blocks": 300}
    slo = SLO.parse("ttft=300ms,tpot=40ms")
    recs, summary = simulate_run(specs, knobs, slo=slo, replicas=4, router="prefix-affinity")
    rows = summary.per_replica
    routed = [r for r in recs if r.replica is not None]  # requests the engine refused at once were never routed
    assert [r.key for r in rows] == [0, 1, 2, 3] and sum(r.num_requests for r in rows) == len(routed)
    assert len(routed) >= 0.95 * len(specs) and all(r.error for r in recs if r.replica is None)
    busiest = max(rows, key=lambda r: r.num_requests)
    assert busiest.num_requests > 1.3 * len(specs) / 4  # the popular prompt's home
    assert busiest.ttft_p99_s == max(r.ttft_p99_s for r in rows)
    text = per_replica_text(rows)
    assert text.startswith("per replica") and text.count("#") == 4
    _, single = simulate_run(specs, knobs, slo=slo)
    assert not single.per_replica and "per_replica" not in single.to_dict()  # one engine: no replica field


def test_least_tokens_weighs_requests_by_their_tokens() -> None:
    r = Router("least-tokens", 2)
    r.started(0, 5000)  # one long document on replica 0
    r.started(1, 100)
    r.started(1, 100)
    assert r.pick("x") == 1  # two short requests weigh less than one long one
    lo = Router("least-outstanding", 2)
    lo.started(0, 5000)
    lo.started(1, 100)
    lo.started(1, 100)
    assert lo.pick("x") == 0
    r.finished(0, 5000)
    assert r.outstanding_tokens == [0, 200] and r.pick("x") == 0
