"""The fleet plan for the bundled day against static fleets and the interpolation baseline: prints the
terminal table of `slobench plan` and a Markdown table of the strategies (GPU-hours, attainment, goodput
per GPU), with the wall time. Defaults: roofline H100 Llama-3.1-8B instances, the day at a mean 10 req/s,
1 h windows, SLO TTFT 500 ms and TPOT 40 ms for 90%, a 60 s switching cost.
Figures: docs/measurements/plan_day.md.

    .venv/bin/python benchmarks/plan_day.py [--rate 10] [--jobs 2] [--out runs/plan-day] [-- extra plan flags]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from result_json import write_result  # this folder is on sys.path

from slobench.cli import main as slobench


def markdown(plan: dict) -> str:
    rows = ["| strategy | GPU-hours | attainment | goodput / GPU (req/s) | windows at target | most instances | instances switched |",
            "|---|---|---|---|---|---|---|"]
    for name, s in plan["strategies"].items():
        rows.append(f"| {name} | {s['gpu_hours']:.1f} | {s['attainment']:.2%} | {s['goodput_per_gpu_rps']:.2f} | "
                     f"{s['windows_met']}/{s['num_windows']} | {s['max_instances']} | {s['instances_switched']} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="10")
    ap.add_argument("--profile", default="roofline:h100/llama-3.1-8b")
    ap.add_argument("--slo", default="ttft=500ms,tpot=40ms,target=0.9")
    ap.add_argument("--window", default="1h")
    ap.add_argument("--max-requests", default="2000")
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--out", default="runs/plan-day")
    ap.add_argument("extra", nargs="*", help="more `slobench plan` flags, after --")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rc = slobench(["plan", "--workload", "day", "--rate", a.rate, "--profile", a.profile, "--slo", a.slo,
                   "--window", a.window, "--max-requests", a.max_requests, "--jobs", a.jobs, "--out", a.out,
                   *a.extra])
    wall = time.perf_counter() - t0
    path = Path(a.out) / "plan.json"
    if not path.is_file():
        return rc
    plan = json.loads(path.read_text())
    print()
    print(markdown(plan))
    vs = plan["strategies"]["planner"].get("vs_best_static")
    if vs:
        print(f"\nplanner vs best static ({vs['static']}): {vs['gpu_hours_saved']:+.1f} GPU-hours "
              f"({vs['gpu_hours_saved_share']:+.1%}), attainment {vs['attainment_delta'] * 100:+.2f} points")
    print(f"{plan['num_evaluations']} fleet evaluations, {wall:.0f} s wall ({plan['run']['pool']})")
    planner, static = plan["strategies"]["planner"], plan["strategies"].get(vs["static"]) if vs else None
    if vs and static:
        write_result("plan_day", {
            "planner_gpu_hours": planner["gpu_hours"], "static_gpu_hours": static["gpu_hours"],
            "gpu_hours_saved_pct": round(100 * vs["gpu_hours_saved_share"], 1),
            "planner_attainment_pct": round(100 * planner["attainment"], 2),
            "static_attainment_pct": round(100 * static["attainment"], 2),
        }, note=f"SLO {a.slo}; the best static fleet: {vs['static']}.")
    return rc


if __name__ == "__main__":
    sys.exit(main())
