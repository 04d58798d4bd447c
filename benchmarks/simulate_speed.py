"""How fast the virtual clock runs: simulated requests per CPU second, and peak memory.

One replica of the bundled engine (modeled executor, `h100-llama-1b`, 2,048 KV blocks) under `chat` at a
rate below its capacity, for each request count, in one process: the simulation alone (`simulate_records`;
specs generated first), then the lean summary a capacity probe computes. Memory by tracemalloc
(`--no-tracemalloc` for timing: it slows allocation-heavy code several times) and the process's max RSS
(run one count per process to read it). Target: 100,000 requests in under 30 CPU s.
Figures: docs/measurements/simulate_speed.md.

    python benchmarks/simulate_speed.py [--counts 10000,100000] [--rate 30]"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from result_json import write_result  # this folder is on sys.path

from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.fleet.simulate import simulate_records
from slobench.workload import generate, load_workload

KNOBS = {"profile": "h100-llama-1b", "kv_blocks": 2048}
SLO_TEXT = "ttft=300ms,tpot=40ms"


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one(n: int, rate_rps: float, *, trace: bool) -> dict:
    specs = generate(load_workload("chat"), rate_rps=rate_rps, num_requests=n, seed=1)
    rss_specs = _rss_mib()
    if trace:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    records = simulate_records(specs, KNOBS)
    t1, c1 = time.perf_counter(), time.process_time()
    kept, sim_peak = tracemalloc.get_traced_memory() if trace else (0, 0)
    summary = summarize(records, SLO.parse(SLO_TEXT), intervals="none")
    t2 = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
    return {"n": n, "sim_s": t1 - t0, "cpu_s": c1 - c0, "rss_specs_mib": rss_specs, "summary_s": t2 - t1, "peak_mib": peak / 2**20,
            "kept_mib": kept / 2**20, "sim_peak_mib": sim_peak / 2**20,
            "tokens": sum(r.output_tokens for r in records), "attainment": summary.attainment.value}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="10000,100000")
    ap.add_argument("--rate", type=float, default=30.0, help="req/s (one replica's capacity is ~39 at 40 ms TPOT)")
    ap.add_argument("--no-tracemalloc", action="store_true",
                    help="time without tracemalloc (it slows allocation-heavy code ~2x); peak RSS only")
    args = ap.parse_args()
    print(f"chat @ {args.rate:g} req/s, one replica, {KNOBS}")
    print("| requests | simulate s (wall) | CPU s | req/s simulated (CPU) | output tok/s (CPU) | summary s "
          "| records kept MiB | simulation peak MiB | peak with summary MiB | RSS with the specs MiB | max RSS MiB "
          "| attainment |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(c) for c in args.counts.split(",")):
        r = one(n, args.rate, trace=not args.no_tracemalloc)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        mem = " | ".join(f"{r[k]:.0f}" if not args.no_tracemalloc else "-"
                         for k in ("kept_mib", "sim_peak_mib", "peak_mib"))
        print(f"| {n:,} | {r['sim_s']:.2f} | {r['cpu_s']:.2f} | {n / r['cpu_s']:,.0f} | {r['tokens'] / r['cpu_s']:,.0f} "
              f"| {r['summary_s']:.2f} | {mem} | {r['rss_specs_mib']:.0f} | {rss:.0f} | {r['attainment']:.3f} |",
              flush=True)
        if n == 100_000:  # the headline's count; one run gives one figure, the range collapses to it
            write_result("simulate_speed", {"cpu_s_100k_min": round(r["cpu_s"], 1), "cpu_s_100k_max": round(r["cpu_s"], 1),
                                            "rate_rps": args.rate})


if __name__ == "__main__":
    main()
