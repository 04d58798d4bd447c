"""How often does the gate cry wolf, and how often does it catch a real regression?

Each trial measures a baseline and a candidate of the modeled engine as CI does (a capacity search with
replicates plus replicates at one fixed rate, same seeds on both sides), then applies `slobench.gate.gate`
with the default thresholds. Candidates: identical (a fresh timing-jitter draw), every step 15% slower,
30% fewer KV blocks. Targets: identical passes >= 19/20; both regressions fail 20/20. Virtual clock.
Figures: docs/measurements/gate_false_alarm.md.

    .venv/bin/python benchmarks/gate_false_alarm.py [--trials 20] [--replicates 5]"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path

from result_json import write_result  # this folder is on sys.path

from slobench.analysis.slo import SLO
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import ModeledEngine
from slobench.gate import Samples, gate, rate_key

CI_PROFILE = Path(__file__).resolve().parents[1] / "baselines" / "ci-profile.json"
CI_SLO = SLO(ttft_s=0.3, tpot_s=0.07, target=0.9)
FIXED_RATE_RPS = 20.0


def ci_engine(name: str, **kw: object) -> ModeledEngine:
    """The CI gate's modeled engine: 60 KV blocks of 16, ci-profile step times."""
    return ModeledEngine(**{"profile": CI_PROFILE, "kv_blocks": 60, "name": name, **kw})  # type: ignore[arg-type]


async def measure_side(v: ModeledEngine, trial: int, replicates: int) -> Samples:
    m = SimulatedMeasure("tiny", v, CI_SLO, num_requests=120, input_len=32, output_len=16, jitter_sd=0.01,
                         trial=trial)
    s = Samples(f"{v.name}#{trial}", {"name": "tiny", "hash": "virtual"}, CI_SLO.to_dict(), "bench")
    res = await search_capacity(m, SearchOptions(start_rps=4.0, replicates=replicates, seed=0))
    if res.inconclusive:  # as `slobench.gate.load_samples` reads an inconclusive capacity.json
        s.inconclusive["capacity"] = res.inconclusive
    else:
        for rep in res.replicates:  # every seed's own crossing: what the capacity's interval is taken over
            s.add("capacity", rep["seed"], rep["capacity_rps"], s.source)
    for seed in range(1, replicates + 1):
        for name, val in (await m(FIXED_RATE_RPS, seed)).flat_metrics().items():
            s.add(rate_key(name, FIXED_RATE_RPS), seed, val, s.source)
    return s


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--replicates", type=int, default=5)
    args = ap.parse_args()
    candidates = [ci_engine("identical"), ci_engine("step+15%", step_scale=1.15), ci_engine("kv-30%", kv_blocks=42)]
    counts: dict[str, Counter[str]] = {c.name: Counter() for c in candidates}
    failing_metrics: dict[str, Counter[str]] = {c.name: Counter() for c in candidates}
    t0 = time.perf_counter()
    for t in range(args.trials):
        base = await measure_side(ci_engine("identical"), 2 * t, args.replicates)
        for c in candidates:
            cand = await measure_side(c, 2 * t + 1, args.replicates)
            res = gate(base, cand)
            counts[c.name][res.verdict] += 1
            for chk in res.checks:
                if chk.verdict == "regression":
                    failing_metrics[c.name][chk.key] += 1
    print(f"{args.trials} trials, {args.replicates} replicates a side, fixed rate {FIXED_RATE_RPS:g} req/s, "
          f"SLO {CI_SLO} ({time.perf_counter() - t0:.0f} s)\n")
    print(f"{'candidate':10} {'pass':>5} {'regression':>10} {'inconclusive':>12}  metrics that failed (count)")
    for c in candidates:
        k = counts[c.name]
        top = ", ".join(f"{m} {n}" for m, n in failing_metrics[c.name].most_common(4))
        print(f"{c.name:10} {k['pass']:5d} {k['regression']:10d} {k['inconclusive']:12d}  {top}")
    write_result("gate_false_alarm", {"trials": args.trials, "identical_passed": counts["identical"]["pass"],
                                      "step_slower_failed": counts["step+15%"]["regression"],
                                      "kv_fewer_failed": counts["kv-30%"]["regression"]})


if __name__ == "__main__":
    asyncio.run(main())
