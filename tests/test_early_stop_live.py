"""Probes that stop early, live: `slobench sweep` against the bundled engine's HTTP server (modeled executor,
the CI gate's profile, 60 KV blocks: capacity ~24 req/s for `tiny` at 32 in / 16 out under ttft=300ms,
tpot=70ms). A rate twice the capacity stops with its record saying so; one well below it runs to its end;
`--no-early-stop` measures both whole."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_engine.server", "--executor", "modeled", "--profile",
         str(ROOT / "baselines" / "ci-profile.json"), "--kv-blocks", "60", "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("LISTENING"), f"the engine server did not start: {line!r}"
        yield int(line.split()[1])
    finally:
        proc.terminate()
        proc.wait(10)


def sweep(port: int, out: Path, *extra: str) -> dict[str, dict[str, Any]]:
    code = main(["sweep", "--url", f"http://127.0.0.1:{port}/v1", "--model", "tiny", "--workload", "tiny",
                 "--input-len", "32", "--output-len", "16", "--duration", "4", "--rates", "4,48",
                 "--slo", "ttft=300ms,tpot=70ms", "--out", str(out), "--no-progress", *extra])
    assert code in (0, 1)
    return {r: json.loads((out / f"rate-{r}" / "summary.json").read_text()) for r in ("4", "48")}


def test_a_probe_past_the_cliff_stops_early_and_one_below_does_not(port: int, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    summaries = sweep(port, tmp_path / "early")
    below, past = summaries["4"], summaries["48"]
    assert below.get("stopped_early") is None and below["num_requests"] == below["num_scheduled"]
    stopped = past["stopped_early"]
    assert stopped["known_misses"] > stopped["allowed_misses"]
    assert "no first token after the TTFT bound" in stopped["reason"]  # the queue, seen while it grows
    assert stopped["num_scheduled"] == past["num_scheduled"] > past["num_requests"]  # not measured to the end
    assert stopped["at_s"] < 4.0
    assert stopped["server_idle"].get("idle_after_s") is not None  # the server let go before the next rate
    att = past["attainment"]
    assert att["ci_high"] == stopped["attainment_at_most"] < 0.9 and att["value"] < 0.9
    assert not past.get("interrupted")
    records = [json.loads(line) for line in (tmp_path / "early" / "rate-48" / "requests.jsonl").open()]
    cancelled = [r for r in records if r["status"] == "cancelled"]
    assert cancelled and all("stopped early" in r["error"] for r in cancelled)
    assert "stopped early" in capsys.readouterr().out  # the table's attainment cell and its legend


def test_no_early_stop_measures_every_probe_to_its_end(port: int, tmp_path: Path) -> None:
    summaries = sweep(port, tmp_path / "whole", "--no-early-stop")
    for s in summaries.values():
        assert s.get("stopped_early") is None and s["num_requests"] == s["num_scheduled"]
    assert summaries["48"]["attainment"]["value"] < 0.9
