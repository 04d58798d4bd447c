"""How much does the client itself distort what it measures?

Drives the scheduled-token test server (its own process, pinned to one core) with open-loop Poisson
traffic from this process (pinned to the other core) and prints, per target rate and HTTP transport:
achieved send rate, send lateness p50/p99, client CPU per request, and the TTFT error — the client's
TTFT minus the server's own (first chunk written − request received, from the server's log on the same
system-wide monotonic clock).

Target (issue 2): at 500 req/s with 32-token streams, achieved rate within 1% of target, lateness p99
under 2 ms, TTFT error p50 under 0.5 ms, on a 2-core machine with the server beside the client.

    python benchmarks/client_overhead.py [--rates 100,250,500] [--seconds 6] [--transports aiohttp,httpx]
                                         [--client-workers 1,2]

With `--client-workers N` (N > 1) the requests are sent from N worker processes (slobench.targets.workers);
"client CPU" then counts the parent and its workers together, and "parent CPU" the dispatcher alone. The
workers inherit the client's core, so on a 2-core machine this measures the cost of the hop, not the
scaling (that needs a core per worker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time

import numpy as np

from slobench.clock import Clock
from slobench.metrics import RecordArrays, achieved_send_rps, throughput
from slobench.records import RequestSpec
from slobench.runner import RunOptions, run
from slobench.targets.openai import OpenAITarget
from slobench.targets.workers import WorkerPool
from slobench.testing import TokenServerProcess
from slobench.workload import PoissonArrivals


def make_specs(rate: float, seconds: float, output_len: int, seed: int) -> list[RequestSpec]:
    arrivals = PoissonArrivals(rate).schedule(np.random.default_rng(seed), duration_s=seconds)
    prompt = tuple(range(1000, 1016))
    return [
        RequestSpec(i, float(t), prompt, len(prompt), output_len, extra_body=(("x_request_id", i),))
        for i, t in enumerate(arrivals)
    ]


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children only: the workers, after close()
    return ru.ru_utime + ru.ru_stime


async def measure(srv: TokenServerProcess, rate: float, seconds: float, transport: str, output_len: int,
                  workers: int = 1) -> dict:
    clock = Clock()
    specs = make_specs(rate, seconds, output_len, seed=int(rate))
    target: OpenAITarget | WorkerPool
    if workers > 1:
        target = WorkerPool(workers, {"base_url": srv.base_url, "model": srv.model, "transport": transport},
                            clock=clock)
    else:
        target = OpenAITarget(srv.base_url, srv.model, clock=clock, transport=transport)  # type: ignore[arg-type]
    await target.start()
    children0 = _children_cpu_s()
    try:
        # warm the connection pool so the first second doesn't measure connection set-up
        warm = make_specs(rate, 0.5, output_len, seed=1)
        await run(warm, target, opts=RunOptions(progress=False), handle_sigint=False)
        log_before = len(srv.read_log())
        cpu0 = time.process_time()
        res = await run(specs, target, opts=RunOptions(progress=False), handle_sigint=False)
        cpu = time.process_time() - cpu0
    finally:
        await target.close()
    # The workers' CPU is known only once they exit: spread it over warm-up and measured requests alike.
    worker_cpu = (_children_cpu_s() - children0) * len(specs) / (len(specs) + len(warm))
    a = RecordArrays.from_records(res.records)
    server = {e["id"]: e for e in srv.read_log()[log_before:] if e.get("id") is not None}
    errs = []
    for r in res.records:
        e = server.get(r.request_id)
        if e and r.first_token_s is not None and r.sent_s is not None and e.get("chunk_s"):
            errs.append((r.first_token_s - r.sent_s) - (e["chunk_s"][0] - e["recv_s"]))
    late = a.lateness_s[~np.isnan(a.lateness_s)]
    return {
        "rate": rate,
        "transport": transport,
        "n": len(res.records),
        "ok": int(a.is_ok.sum()),
        "achieved": achieved_send_rps(a),
        "offered": throughput(a).offered_rps,  # this schedule's own rate (Poisson noise aside)
        "late_p50_ms": float(np.percentile(late, 50) * 1e3),
        "late_p99_ms": float(np.percentile(late, 99) * 1e3),
        "workers": workers,
        "cpu_ms_per_req": (cpu + worker_cpu) / max(1, len(res.records)) * 1e3,
        "parent_cpu_ms_per_req": cpu / max(1, len(res.records)) * 1e3,
        "ttft_err_p50_ms": float(np.median(errs) * 1e3) if errs else float("nan"),
        "ttft_err_p99_ms": float(np.percentile(errs, 99) * 1e3) if errs else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,250,500")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--transports", default="aiohttp,httpx")
    ap.add_argument("--client-workers", default="1", help="comma-separated worker counts to compare (1 = in-process)")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    with TokenServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, log=True) as srv:
        if len(cores) >= 2:  # server on one core, client on another, as the measurement setup
            os.sched_setaffinity(srv.pid or 0, {cores[-1]})
            os.sched_setaffinity(0, {cores[0]})
        rows = []
        for transport in args.transports.split(","):
            for workers in (int(w) for w in args.client_workers.split(",")):
                for rate in (float(r) for r in args.rates.split(",")):
                    rows.append(asyncio.run(measure(srv, rate, args.seconds, transport, args.output_len, workers)))
    print(f"\nclient overhead: {args.output_len}-token streams, server TTFT {args.ttft_ms:g} ms / ITL {args.itl_ms:g} ms, "
          f"{args.seconds:g} s per rate, {os.cpu_count()} cores")
    print("| transport | workers | target req/s | scheduled req/s | achieved req/s | ok | lateness p50 ms | "
          "lateness p99 ms | client CPU ms/req | parent CPU ms/req | TTFT error p50 ms | TTFT error p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['transport']} | {r['workers']} | {r['rate']:g} | {r['offered']:.1f} | "
              f"{r['achieved']:.1f} ({r['achieved'] / r['offered'] - 1:+.2%}) | "
              f"{r['ok']}/{r['n']} | {r['late_p50_ms']:.2f} | {r['late_p99_ms']:.2f} | {r['cpu_ms_per_req']:.2f} | "
              f"{r['parent_cpu_ms_per_req']:.2f} | {r['ttft_err_p50_ms']:.2f} | {r['ttft_err_p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
