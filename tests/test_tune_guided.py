"""`slobench tune --simulate-first K --profile P`: every configuration simulated before any server starts,
the top K measured live, the others "simulated only" rows; the guided block and whether the ranking held."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slobench.tune.configs import TuneConfig
from slobench.tune.guided import Guide, guided_block, simulated_rows
from slobench.tune.result import TuneRow
from slobench.tune.search import SearchResult
from slobench.tune.table import print_table

SHORT = ["--workload", "tiny", "--slo", "ttft=200ms,tpot=50ms", "--replicates", "2", "--num-requests", "8",
         "--capacity-args", "--tolerance 0.5 --start-rate 8 --max-probes 3"]


def tune(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slobench", "tune", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def test_simulate_first_one_of_three_measures_the_simulated_best_live(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    done = tune("--param", "max_num_seqs=1,4,16", "--simulate-first", "1", "--profile", "cpu-tiny",
                "--out", str(out), *SHORT, timeout_s=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "tune.json").read_text())
    rows = doc["configs"]
    assert len(rows) == 3
    live = [r for r in rows if r["status"] == "measured"]
    assert len(live) == 1 and sum(r["status"] == "simulated only" for r in rows) == 2
    assert all(r["simulated_capacity"]["capacity_rps"] is not None for r in rows)
    assert live[0]["simulated_capacity"]["capacity_rps"] == max(r["simulated_capacity"]["capacity_rps"] for r in rows)
    assert live[0]["capacity"]["capacity_rps"] is not None and (out / live[0]["server_log"]).exists()
    for row in rows:  # no server was started for a configuration left to the simulator
        if row["status"] == "simulated only":
            assert row["capacity"] is None and not (out / row["name"] / "server.log").exists()
    assert doc["best"] == live[0]["params"]
    guided = doc["guided"]
    assert guided["k"] == 1 and guided["profile"] == "cpu-tiny" and guided["ranking_held"] is True
    assert guided["simulated_order"] == guided["measured_order"] == [live[0]["name"]]
    assert "simulated req/s" in done.stdout.splitlines()[0]
    assert "guided (--simulate-first 1, profile cpu-tiny)" in done.stdout


def test_without_a_profile_the_first_configuration_calibrates_the_guide(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    done = tune("--param", "max_num_seqs=1,4,16", "--simulate-first", "1", "--out", str(out), *SHORT, timeout_s=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "tune.json").read_text())
    rows = {r["name"]: r for r in doc["configs"]}
    first = rows["max_num_seqs-1"]
    assert first["status"] == "measured" and (out / first["server_log"]).exists()  # measured before any simulation
    cal = doc["guided"]["calibrated"]
    assert cal["base"] == "cpu-tiny" and cal["source"] == "max_num_seqs-1" and cal["reason"] is None
    fitted = json.loads(Path(cal["profile"]).read_text())
    assert fitted["provenance"]["calibrated_from_runs"]["base_profile"] == "cpu-tiny"
    assert {Path(i["path"]).parent for i in fitted["provenance"]["calibrated_from_runs"]["inputs"]} == {
        out / first["capacity_dir"]}  # fitted on the first configuration's own probes
    assert doc["guided"]["profile"] == cal["profile"] and doc["settings"]["guided"]["calibrate"] is True
    for row in rows.values():  # every configuration simulated with the fitted profile, the first included
        assert row["simulated_capacity"]["capacity_rps"] is not None
        sim = json.loads((out / row["name"] / "simulated" / "capacity.json").read_text())
        assert sim["manifest"]["target"]["knobs"]["profile"] == cal["profile"]
    best_simulated = max(rows.values(), key=lambda r: r["simulated_capacity"]["capacity_rps"])
    measured = {n for n, r in rows.items() if r["status"] == "measured"}
    assert measured == {"max_num_seqs-1", best_simulated["name"]}  # the first, and the top 1 by the fitted profile
    assert "calibrated on max_num_seqs-1" in done.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--serve-cmd", "srv --port {port} --max-num-seqs {max_num_seqs}", "--param", "max_num_seqs=1,16",
      "--simulate-first", "1"], "with --serve-cmd needs --profile"),
    (["--param", "max_num_seqs=1,16", "--profile", "cpu-tiny"], "give --simulate-first K"),
    (["--param", "max_num_seqs=1,16", "--calibrate"], "--calibrate belongs to --simulate-first"),
    (["--param", "max_num_seqs=1,16", "--simulate-first", "0", "--profile", "cpu-tiny"], "1 or more"),
    (["--simulate", "--param", "max_num_seqs=1,16", "--simulate-first", "1", "--profile", "cpu-tiny"],
     "takes no --simulate"),
    (["--serve-cmd", "srv --port {port} --slots {slots}", "--param", "slots=4,8", "--simulate-first", "1",
      "--profile", "cpu-tiny"], "no parameter (slots) is a knob of the bundled engine"),
])
def test_simulate_first_refused_before_anything_starts(tmp_path: Path, args: list[str], says: str) -> None:
    out = tmp_path / "tune"
    done = tune(*args, "--workload", "tiny", "--slo", "ttft=200ms", "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert not out.exists()


def test_template_parameters_map_to_engine_knobs_where_named_so(tmp_path: Path) -> None:
    done = tune("--serve-cmd", "srv --port {port} --max-num-seqs {max_num_seqs} --tokens {tokens}", "--param",
                "max_num_seqs=64", "--param", "tokens=2048", "--simulate-first", "1", "--profile", "cpu-tiny",
                "--workload", "tiny", "--slo", "ttft=200ms", "--dry-run")
    assert done.returncode == 0, done.stderr
    sim = next(line for line in done.stdout.splitlines() if " simulated: " in line)
    assert "--simulate --profile cpu-tiny --max-num-seqs 64" in sim
    flags = sim.split(" capacity ", 1)[1].split(" --out ")[0]
    assert "2048" not in flags and "--tokens" not in flags
    assert "the simulation passes over: tokens (no knob of the bundled engine)" in done.stdout


def row(name: str, measured: float | None, simulated: float, gpus: int = 1) -> TuneRow:
    cap = None if measured is None else {"capacity_rps": measured, "interval_rps": [measured, measured]}
    return TuneRow(name, {"n": name}, "measured" if cap else "simulated only", gpus, ["srv"], capacity=cap,
                   simulated_capacity={"capacity_rps": simulated, "interval_rps": [simulated, simulated]})


def test_ranking_held_or_not_and_the_table_says_which() -> None:
    guide = Guide(3, "cpu-tiny")
    inverted = guided_block([row("a", 5.0, 30.0), row("b", 10.0, 20.0), row("c", None, 40.0)], guide, ["tokens"])
    assert inverted["ranking_held"] is False
    assert inverted["simulated_order"] == ["a", "b"] and inverted["measured_order"] == ["b", "a"]
    kept = guided_block([row("a", 12.0, 30.0, gpus=2), row("b", 10.0, 20.0)], guide, [])
    assert kept["ranking_held"] is True  # per GPU: simulated 15 < 20 and measured 6 < 10 agree
    assert kept["simulated_order"] == ["b", "a"]
    tied = guided_block([row("a", 10.0, 30.0), row("b", 12.0, 30.0)], guide, [])
    assert tied["ranking_held"] is True  # a tie in the simulation contradicts no measured order
    text = io.StringIO()
    print_table([row("a", 5.0, 30.0), row("b", 10.0, 20.0), row("c", None, 40.0)], text, guided=inverted)
    lines = text.getvalue().splitlines()
    assert lines[0].split()[-2:] == ["simulated", "req/s"]
    assert lines[1].split()[1:3] == ["n=b", "measured"]  # ranked by measured capacity, the simulated-only last
    assert lines[3].split()[1:4] == ["n=c", "simulated", "only"]
    assert "did not hold: simulated a > b, measured b > a" in text.getvalue()
    assert "passed over: tokens" in text.getvalue()


def test_a_simulation_too_spread_for_a_capacity_ranks_by_its_seeds_crossings() -> None:
    """Short probes leave a simulated search inconclusive; ranked last, a configuration whose seeds all crossed
    high would never be measured."""
    configs = [TuneConfig(n, {"n": n}, gpus, ("srv",)) for n, gpus in (("low", 1), ("spread", 1), ("none", 1),
                                                                         ("two-gpus", 2))]
    sims = {
        "low": SearchResult({"capacity_rps": 20.0, "interval_rps": [15.0, 25.0], "seed_crossings_rps": [18, 22]},
                            None, []),
        "spread": SearchResult({"capacity_rps": None, "interval_rps": None, "seed_crossings_rps": [40.0, 65.0, 150.0]},
                               "the capacity's interval reaches 0 req/s", []),
        "none": SearchResult(None, "slobench capacity exited 2", []),
        "two-gpus": SearchResult({"capacity_rps": 60.0, "interval_rps": [50.0, 70.0]}, None, []),
    }
    assert [r.name for r in simulated_rows(configs, sims)] == ["spread", "two-gpus", "low", "none"]
