"""Capacity and the gate against the modeled reference engine.

Virtual-clock tests (in process, seconds): the capacity search agrees with a dense sweep's crossing, and
the gate fails a 15%-slower-step and a 30%-fewer-KV-blocks candidate while passing an identical one.
The integration test does the same through the real HTTP server and the `slobench` CLI.
"""

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from slobench.analysis.headline import crossing_rate
from slobench.analysis.slo import SLO
from slobench.cli import main
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import ModeledEngine
from slobench.gate import Samples, gate, rate_key

ROOT = Path(__file__).resolve().parents[1]
CI_PROFILE = ROOT / "baselines" / "ci-profile.json"
CI_SLO = SLO(ttft_s=0.3, tpot_s=0.07, target=0.9)
FIXED_RATE = 20.0


def ci_engine(name="baseline", **kw):
    """The CI gate's modeled engine: 60 KV blocks of 16, ci-profile step times."""
    return ModeledEngine(**{"profile": CI_PROFILE, "kv_blocks": 60, "name": name, **kw})


def virtual_measure(engine, *, num_requests, trial=0):
    """`tiny` at 32 in / 16 out on the virtual clock, with 1% per-step timing jitter."""
    return SimulatedMeasure("tiny", engine, CI_SLO, num_requests=num_requests, input_len=32, output_len=16,
                            jitter_sd=0.01, trial=trial)


async def test_capacity_agrees_with_dense_sweep_crossing():
    m = virtual_measure(ci_engine(), num_requests=100)
    res = await search_capacity(m, SearchOptions(start_rps=4.0, replicates=5))
    lo, hi = res.interval_rps
    assert lo < res.capacity_rps < hi
    # the dense sweep's estimate of the same quantity: each seed's own crossing, averaged over seeds
    rates = list(np.round(np.linspace(0.5 * res.capacity_rps, 1.5 * res.capacity_rps, 21), 3))
    per_seed = [[(await m(r, s)).attainment.value for r in rates] for s in range(500, 508)]
    crossings = [crossing_rate(rates, att, 0.9) for att in per_seed]
    assert all(att[0] > 0.9 > att[-1] for att in per_seed)  # the sweep spans every seed's crossing
    crossing = float(np.mean(crossings))
    assert lo <= crossing <= hi, (crossing, res.interval_rps)


async def _side(v, trial):
    m = virtual_measure(v, num_requests=100, trial=trial)
    s = Samples(v.name, {"name": "tiny", "hash": "v"}, CI_SLO.to_dict(), "test")
    res = await search_capacity(m, SearchOptions(start_rps=4.0, replicates=5))
    for rep in res.replicates:
        s.add("capacity", rep["seed"], rep["capacity_rps"], v.name)
    for seed in range(1, 6):
        for name, val in (await m(FIXED_RATE, seed)).flat_metrics().items():
            s.add(rate_key(name, FIXED_RATE), seed, val, v.name)
    return s


async def test_gate_fails_slower_steps_and_fewer_blocks_passes_identical():
    base = await _side(ci_engine(), trial=0)
    same = await _side(ci_engine(), trial=1)  # only the timing jitter differs
    slow = await _side(ci_engine("slow", step_scale=1.15), trial=1)
    small = await _side(ci_engine("small", kv_blocks=42), trial=1)
    assert gate(base, same).verdict == "pass"
    for cand in (slow, small):
        res = gate(base, cand)
        assert res.verdict == "regression", [c.message for c in res.checks]
        assert any(c.key == "capacity" and c.verdict == "regression" for c in res.checks)


# --- through the HTTP server and the CLI ---------------------------------------------------------------


def _start_server(tmp_path, name, kv_blocks=60, step_scale=1.0):
    profile = json.loads(CI_PROFILE.read_text())
    for k in ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
        profile[k] *= step_scale
    path = tmp_path / f"{name}-profile.json"
    path.write_text(json.dumps(profile))
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_engine.server", "--executor", "modeled", "--profile", str(path),
         "--kv-blocks", str(kv_blocks), "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if line.startswith("LISTENING"):
            return proc, int(line.split()[1])
        if not line:
            break
    proc.kill()
    raise RuntimeError(f"{name}: the server did not print LISTENING within 30 s")


def _measure_http(tmp_path, name, **server):
    proc, port = _start_server(tmp_path, name, **server)
    try:
        out = tmp_path / name
        code = main([
            "capacity", "--url", f"http://127.0.0.1:{port}/v1", "--model", "tiny", "--workload", "tiny",
            "--input-len", "32", "--output-len", "16", "--num-requests", "50", "--rates", f"{FIXED_RATE:g}",
            "--replicates", "5", "--slo", "ttft=300ms,tpot=70ms", "--out", str(out), "--no-progress",
        ])
        assert code == 0
        return out
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_gate_through_http_server(tmp_path, capsys):
    base = _measure_http(tmp_path, "base")
    doc = json.loads((base / "capacity.json").read_text())
    assert doc["mode"] == "fixed-rates" and len(doc["probes"]) == 5
    assert all((base / p["run_dir"] / "requests.jsonl").is_file() for p in doc["probes"])
    baseline_file = tmp_path / "baseline.json"
    assert main(["gate", "--candidate", str(base), "--write-baseline", str(baseline_file)]) == 0
    same = _measure_http(tmp_path, "same")
    small = _measure_http(tmp_path, "small", kv_blocks=42)
    capsys.readouterr()
    assert main(["gate", "--baseline", str(baseline_file), "--candidate", str(same)]) != 1
    # the 15%-slower-step candidate is gated on the virtual clock above (it keeps this test under a minute)
    assert main(["gate", "--baseline", str(baseline_file), "--candidate", str(small),
                 "--junit", str(tmp_path / "j.xml")]) == 1
    assert "<failure" in (tmp_path / "j.xml").read_text()
