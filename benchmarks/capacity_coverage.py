"""How often does a capacity search's 95% interval cover the true capacity? Measured on the simulator.

For each engine variant (profiles, KV sizes, max-num-seqs, step time; workloads: uniform and heavy-tailed
lengths, Poisson and bursty arrivals) on the virtual clock:
- the *true* capacity from a dense many-seed sweep: every truth seed run on a grid of rates 2% apart
  around the capacity, its crossing of the target interpolated at the first grid rate it misses; the truth
  is the mean over seeds (what a search's seeds estimate: the crossing rate of one run of this length),
  with its standard error; the crossing of the seed-averaged attainment curve is printed beside it;
- `--searches` capacity searches with default `SearchOptions` (seeds never used by the truth): whether the
  interval covers the truth, whether the search was inconclusive, its width, probes and virtual time;
- what a dense sweep of the same precision costs: rates spaced at the median interval half-width from the
  start rate to 1.3x capacity, each with the same 6 seeds a search uses.
Writes a JSON of every figure with --json, each search's seeds (bracket, crossing) among them, so that an
interval rule can be judged against the same searches. The simulation is deterministic: `--truths FILE`
reuses the truths of an earlier run's --json instead of running the truth seeds again. Figures:
docs/measurements/capacity_coverage.md (every search: capacity_coverage_runs.json beside it).

    python benchmarks/capacity_coverage.py [--searches 23] [--truth-seeds 48] [--duration 10] [--jobs 3]
        [--json FILE] [--truths FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from result_json import write_result  # this folder is on sys.path

from slobench.analysis.headline import crossing_rate
from slobench.analysis.slo import SLO
from slobench.experiments.capacity import SearchOptions, search_capacity
from slobench.experiments.probe import SimulatedMeasure
from slobench.fleet.simulate import ModeledEngine
from slobench.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    workload: str
    engine: dict[str, Any]
    ttft_s: float
    tpot_s: float


TINY = {"profile": "cpu-tiny"}
H100 = {"profile": "h100-llama-1b"}
LENGTHS = {  # the tiny workload's uniform lengths, and heavy-tailed lognormal ones of a similar size
    "uniform": "[input]\ndist = \"uniform\"\nmin = 32\nmax = 256\n[output]\ndist = \"uniform\"\nmin = 8\nmax = 64\n",
    "heavy": ("[input]\ndist = \"lognormal\"\nmedian = 80\np99 = 1000\nmin = 8\nmax = 2048\n"
              "[output]\ndist = \"lognormal\"\nmedian = 16\np99 = 200\nmin = 1\nmax = 512\n"),
}
ARRIVALS = {"poisson": "process = \"poisson\"\nrate_rps = 2.0\n",
            "bursty": "process = \"gamma\"\nrate_rps = 2.0\ncv = 2.0\n"}


def workload(arrival: str, lengths: str) -> str:
    """A workload spec's TOML: the tiny workload's token prompts with the arrival process and lengths named."""
    return (f"name = \"{arrival}-{lengths}\"\napi = \"completions\"\nprompt = \"tokens\"\nnum_requests = 64\n"
            f"token_ids = [32, 256]\n[arrival]\n{ARRIVALS[arrival]}{LENGTHS[lengths]}")


VARIANTS = (
    Variant("tiny seqs8", "tiny", {**TINY, "max_num_seqs": 8}, 0.5, 0.05),
    Variant("tiny seqs8 kv64", "tiny", {**TINY, "max_num_seqs": 8, "kv_blocks": 64}, 0.5, 0.05),
    Variant("tiny seqs16", "tiny", {**TINY, "max_num_seqs": 16}, 0.5, 0.05),
    Variant("tiny seqs4", "tiny", {**TINY, "max_num_seqs": 4}, 0.5, 0.05),
    Variant("tiny seqs8 step+15%", "tiny", {**TINY, "max_num_seqs": 8, "step_scale": 1.15}, 0.5, 0.05),
    Variant("bursty seqs8", workload("bursty", "uniform"), {**TINY, "max_num_seqs": 8}, 0.5, 0.05),
    Variant("heavy-tailed seqs8", workload("poisson", "heavy"), {**TINY, "max_num_seqs": 8}, 0.5, 0.05),
    Variant("bursty heavy-tailed seqs16 kv128", workload("bursty", "heavy"),
            {**TINY, "max_num_seqs": 16, "kv_blocks": 128}, 0.5, 0.05),
    Variant("h100 profile seqs4 heavy-tailed", workload("poisson", "heavy"), {**H100, "max_num_seqs": 4}, 0.3, 0.04),
)
JITTER_SD = 0.02
GRID = np.round(np.arange(0.70, 1.3001, 0.02), 2)


def measure(v: Variant, duration_s: float) -> SimulatedMeasure:
    spec = v.workload if v.workload.isidentifier() else WorkloadSpec.from_dict(tomllib.loads(v.workload))
    return SimulatedMeasure(spec, ModeledEngine(name=v.name, **v.engine), SLO(ttft_s=v.ttft_s, tpot_s=v.tpot_s),
                            duration_s=duration_s, jitter_sd=JITTER_SD)


def seed_crossing(m: SimulatedMeasure, rates: list[float], seed: int, target: float) -> tuple[float | None, list[float]]:
    """One seed up the grid until it misses twice running; its crossing interpolated at the first miss."""
    att: list[float] = []
    for r in rates:
        att.append(asyncio.run(m(r, seed)).attainment_value or 0.0)
        if len(att) >= 2 and att[-1] < target and att[-2] < target:
            break
    for i, a in enumerate(att):
        if a < target:
            if i == 0:
                return None, att  # missed at the grid's bottom: the grid is misplaced
            (r0, a0), (r1, a1) = (rates[i - 1], att[i - 1]), (rates[i], a)
            return r0 + (a0 - target) / (a0 - a1) * (r1 - r0), att
    return None, att  # met at the grid's top


def truth(v: Variant, duration_s: float, seeds: int, first_seed: int = 100_000) -> dict[str, Any]:
    m = measure(v, duration_s)
    pilot = asyncio.run(search_capacity(m, SearchOptions(seed=50_000, replicates=0))).capacity_rps
    assert pilot is not None, v.name
    rates = [round(float(pilot * g), 4) for g in GRID]
    crossings, curves = [], []
    for s in range(first_seed, first_seed + seeds):
        c, att = seed_crossing(m, rates, s, 0.9)
        crossings.append(c)
        curves.append(att + [0.0] * (len(rates) - len(att)))  # past two misses: counted as missing
    ok = [c for c in crossings if c is not None]
    mean_curve = np.mean(np.array(curves), axis=0)
    return {"variant": v.name, "grid_rps": [rates[0], rates[-1]], "truth_rps": float(np.mean(ok)),
            "truth_se_rps": float(np.std(ok, ddof=1) / math.sqrt(len(ok))), "seeds": len(ok),
            "off_grid": len(crossings) - len(ok), "mean_curve_crossing_rps": crossing_rate(rates, list(mean_curve), 0.9),
            "probes": m.count, "crossings": crossings, "curves": curves}


def one_search(v: Variant, duration_s: float, seed: int) -> dict[str, Any]:
    m = measure(v, duration_s)
    res = asyncio.run(search_capacity(m, SearchOptions(seed=seed)))
    virtual_s = sum(p.duration_s or duration_s for p in res.probes)
    return {"variant": v.name, "seed": seed, "capacity_rps": res.capacity_rps,
            "interval_rps": list(res.interval_rps) if res.interval_rps else None,
            "inconclusive": res.inconclusive, "probes": len(res.probes), "virtual_s": virtual_s,
            "bracket_rps": list(res.bracket_rps) if res.bracket_rps else None, "seeds": res.replicates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=23, help="capacity searches per variant")
    ap.add_argument("--truth-seeds", type=int, default=48)
    ap.add_argument("--duration", type=float, default=10.0, help="virtual seconds of traffic per probe")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--json", default=None, help="also write every figure here")
    ap.add_argument("--truths", default=None, help="reuse the truths of an earlier run's --json (deterministic)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        truths_f = ([] if args.truths else [pool.submit(truth, v, args.duration, args.truth_seeds) for v in VARIANTS])
        searches_f = [pool.submit(one_search, v, args.duration, 1000 * (i + 1) + 7 * k)
                      for i, v in enumerate(VARIANTS) for k in range(args.searches)]
        truths = {} if not args.truths else {t["variant"]: t for t in json.load(open(args.truths))["rows"]}
        for f in truths_f:
            t = f.result()
            truths[t["variant"]] = t
            print(f"truth {t['variant']}: {t['truth_rps']:.2f} ± {t['truth_se_rps']:.2f}", file=sys.stderr, flush=True)
        searches = []
        for f in searches_f:
            searches.append(f.result())
            if len(searches) % 20 == 0:
                print(f"{len(searches)} searches done", file=sys.stderr, flush=True)
    rows = []
    for v in VARIANTS:
        t = truths[v.name]
        mine = [s for s in searches if s["variant"] == v.name]
        for s in mine:
            iv = s["interval_rps"]
            s["covers"] = iv is not None and iv[0] <= t["truth_rps"] <= iv[1]
        done = [s for s in mine if s["interval_rps"] is not None]
        widths = [s["interval_rps"][1] - s["interval_rps"][0] for s in done]
        w = statistics.median(widths) if widths else math.nan
        sweep_probes = 6 * math.ceil((1.3 * t["truth_rps"] - 1.0) / (w / 2)) if widths else None
        rows.append({**t, "searches": len(mine), "covered": sum(s["covers"] for s in mine),
                     "covered_mean_curve": sum(1 for s in done if s["interval_rps"][0] <= (t.get("mean_curve_crossing_rps")
                                                                                          or math.nan) <= s["interval_rps"][1]),
                     "inconclusive": sum(1 for s in mine if s["inconclusive"]),
                     "median_width_rps": w, "median_rel_width": w / t["truth_rps"],
                     "median_probes": statistics.median(s["probes"] for s in mine),
                     "median_virtual_s": statistics.median(s["virtual_s"] for s in mine),
                     "sweep_probes": sweep_probes})
    n = sum(r["searches"] for r in rows)
    total = {"searches": n, "covered": sum(r["covered"] for r in rows),
             "inconclusive": sum(r["inconclusive"] for r in rows),
             "median_rel_width": statistics.median(r["median_rel_width"] for r in rows),
             "median_probes": statistics.median(s["probes"] for s in searches),
             "median_virtual_s": statistics.median(s["virtual_s"] for s in searches),
             "median_sweep_probes": statistics.median(r["sweep_probes"] for r in rows if r["sweep_probes"]),
             "wall_s": time.perf_counter() - t0}
    print(f"{args.searches} searches a variant, default SearchOptions, {args.duration:g} s probes, jitter "
          f"{JITTER_SD}; truth: {args.truth_seeds} seeds on a 2% grid\n")
    print(f"{'variant':32} {'truth':>7} {'±se':>5} {'curve x':>7} {'covered':>8} {'inconcl':>7} {'width':>6} "
          f"{'probes':>6} {'virt s':>6} {'sweep probes':>12}")
    for r in rows:
        print(f"{r['variant']:32} {r['truth_rps']:7.2f} {r['truth_se_rps']:5.2f} {r.get('mean_curve_crossing_rps') or math.nan:7.2f} "
              f"{r['covered']:3d}/{r['searches']:<4d} {r['inconclusive']:7d} {r['median_rel_width']:6.1%} "
              f"{r['median_probes']:6.0f} {r['median_virtual_s']:6.0f} {r['sweep_probes'] or 0:12d}")
    print(f"\nall: covered {total['covered']}/{n} ({total['covered'] / n:.1%}), inconclusive {total['inconclusive']}/{n} "
          f"({total['inconclusive'] / n:.1%}), median width {total['median_rel_width']:.1%} of capacity, median "
          f"{total['median_probes']:g} probes and {total['median_virtual_s']:.0f} virtual s a search; a dense sweep "
          f"of the same precision: median {total['median_sweep_probes']:g} probes; wall {total['wall_s']:.0f} s")
    write_result("capacity_coverage", {
        "covered": total["covered"], "searches": n, "coverage_pct": round(100 * total["covered"] / n, 1),
        "inconclusive": total["inconclusive"], "variants": len(rows), "truth_seeds": args.truth_seeds,
        "median_width_pct": round(100 * total["median_rel_width"], 1)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "jitter_sd": JITTER_SD, "rows": rows, "total": total, "searches": searches},
                      f, indent=1)


if __name__ == "__main__":
    main()
