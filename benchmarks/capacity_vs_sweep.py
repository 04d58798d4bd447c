"""Does the capacity search agree with a dense sweep? The modeled reference engine on a virtual clock.

    .venv/bin/python benchmarks/capacity_vs_sweep.py [--trials 5] [--replicates 5]

For each engine variant: one capacity search (bracket, bisect, 5 replicate seeds at the bracket edges),
and a dense sweep (many rates, attainment averaged over 20 seeds) whose crossing of the 90% target is
the reference. Prints both, the reported interval, and whether it covers the sweep's crossing.

The engine runs in process on a `VirtualClock`: the real scheduler and block manager, modeled step times
(baselines/ci-profile.json), a small per-step timing jitter standing in for a real machine's noise, and
no HTTP. Every request arrives at its scheduled time, so this measures the server, never the client.
`virtual_measure` is also what tests/test_gate_engine.py and benchmarks/gate_false_alarm.py use.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from slobench.capacity import Measure, SearchOptions, search_capacity
from slobench.metrics import RecordArrays, describe
from slobench.records import RequestRecord, RequestSpec
from slobench.slo import SLO
from slobench.sweep import crossing_rate
from slobench.workload import generate, load_workload

ROOT = Path(__file__).resolve().parents[1]
CI_PROFILE = ROOT / "baselines" / "ci-profile.json"
CI_SLO = SLO(ttft_s=0.3, tpot_s=0.07, target=0.9)


@dataclass(frozen=True, slots=True)
class EngineVariant:
    name: str = "baseline"
    kv_blocks: int = 60
    step_scale: float = 1.0  # 1.15 = every step 15% slower
    jitter_sd: float = 0.01  # relative per-step timing noise
    max_num_seqs: int = 64


def simulate(specs: list[RequestSpec], v: EngineVariant, *, jitter_seed: int = 0) -> list[RequestRecord]:
    """Run the requests through the engine on a virtual clock; one record per request, like a target's."""
    base = CostProfile.load(CI_PROFILE)
    s = v.step_scale
    profile = dataclasses.replace(
        base, step_overhead_s=base.step_overhead_s * s, per_prefill_token_s=base.per_prefill_token_s * s,
        per_decode_seq_s=base.per_decode_seq_s * s, per_context_token_s=base.per_context_token_s * s,
    )
    ex = ModeledExecutor(profile, block_size=16, num_blocks=v.kv_blocks, vocab_size=32000)
    rng = np.random.default_rng(jitter_seed)
    execute = ex.execute

    def jittered(batch: Any) -> Any:
        r = execute(batch)
        return dataclasses.replace(r, modeled_s=r.modeled_s * max(0.5, 1 + rng.normal(0, v.jitter_sd)))

    ex.execute = jittered  # type: ignore[method-assign]
    clock = VirtualClock()
    engine = LLMEngine(EngineConfig(num_blocks=v.kv_blocks, max_num_seqs=v.max_num_seqs), ex, clock)
    specs = sorted(specs, key=lambda x: x.arrival_s)
    records: dict[int, RequestRecord] = {}
    by_rid: dict[int, RequestRecord] = {}
    i = 0
    while i < len(specs) or engine.has_work():
        while i < len(specs) and specs[i].arrival_s <= clock.now_s():
            sp = specs[i]
            rec = RequestRecord(sp.request_id, sp.arrival_s, sent_s=sp.arrival_s, input_tokens=sp.input_tokens,
                                max_tokens=sp.max_tokens, prompt_tokens=sp.input_tokens)
            records[sp.request_id] = rec
            prompt = list(sp.prompt) if isinstance(sp.prompt, tuple) else [16] * sp.input_tokens
            by_rid[engine.add_request(prompt, sp.max_tokens, ignore_eos=True)] = rec
            i += 1
        if not engine.has_work():
            clock.advance_to(specs[i].arrival_s)
            continue
        for ev in engine.step():
            rec = by_rid[ev.request_id]
            if ev.token_id is not None:
                if rec.first_token_s is None:
                    rec.first_token_s = ev.time_s
                rec.chunk_times_s.append(ev.time_s)
                rec.chunk_tokens.append(1)
                rec.output_tokens += 1
            if ev.finish_reason is not None:
                rec.done_s = ev.time_s
    return list(records.values())


