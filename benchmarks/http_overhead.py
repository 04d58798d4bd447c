"""What does the HTTP/SSE layer add to what slobench measures?

The same requests (same seed, same modeled engine) three ways: on a virtual clock (slobench.fleet.simulate),
to the engine in this process on real time (EngineTarget), and to `python -m reference_engine.server`
over 127.0.0.1; prints TTFT and ITL quantiles of each. With `--replicas N` the same for a fleet: the
simulated one, N in-process engines and N servers, the last two behind the client-side router
(slobench.fleet.client_routed). Figures: docs/measurements/http_overhead.md.

    python benchmarks/http_overhead.py [--rate 10] [--num-requests 200] [--profile cpu-tiny]
                                       [--replicas 2 --router least-outstanding]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import numpy as np
from result_json import write_result  # this folder is on sys.path

from slobench.analysis.metrics import RecordArrays
from slobench.fleet.client_routed import FleetTarget
from slobench.fleet.simulate import simulate_run
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.engine import EngineTarget
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import EngineServerProcess
from slobench.workload import generate, load_workload


def row(name: str, records: list[RequestRecord]) -> str:
    a = RecordArrays.from_records(records)
    ttft = a.ttft_s[~np.isnan(a.ttft_s)] * 1e3
    itl = a.itl_s * 1e3
    q = [50, 90, 99]
    t = "/".join(f"{v:.2f}" for v in np.percentile(ttft, q))
    i = "/".join(f"{v:.2f}" for v in np.percentile(itl, q))
    return f"| {name} | {int(a.is_ok.sum())}/{len(a)} | {t} | {i} |"


def ttft_p50_ms(records: list[RequestRecord]) -> float:
    ttft = RecordArrays.from_records(records).ttft_s
    return float(np.median(ttft[~np.isnan(ttft)]) * 1e3)


async def measure(specs: list[RequestSpec], knobs: dict, urls: list[str] | None, replicas: int = 1,
                  router: str = "least-outstanding") -> list[RequestRecord]:
    clock = Clock()
    one: list[Any] = ([OpenAITarget(url, TargetOptions(model="tiny"), clock) for url in urls] if urls else
                      [EngineTarget(knobs, clock, model_name="tiny") for _ in range(replicas)])
    target: Any = FleetTarget(one, router) if len(one) > 1 else one[0]
    await target.start()
    try:
        res = await run(specs, target, opts=RunOptions(progress=False), handle_sigint=False)
    finally:
        await target.close()
    return res.records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--router", default="least-outstanding")
    args = ap.parse_args()
    specs = generate(load_workload("tiny"), rate_rps=args.rate, num_requests=args.num_requests, seed=args.seed)
    knobs = {"executor": "modeled", "profile": args.profile, "kv_blocks": args.kv_blocks}
    n = args.replicas
    virtual, _ = simulate_run(specs, knobs, seed=args.seed, intervals=False, replicas=n, router=args.router)
    in_process = asyncio.run(measure(specs, knobs, None, n, args.router))
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(EngineServerProcess("--executor", "modeled", "--profile", args.profile,
                                                           "--kv-blocks", str(args.kv_blocks))) for _ in range(n)]
        http = asyncio.run(measure(specs, knobs, [srv.base_url for srv in servers], n, args.router))
    fleet = f", {n} replicas behind {args.router}" if n > 1 else ""
    print(f"\n{args.num_requests} tiny requests at {args.rate:g} req/s (Poisson, seed {args.seed}), modeled engine "
          f"profile {args.profile}, {args.kv_blocks} KV blocks{fleet}")
    print("| path | ok | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms |")
    print("|---|---|---|---|")
    for name, recs in (("virtual clock", virtual), ("in-process, real time", in_process), ("HTTP + SSE", http)):
        print(row(name, recs))
    if n == 1:  # the headline is one engine's
        p50 = {k: ttft_p50_ms(recs) for k, recs in (("virtual", virtual), ("in_process", in_process), ("http", http))}
        write_result("http_overhead", {
            **{f"ttft_p50_ms_{k}": round(v, 2) for k, v in p50.items()},
            "http_added_ttft_p50_ms": round(p50["http"] - p50["in_process"], 2),
            "virtual_vs_real_ttft_p50_ms": round(abs(p50["virtual"] - p50["in_process"]), 2),
        })


if __name__ == "__main__":
    main()
