"""Calibrated simulation vs measurement, on the CPU reference engine over HTTP.

Starts the engine `slobench demo` starts (the torch `tiny` model, 512 KV blocks, 32 sequences, one torch
thread so the client keeps a core), calibrates a cost profile from it (`slobench calibrate`) before each
workload, so that the profile is measured as close as it can be to the runs it predicts on a shared
machine whose speed drifts with its load, finds each
workload's knee in simulation, then for five rates from light to past the knee runs the same requests
(same workload, seed and count) twice: measured over HTTP, and simulated on the virtual clock with the
calibrated profile and the engine's limits. Prints one row per (workload, rate): SLO attainment and
TTFT/TPOT p50 and p90 of each, and the differences, against the targets of issue 15 (attainment within
3 points, percentiles within 10%).

The simulation's TTFT gets the request's fixed cost outside the steps (HTTP in and out, parsing) that
calibrate fits beside the profile; it is printed, and `--no-overhead` leaves it out.

    python benchmarks/validate_sim.py                         # 12-25 minutes on a loaded 2-core machine
    python benchmarks/validate_sim.py --profile cal.json      # reuse a calibration
    python benchmarks/validate_sim.py --workloads tiny --rates 2,4,8,12,16 --num-requests 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.cli import main as cli
from slobench.cli.engine import demo_engine_args
from slobench.run.records import load_run

# a second shape beside the bundled `tiny`: prompts 4x longer, short answers (prefill-bound, TTFT-bound)
PREFILL_HEAVY = """\
name = "prefill-heavy"
description = "Longer prompts, short answers (128-512 prompt, 4-24 output) for the tiny CPU engine"
api = "completions"
prompt = "tokens"
num_requests = 64
token_ids = [32, 256]

[arrival]
process = "poisson"
rate_rps = 1.0

[input]
dist = "uniform"
min = 128
max = 512

[output]
dist = "uniform"
min = 4
max = 24
"""
SLOS = {"tiny": "ttft=300ms,tpot=40ms,target=0.9", "prefill-heavy": "ttft=600ms,tpot=60ms,target=0.9"}
RATE_FACTORS = (0.3, 0.6, 0.9, 1.3, 2.0)  # of the simulated knee: light to well past it


def quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli(argv)


def engine_flags() -> list[str]:
    """The simulated engine's limits, those of the served one (`demo_engine_args("torch")`)."""
    args = demo_engine_args("torch")
    flags = []
    for k in ("--kv-blocks", "--max-num-seqs"):
        flags += [k, args[args.index(k) + 1]]
    return flags


def load_and_judge(run_dir: Path, slo: SLO, shift_s: float = 0.0) -> dict[str, Any]:
    recs = load_run(run_dir).records
    for r in recs:  # the request's fixed cost outside the steps: every time after the send moves by it
        if shift_s and r.first_token_s is not None:
            r.first_token_s += shift_s
            r.done_s = None if r.done_s is None else r.done_s + shift_s
            r.chunk_times_s = [t + shift_s for t in r.chunk_times_s]
    s = summarize(recs, slo)
    return {"attainment": s.attainment.value, "ttft_p50": s.ttft.p50, "ttft_p90": s.ttft.p90,
            "tpot_p50": s.tpot.p50, "tpot_p90": s.tpot.p90, "num_ok": s.num_ok}


def run_args(workload: str, rate: float, n: int, seed: int, slo: str, out: Path) -> list[str]:
    return ["run", "--workload", workload, "--rate", f"{rate:.4g}", "--num-requests", str(n), "--seed", str(seed),
            "--slo", slo, "--out", str(out), "--overwrite", "--no-progress", "--scrape-interval", "0"]


