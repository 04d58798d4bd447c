"""How a fleet's capacity scales with replicas, and what the router costs or buys (virtual clock).

For each router and replica count, a capacity search with replicates on a simulated fleet of the bundled
engine (the illustrative `h100-llama-1b` profile) under `chat` (heavy-tailed lengths) or `system-prompts`
(Zipf-popular shared prefixes, small KV caches); prints capacity, its interval, capacity per replica and
the share of prompt tokens served from cache. Probes last a fixed duration, not a request count: a run too
short to show the queue growing past capacity reads the cliff as a slope. Figures: docs/measurements/fleet_routing.md.

    python benchmarks/fleet_routing.py [--replicas 1,2,4] [--duration 30] [--workloads chat,system-prompts]"""

from __future__ import annotations

import argparse
import asyncio
import time

from slobench.analysis.slo import SLO
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import simulate_records
from slobench.workload import generate, load_workload

SETUPS = {
    # workload: (engine knobs per replica, SLO, start rate per replica, routers worth comparing)
    "chat": ({"profile": "h100-llama-1b", "kv_blocks": 2048}, "ttft=300ms,tpot=40ms", 16.0,
             ("least-outstanding", "least-tokens", "round-robin")),
    "system-prompts": ({"profile": "h100-llama-1b", "kv_blocks": 300}, "ttft=300ms,tpot=40ms", 16.0,
                       ("least-outstanding", "prefix-affinity", "prefix-balanced")),
}


async def capacity(workload: str, replicas: int, router: str, duration_s: float) -> dict:
    knobs, slo_text, start, _ = SETUPS[workload]
    slo = SLO.parse(slo_text)
    measure = SimulatedMeasure(workload, knobs, slo, duration_s=duration_s, replicas=replicas, router=router)
    opts = SearchOptions(target=slo.target, start_rps=start * replicas, replicates=5, rel_tol=0.03, max_probes=14)
    res = await search_capacity(measure, opts)
    out = {"workload": workload, "replicas": replicas, "router": router, "capacity": res.capacity_rps,
           "interval": res.interval_rps, "cache": None}
    if workload == "system-prompts" and res.capacity_rps:
        specs = generate(load_workload(workload), rate_rps=res.capacity_rps, duration_s=duration_s, seed=1)
        recs = simulate_records(specs, knobs, replicas=replicas, router=router)
        out["cache"] = sum(r.cached_tokens or 0 for r in recs) / max(1, sum(r.prompt_tokens or 0 for r in recs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--routers", default=None, help="default: the ones worth comparing for each workload")
    ap.add_argument("--workloads", default="chat,system-prompts")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of traffic a probe")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for workload in args.workloads.split(","):
        routers = args.routers.split(",") if args.routers else SETUPS[workload][3]
        for router in routers:
            for n in (int(x) for x in args.replicas.split(",")):
                if n == 1 and router != routers[0]:
                    continue  # one replica: every router is the same
                rows.append(asyncio.run(capacity(workload, n, router, args.duration)))
                r = rows[-1]
                print(f"  {workload} {router} x{n}: {r['capacity']}", flush=True)
    print(f"\nfleet capacity on the virtual clock ({args.duration:g} s of traffic a probe, 5 replicates, "
          f"{time.perf_counter() - t0:.0f} s)")
    print("| workload | router | replicas | capacity req/s | 95% interval | per replica | prompt tokens cached |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cap, iv = r["capacity"], r["interval"]
        cap_s = "-" if cap is None else f"{cap:.1f}"
        iv_s = "-" if not iv or iv[0] is None else f"{iv[0]:.1f}–{iv[1]:.1f}"
        per = "-" if cap is None else f"{cap / r['replicas']:.1f}"
        cache = "" if r["cache"] is None else f"{r['cache']:.0%}"
        print(f"| {r['workload']} | {r['router'] if r['replicas'] > 1 else '(one)'} | {r['replicas']} | {cap_s} | "
              f"{iv_s} | {per} | {cache} |")


if __name__ == "__main__":
    main()
