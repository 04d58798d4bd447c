"""What does the HTTP/SSE layer add to what slobench measures?

The same requests (same seed, same modeled engine knobs) three ways:
  virtual    the engine's scheduler on a virtual clock (slobench.simulate): the modeled time alone
  in-process the engine in this process, on real time (slobench.targets.engine.EngineTarget)
  http       the engine served by `python -m reference_engine.server`, loaded over 127.0.0.1
and prints TTFT and ITL quantiles for each, so the difference between rows is what real time, then the
HTTP server, SSE and the client's event loop add.

    python benchmarks/http_overhead.py [--rate 10] [--num-requests 200] [--profile cpu-tiny]
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from slobench.clock import Clock
from slobench.metrics import RecordArrays
from slobench.records import RequestRecord, RequestSpec
from slobench.runner import RunOptions, run
from slobench.simulate import simulate_run
from slobench.targets.engine import EngineTarget
from slobench.targets.openai import OpenAITarget
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


async def measure(specs: list[RequestSpec], knobs: dict, url: str | None) -> list[RequestRecord]:
    clock = Clock()
    target = OpenAITarget(url, "tiny", clock=clock) if url else EngineTarget(knobs, clock, model_name="tiny")
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
    args = ap.parse_args()
    specs = generate(load_workload("tiny"), rate_rps=args.rate, num_requests=args.num_requests, seed=args.seed)
    knobs = {"executor": "modeled", "profile": args.profile, "kv_blocks": args.kv_blocks}
    virtual, _ = simulate_run(specs, knobs, seed=args.seed, intervals=False)
    in_process = asyncio.run(measure(specs, knobs, None))
    with EngineServerProcess("--executor", "modeled", "--profile", args.profile,
                             "--kv-blocks", str(args.kv_blocks)) as srv:
        http = asyncio.run(measure(specs, knobs, srv.base_url))
    print(f"\n{args.num_requests} tiny requests at {args.rate:g} req/s (Poisson, seed {args.seed}), modeled engine "
          f"profile {args.profile}, {args.kv_blocks} KV blocks")
    print("| path | ok | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms |")
    print("|---|---|---|---|")
    for name, recs in (("virtual clock", virtual), ("in-process, real time", in_process), ("HTTP + SSE", http)):
        print(row(name, recs))


if __name__ == "__main__":
    main()