def knee(workload: str, profile: Path, n: int, seed: int, slo: str, out: Path) -> float:
    """The highest rate, on a x1.2 grid, up to which the simulation meets the SLO's target."""
    target = SLO.parse(slo).target
    rate, best = 0.25, 0.25
    while rate < 200:
        d = out / f"knee-{rate:.4g}"
        quiet(run_args(workload, rate, n, seed, slo, d) + ["--simulate", "--profile", str(profile), *engine_flags()])
        att = json.loads((d / "summary.json").read_text())["attainment"]["value"]
        if att < target:
            break
        best = rate
        rate *= 1.2
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tiny,prefill-heavy")
    ap.add_argument("--rates", default=None, help="comma-separated req/s for every workload (default: from the knee)")
    ap.add_argument("--num-requests", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, help="a calibrated profile JSON (default: calibrate now)")
    ap.add_argument("--no-overhead", action="store_true", help="do not add calibrate's request overhead to TTFT")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or f"runs/validate-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefill-heavy.toml").write_text(PREFILL_HEAVY)
    workloads = {w: (str(out / "prefill-heavy.toml") if w == "prefill-heavy" else w) for w in args.workloads.split(",")}
    from slobench.profiles.calibrate import ProbePlan, calibrate, print_table, with_provenance
    from slobench.testing.process import EngineServerProcess

    t_start = time.monotonic()
    loads = [os.getloadavg()[0]]
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()}; engine: "
          f"{' '.join(demo_engine_args('torch'))}, 1 torch thread", flush=True)
    rows = []
    overheads = []
    with EngineServerProcess(*demo_engine_args("torch"), torch_threads=1) as srv:
        for name, wl in workloads.items():
            if args.profile:
                prof_path = Path(args.profile)
            else:
                t0 = time.monotonic()
                plan = ProbePlan()
                cal = asyncio.run(calibrate(srv.base_url, "tiny", plan))
                print_table(cal)
                prof_path = out / f"calibrated-{name}.json"
                prof_path.write_text(with_provenance(cal, srv.base_url, "tiny", plan).to_json() + "\n")
                print(f"calibrated in {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.1f}) -> {prof_path}",
                      flush=True)
            prof = CostProfile.load(prof_path)
            overhead_s = 0.0 if args.no_overhead else float((prof.provenance or {}).get("request_overhead_s", 0.0))
            overheads.append(overhead_s)
            slo_text = SLOS.get(name, SLOS["tiny"])
            slo = SLO.parse(slo_text)
            if args.rates:
                rates = [float(x) for x in args.rates.split(",")]
            else:
                k = knee(wl, prof_path, args.num_requests, args.seed, slo_text, out / name)
                rates = [k * f for f in RATE_FACTORS]
                print(f"{name}: simulated knee {k:.2f} req/s ({slo_text}); rates {', '.join(f'{r:.2f}' for r in rates)}",
                      flush=True)
            for rate in rates:
                common = run_args(wl, rate, args.num_requests, args.seed, slo_text, out / name / f"measured-{rate:.4g}")
                t0 = time.monotonic()
                quiet([*common, "--url", srv.base_url, "--model", "tiny"])
                loads.append(os.getloadavg()[0])
                sim_dir = out / name / f"simulated-{rate:.4g}"
                quiet([*run_args(wl, rate, args.num_requests, args.seed, slo_text, sim_dir), "--simulate", "--profile",
                       str(prof_path), *engine_flags()])
                m = load_and_judge(out / name / f"measured-{rate:.4g}", slo)
                s = load_and_judge(sim_dir, slo, overhead_s)
                rows.append((name, rate, m, s))
                print(f"  {name} {rate:.2f} req/s measured in {time.monotonic() - t0:.0f} s (load {loads[-1]:.1f}): "
                      f"attainment {m['attainment']:.0%} vs simulated {s['attainment']:.0%}", flush=True)
    print_rows(rows)
    print(f"\nwall {time.monotonic() - t_start:.0f} s; 1-minute load average during the measured runs "
          f"{min(loads):.1f}-{max(loads):.1f} (2 cores); request overhead added to simulated TTFT "
          f"{', '.join(f'{o * 1e3:.1f}' for o in overheads)} ms; run directories under {out}")


def _err(m: float | None, s: float | None) -> str:
    if m is None or s is None:
        return "n/a"
    return f"{(s - m) / m:+.0%}"


def print_rows(rows: list[tuple[str, float, dict[str, Any], dict[str, Any]]]) -> None:
    print("\n| workload | rate req/s | attainment meas / sim (Δ pts) | TTFT p50 ms meas / sim (err) | TTFT p90 | "
          "TPOT p50 ms | TPOT p90 |")
    print("|---|---|---|---|---|---|---|")
    hits = total = 0
    for name, rate, m, s in rows:
        d_att = (s["attainment"] - m["attainment"]) * 100
        cells = [f"{m['attainment']:.0%} / {s['attainment']:.0%} ({d_att:+.0f}{'' if abs(d_att) <= 3 else ' ✗'})"]
        total += 1
        hits += abs(d_att) <= 3
        for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
            mv, sv = m[key], s[key]
            ok = mv is not None and sv is not None and abs(sv - mv) <= 0.1 * mv
            total += 1
            hits += ok
            fm = "n/a" if mv is None else f"{mv * 1e3:.0f}"
            fs = "n/a" if sv is None else f"{sv * 1e3:.0f}"
            cells.append(f"{fm} / {fs} ({_err(mv, sv)}{'' if ok else ' ✗'})")
        print(f"| {name} | {rate:.2f} | " + " | ".join(cells) + " |")
    print(f"\n{hits} of {total} comparisons within target (attainment ±3 points, percentiles ±10%)")


if __name__ == "__main__":
    main()
