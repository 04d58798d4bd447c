"""Does the capacity search agree with a dense sweep? The modeled reference engine on a virtual clock.

For each engine variant: one capacity search (bracket, bisect, replicate seeds at the bracket edges) and a
dense sweep (many rates, attainment averaged over many seeds) whose crossing of the 90% target is the
reference; prints both and whether the search's interval covers the crossing. The engine runs on a
`VirtualClock` with modeled step times (baselines/ci-profile.json) and a small per-step jitter, no HTTP,
so this measures the server, never the client. Figures: docs/measurements/capacity_vs_sweep.md.

    python benchmarks/capacity_vs_sweep.py [--replicates 5] [--sweep-seeds 20]"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from slobench.analysis.slo import SLO
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import ModeledEngine, sweep_crossing

ROOT = Path(__file__).resolve().parents[1]
CI_PROFILE = ROOT / "baselines" / "ci-profile.json"
CI_SLO = SLO(ttft_s=0.3, tpot_s=0.07, target=0.9)
JITTER_SD = 0.01  # relative per-step timing noise


def ci_engine(name: str = "baseline", **kw: object) -> ModeledEngine:
    """The CI gate's modeled engine (60 KV blocks of 16, ci-profile step times) with changes in `kw`."""
    return ModeledEngine(**{"profile": CI_PROFILE, "kv_blocks": 60, "name": name, **kw})  # type: ignore[arg-type]


def ci_measure(engine: ModeledEngine, *, num_requests: int = 120, trial: int = 0) -> SimulatedMeasure:
    """`tiny` with 32-token prompts and 16-token outputs, judged against CI_SLO."""
    return SimulatedMeasure("tiny", engine, CI_SLO, num_requests=num_requests, input_len=32, output_len=16,
                            jitter_sd=JITTER_SD, trial=trial)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--sweep-seeds", type=int, default=20)
    ap.add_argument("--num-requests", type=int, default=120)
    args = ap.parse_args()
    variants = [ci_engine(), ci_engine("step+15%", step_scale=1.15), ci_engine("kv-30%", kv_blocks=42),
                ci_engine("kv=120", kv_blocks=120)]
    print(f"SLO {CI_SLO}; workload tiny (32 in / 16 out), {args.num_requests} requests per run; "
          f"{args.replicates} replicates; sweep mean over {args.sweep_seeds} seeds\n")
    print(f"{'variant':10} {'capacity':>9} {'interval':>17} {'probes':>6} {'sweep x':>8} {'covered':>7} {'time':>6}")
    num_covered = 0
    for v in variants:
        t0 = time.perf_counter()
        m = ci_measure(v, num_requests=args.num_requests)
        res = await search_capacity(m, SearchOptions(start_rps=4.0, replicates=args.replicates, seed=0))
        lo, hi = res.interval_rps or (float("nan"), float("nan"))
        cap = res.capacity_rps or float("nan")
        rates = list(np.round(np.linspace(0.6 * cap, 1.4 * cap, 33), 4))
        seeds = list(range(10_000, 10_000 + args.sweep_seeds))  # not the search's seeds
        x, _ = await sweep_crossing(m, rates, seeds, CI_SLO.target)
        covered = x is not None and lo <= x <= hi
        num_covered += covered
        print(f"{v.name:10} {cap:9.2f} [{lo:7.2f}, {hi:7.2f}] {len(res.probes):6d} "
              f"{x if x is not None else float('nan'):8.2f} {'yes' if covered else 'NO':>7} {time.perf_counter() - t0:5.1f}s")
    print(f"covered {num_covered} of {len(variants)} (the README's capacity headline is capacity_coverage's)")


if __name__ == "__main__":
    asyncio.run(main())
