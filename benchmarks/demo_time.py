"""How long `make demo` takes, and whether it shows the cliff: `slobench demo` run as a user runs it.

Each case starts the bundled engine over HTTP on 127.0.0.1 and sweeps with `--rates auto` (the demo's
default): a service probe, a doubling bracket, then rates straddling the crossing, each point as long as
a number of the engine's service times. Per case it prints the wall time (engine start to the last line),
the service time, the rates swept, the headline's crossing, the rates marked past capacity (▲) and
whether the crossing lies inside the swept range; `--json` writes the same figures.
Figures: docs/measurements/demo_time.md.

    python benchmarks/demo_time.py --cases torch,modeled,modeled-x4 --json docs/measurements/demo_time.json"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reference_engine.executor.modeled_executor import CostProfile


def demo_args(case: str, tmp: Path) -> list[str]:
    """`torch`: the demo's default engine where torch is installed; `modeled`: the cpu-tiny cost profile;
    `modeled-xK`: that profile with every step cost K times as long (a slower machine)."""
    if case == "torch":
        return ["--executor", "torch"]
    if case == "modeled":
        return ["--executor", "modeled"]
    if case.startswith("modeled-x"):
        scale = float(case.removeprefix("modeled-x"))
        path = tmp / f"cpu-tiny-x{scale:g}.json"
        path.write_text(CostProfile.load("cpu-tiny").scaled(scale).to_json())
        return ["--executor", "modeled", "--profile", str(path)]
    raise SystemExit(f"unknown case {case!r}: torch, modeled or modeled-xK")


def run_case(case: str, tmp: Path) -> dict[str, Any]:
    out = tmp / case
    argv = [sys.executable, "-m", "slobench", "demo", *demo_args(case, tmp), "--out", str(out), "--no-report",
            "--no-progress"]
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall_s = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{case}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    doc = json.loads((out / "sweep.json").read_text())
    rates = [r["rate_rps"] for r in doc["runs"]]
    h = doc["headline"] or {}
    crossing = h.get("max_rate_meeting_rps")
    past = h.get("past_capacity_rps") or []
    return {"case": case, "wall_s": round(wall_s, 1), "service_ms": round(doc["auto_rates"]["service_s"] * 1e3, 1),
            "point_s": round(doc["auto_rates"]["point_duration_s"], 1), "rates_rps": rates, "crossing_rps": crossing,
            "past_capacity_rps": past,
            "crossing_inside": bool(crossing is not None and not h.get("is_lower_bound") and min(rates) <= crossing < max(rates))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="torch,modeled", help="comma-separated: torch, modeled, modeled-xK")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for case in args.cases.split(","):
            rows.append(run_case(case.strip(), Path(d)))
            r = rows[-1]
            crossing = "-" if r["crossing_rps"] is None else f"{r['crossing_rps']:.3g}"
            rates = ", ".join(f"{x:g}" for x in r["rates_rps"])
            past = ", ".join(f"{x:g}" for x in r["past_capacity_rps"]) or "-"
            print(f"{r['case']:<12} {r['wall_s']:>6.1f} s  service {r['service_ms']:>6.1f} ms  points {r['point_s']:>5.1f} s  "
                  f"rates {rates}  crossing {crossing}  ▲ {past}  inside {r['crossing_inside']}", flush=True)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "python": platform.python_version(),
                "load_avg_1m_at_end": os.getloadavg()[0]}
        Path(args.json).write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
