"""`slobench serve --faults`: the spec, the seeded draws, and a slobench run against a faulty engine whose
every injected fault is recorded as a failure of the right kind (counts compared with the server's own)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from reference_engine.faults import FaultInjector, FaultSpec, parse_faults
from slobench.cli import main
from slobench.run.rundir import load_run
from slobench.testing.process import EngineServerProcess


def test_spec_parses_and_the_draws_are_seeded_with_the_asked_rates() -> None:
    spec = parse_faults("error=0.02, reset=0.01,stall=0.005,slow-headers=0.01", seed=3)
    assert (spec.error, spec.reset, spec.stall, spec.slow_headers, spec.seed) == (0.02, 0.01, 0.005, 0.01, 3)
    draws = [FaultInjector(spec).draw() for _ in range(1)]
    a, b = FaultInjector(spec), FaultInjector(spec)
    seq_a, seq_b = [a.draw() for _ in range(20_000)], [b.draw() for _ in range(20_000)]
    assert seq_a == seq_b and draws[0] == seq_a[0]
    counts = Counter(f.kind for f in seq_a if f is not None)
    for kind, p in (("error", 0.02), ("reset", 0.01), ("stall", 0.005), ("slow-headers", 0.01)):
        assert abs(counts[kind] / 20_000 - p) < 4 * (p / 20_000) ** 0.5 + 1e-3, (kind, counts)
    assert all(1 <= f.after_chunks <= 4 for f in seq_a if f is not None)
    assert FaultInjector(FaultSpec(seed=1)).draw() is None


@pytest.mark.parametrize("bad", ["", "error", "error=x", "error=1.5", "error=-0.1", "error=nan", "boom=0.1",
                                 "error=0.1,error=0.2", "error=0.6,reset=0.6"])
def test_bad_specs_are_refused_with_a_reason(bad: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_faults(bad)


def test_serve_with_a_bad_spec_exits_2_with_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "slobench", "serve", "--executor", "modeled", "--port", "0",
                        "--faults", "error=0.5,reset=0.7"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["slobench serve: --faults: fault probabilities add up to 1.2; at most 1"]


def injected_counts(root_url: str) -> Counter[str]:
    text = httpx.get(root_url + "/metrics").text
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("slobench_engine:faults_injected_total{"):
            kind = line.split('kind="')[1].split('"')[0]
            out[kind] = int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest.mark.integration
def test_a_run_against_a_faulty_engine_records_each_fault_as_its_kind(tmp_path: Path) -> None:
    delay_s, timeout_s = 0.8, 2.5
    with EngineServerProcess("--executor", "modeled", "--faults", "error=0.1,reset=0.1,stall=0.1,slow-headers=0.1",
                             "--fault-seed", "5", "--fault-stall-s", "30", "--fault-delay-s", str(delay_s)) as srv:
        out = tmp_path / "run"
        rc = main(["run", "--url", srv.base_url, "--workload", "tiny", "--api", "completions", "--rate", "20",
                   "--num-requests", "160", "--output-len", "24", "--timeout", str(timeout_s), "--out", str(out),
                   "--no-progress", "--scrape-interval", "0", "--seed", "1",
                   "--server-profile", "vllm"])  # no capability probes: they would draw faults too
        injected = injected_counts(srv.root_url)
    assert rc in (0, 1)
    records = load_run(out).records
    assert len(records) == 160 and all(r.done_s is not None for r in records)  # every request accounted for
    http_500 = sum(1 for r in records if r.status == "error" and (r.error or "").startswith("HTTP 500"))
    resets = sum(1 for r in records if r.status == "error" and r.http_status == 200)
    timeouts = sum(1 for r in records if r.status == "timeout")
    slow = sum(1 for r in records if r.status == "ok" and r.first_token_s is not None and r.sent_s is not None
               and r.first_token_s - r.sent_s >= delay_s)
    assert min(injected["error"], injected["reset"], injected["stall"], injected["slow-headers"]) >= 5, injected
    assert (http_500, resets, timeouts, slow) == (injected["error"], injected["reset"], injected["stall"],
                                                  injected["slow-headers"]), [r.error for r in records if r.error]
    assert sum(1 for r in records if r.status == "ok") == 160 - http_500 - resets - timeouts