def tiny_specs(num_requests: int = 120) -> Callable[[float, int], list[RequestSpec]]:
    wl = load_workload("tiny")

    def make(rate: float, seed: int) -> list[RequestSpec]:
        return generate(wl, rate_rps=rate, num_requests=num_requests, seed=seed, input_len=32, output_len=16)

    return make


def lean_summary(records: list[RequestRecord], slo: SLO) -> dict[str, Any]:
    """The parts of `slobench.summary.summarize` that capacity and the gate read, without its bootstrap
    intervals (4x the simulation's own cost, and replicates, not bootstraps, decide here)."""
    a = RecordArrays.from_records(records)
    met = slo.meets(a)
    return {
        "attainment": {"value": float(met.mean()), "ci_low": None, "ci_high": None},
        "ttft_s": describe(a.ttft_s), "ttft_from_scheduled_s": describe(a.ttft_from_scheduled_s),
        "tpot_s": describe(a.tpot_s), "e2e_s": describe(a.e2e_s),
    }


def virtual_measure(v: EngineVariant, slo: SLO = CI_SLO, *, num_requests: int = 120, trial: int = 0) -> Measure:
    """A capacity `measure` backed by `simulate`. The jitter stream depends on (trial, rate, seed)."""
    make = tiny_specs(num_requests)

    async def measure(rate: float, seed: int) -> dict[str, Any]:
        jitter_seed = zlib.crc32(repr((trial, round(rate, 6), seed, v.name)).encode())
        return lean_summary(simulate(make(rate, seed), v, jitter_seed=jitter_seed), slo)

    return measure


async def dense_crossing(measure: Measure, rates: list[float], seeds: list[int], target: float) -> tuple[float | None, list[float]]:
    means = []
    for r in rates:
        means.append(float(np.mean([(await measure(r, s))["attainment"]["value"] for s in seeds])))
    return crossing_rate(rates, means, target), means


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--sweep-seeds", type=int, default=20)
    ap.add_argument("--num-requests", type=int, default=120)
    args = ap.parse_args()
    variants = [EngineVariant(), EngineVariant("step+15%", step_scale=1.15), EngineVariant("kv-30%", kv_blocks=42),
                EngineVariant("kv=120", kv_blocks=120)]
    print(f"SLO {CI_SLO}; workload tiny (32 in / 16 out), {args.num_requests} requests per run; "
          f"{args.replicates} replicates; sweep mean over {args.sweep_seeds} seeds\n")
    print(f"{'variant':10} {'capacity':>9} {'interval':>17} {'probes':>6} {'sweep x':>8} {'covered':>7} {'time':>6}")
    for v in variants:
        t0 = time.perf_counter()
        m = virtual_measure(v, num_requests=args.num_requests)
        res = await search_capacity(m, SearchOptions(start_rps=4.0, replicates=args.replicates, seed=0))
        lo, hi = res.interval_rps or (float("nan"), float("nan"))
        cap = res.capacity_rps or float("nan")
        rates = list(np.round(np.linspace(0.6 * cap, 1.4 * cap, 33), 4))
        seeds = list(range(10_000, 10_000 + args.sweep_seeds))  # not the search's seeds
        x, _ = await dense_crossing(m, rates, seeds, CI_SLO.target)
        covered = x is not None and lo <= x <= hi
        print(f"{v.name:10} {cap:9.2f} [{lo:7.2f}, {hi:7.2f}] {len(res.probes):6d} "
              f"{x if x is not None else float('nan'):8.2f} {'yes' if covered else 'NO':>7} {time.perf_counter() - t0:5.1f}s")


if __name__ == "__main__":
    asyncio.run(main())
