"""How far apart two refinements of the same server land: the spread of calibrate's second stage.

Starts the engine `slobench demo` starts, fits the probe profile once, then refines it several times with
each refinement plan, interleaved (A, B, A, B, ...) so a slow spell of the machine falls on both, each
repeat with fresh requests. Prints every refinement's factors (a, b, c, o), noise and held-out error, then
per plan each factor's spread: the sd of its log (0.10 = about ±10%) and its range. A plan is
`RATE_FACTORS@REQUESTS[+split]`: rates as multiples of the probe fit's simulated knee (the middle one held
out), requests a rate, `+split` to fit TTFT by prompt length too. Figures: docs/measurements/refine_spread.md.

    python benchmarks/refine_spread.py                                  # 0.5,0.8,1.1@100 against 0.3,0.5,0.8,1.0,1.2@150, x3
    python benchmarks/refine_spread.py --plans 0.5,0.8,1.1@100 --repeats 5"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from slobench.cli.engine import demo_engine_args


def parse_plan(text: str) -> tuple[tuple[float, ...], int, bool]:
    """`0.5,0.8,1.1@100`, and a `+split` suffix for `RefinePlan.by_prompt_length`."""
    split = text.endswith("+split")
    rates, _, n = text.removesuffix("+split").partition("@")
    return tuple(float(x) for x in rates.split(",")), int(n or 100), split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", nargs="+", default=["0.5,0.8,1.1@100", "0.3,0.5,0.8,1.0,1.2@150"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import validate_sim  # the refinement workload and the served engine's limits, shared with the validation

    from slobench.profiles.calibrate import ProbePlan, calibrate
    from slobench.profiles.refine import (
        RefinePlan,
        knee_rate,
        live_setup,
        mean_abs_error,
        refine_live,
        simulate,
    )
    from slobench.testing.process import EngineServerProcess

    plans = [parse_plan(p) for p in args.plans]
    out = Path(args.out or f"runs/refine-spread-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    mix = out / "refine-mix.toml"
    mix.write_text(validate_sim.REFINE_MIX)
    limits = validate_sim.engine_limits()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()}", flush=True)
    t_start = time.monotonic()
    results: dict[int, list[Any]] = {i: [] for i in range(len(plans))}
    loads = []
    with EngineServerProcess(*demo_engine_args("torch"), torch_threads=1) as srv:
        cal = asyncio.run(calibrate(srv.base_url, "tiny", ProbePlan()))
        setup0 = live_setup(srv.base_url, "tiny", RefinePlan(str(mix), None, 100, 1, limits))
        knee = knee_rate(lambda r: list(setup0.specs(r, seed=1)), limits, cal.profile, cal.request_overhead_s,
                         setup0.api)
        print(f"probe fit in {time.monotonic() - t_start:.0f} s; o {cal.request_overhead_s * 1e3:.1f} ms; its simulated "
              f"knee on refine-mix {knee:.2f} req/s", flush=True)
        for rep in range(args.repeats):
            for i, (factors, n, split) in enumerate(plans):
                plan = RefinePlan(str(mix), tuple(knee * f for f in factors), n, rep + 1, limits, split)
                t0 = time.monotonic()
                ref = asyncio.run(refine_live(live_setup(srv.base_url, "tiny", plan), cal.profile,
                                              cal.request_overhead_s, plan, write=lambda _line: None))
                loads.append(os.getloadavg()[0])
                results[i].append(ref)
                f = ref.factors
                print(f"plan {args.plans[i]} seed {rep + 1}: a x{f['a']:.3f} b x{f['b']:.3f} c x{f['c']:.3f} "
                      f"o x{f['o']:.3f} noise {ref.jitter_sd:.3f}; held-out error {ref.held_out_error('refined'):.1%} "
                      f"(probe fit {ref.held_out_error('probe_only'):.1%}); {time.monotonic() - t0:.0f} s, "
                      f"load {loads[-1]:.1f}", flush=True)
    print(f"\nwall {time.monotonic() - t_start:.0f} s; 1-minute load {min(loads):.1f}-{max(loads):.1f} (2 cores)")
    print("\n| plan | repeats | requests measured each | sd of log factor a / b / c / o | noise sd (range) "
          "| held-out error refined: mean (range) |")
    print("|---|---|---|---|---|---|")
    for i, refs in results.items():
        rates, n, _ = plans[i]
        sds = []
        for k in ("a", "b", "c", "o"):
            logs = [math.log(r.factors[k]) for r in refs]
            sds.append(f"{np.std(logs, ddof=1):.2f} ({min(r.factors[k] for r in refs):.2f}-"
                       f"{max(r.factors[k] for r in refs):.2f})")
        noise = [r.jitter_sd for r in refs]
        held = [r.held_out_error("refined") for r in refs]
        print(f"| {args.plans[i]} | {len(refs)} | {len(rates) * n} | {' / '.join(sds)} | "
              f"{np.mean(noise):.2f} ({min(noise):.2f}-{max(noise):.2f}) | {np.mean(held):.1%} "
              f"({min(held):.1%}-{max(held):.1%}) |")
    # each plan's profiles scored on every other repeat's held-out rate: the error of a profile on load it
    # was not fitted to, the same requests for every profile
    print("\nEach refined profile simulated against every repeat's measured held-out rate (mean |error| of "
          "TTFT/TPOT p50/p90, all repeats of all plans):")
    everyone = [(i, r) for i, refs in results.items() for r in refs]
    for i, refs in results.items():
        errs = []
        for r in refs:
            for _, other in everyone:
                if other is r:
                    continue
                p = other.held_out
                specs = list(setup0.specs(p.rate_rps, seed=other.plan.seed))
                sim = simulate(specs, limits, r.profile, setup0.api, r.request_overhead_s, jitter_sd=r.jitter_sd)
                errs.append(mean_abs_error(sim, p.measured))
        print(f"  plan {args.plans[i]}: {np.mean(errs):.1%} mean, {np.median(errs):.1%} median, worst {max(errs):.1%}")


if __name__ == "__main__":
    main()
