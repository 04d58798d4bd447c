"""The highest rate held accurately with 1, 2, 4 ... Ray load actors (slobench.targets.ray_pool).

Drives the scheduled-token server (its own process, pinned to the last core) with open-loop Poisson
traffic from a `RayPool` of N actors on a local Ray instance, and for each N climbs a ladder of rates until
one is missed. A rate is held when every request succeeded, the achieved rate is within 3 sqrt(n) / T of
the target, the TTFT error p99 is under each bar of `--limits-ms`, and every lower rung was held too. The
in-process client is measured the same way. Ray runs in a network namespace with only loopback (the script
re-executes itself under `unshare -n`). Figures: docs/measurements/scale_out.md.

    python benchmarks/scale_out.py [--actors 1,2,4] [--rates 25,50,...] [--seconds 4] [--limits-ms 2,10] [--no-pin]"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from slobench.analysis.metrics import RecordArrays, achieved_send_rps
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.ray_pool import RayPool
from slobench.testing import TokenServerProcess
from slobench.workload import PoissonArrivals

TTFT_ERR_P99_LIMITS_MS = (2.0, 10.0)  # the target, and a looser bar that a loaded shared machine can show


def make_specs(rate: float, seconds: float, output_len: int, seed: int, first_id: int) -> list[RequestSpec]:
    arrivals = PoissonArrivals(rate).schedule(np.random.default_rng(seed), duration_s=seconds)
    prompt = tuple(range(1000, 1016))
    return [RequestSpec(first_id + i, float(t), prompt, len(prompt), output_len,
                        extra_body=(("x_request_id", first_id + i),)) for i, t in enumerate(arrivals)]


class Prober:
    def __init__(self, srv: TokenServerProcess, target: Any, seconds: float, output_len: int) -> None:
        self.srv, self.target, self.seconds, self.output_len = srv, target, seconds, output_len
        self.next_id = 0

    def _specs(self, rate: float, seconds: float, seed: int) -> list[RequestSpec]:
        specs = make_specs(rate, seconds, self.output_len, seed, self.next_id)
        self.next_id += len(specs) + 1
        return specs

    async def probe(self, rate: float) -> dict[str, Any]:
        opts = RunOptions(progress=False)
        await run(self._specs(rate, 0.5, seed=1), self.target, opts=opts, handle_sigint=False)  # warm connections
        specs = self._specs(rate, self.seconds, seed=int(rate) + 7)
        cpu0 = time.process_time()
        res = await run(specs, self.target, opts=opts, handle_sigint=False)
        driver_cpu_s = time.process_time() - cpu0
        actor_cpu_s = None
        if isinstance(self.target, RayPool):  # the actors' own CPU
            report = await self.target.run_report(None)
            actor_cpu_s = sum(x["cpu_s"] or 0.0 for x in report["actors"])  # includes the warm-up's
        ids = {s.request_id for s in specs}
        server = {e["id"]: e for e in self.srv.read_log() if e.get("id") in ids}
        errs = []
        for r in res.records:
            e = server.get(r.request_id)
            if e and r.first_token_s is not None and r.sent_s is not None and e.get("chunk_s"):
                errs.append((r.first_token_s - r.sent_s) - (e["chunk_s"][0] - e["recv_s"]))
        a = RecordArrays.from_records(res.records)
        n = len(res.records)
        achieved = achieved_send_rps(a)
        noise = 3 * math.sqrt(n) / self.seconds
        err_p99 = float(np.percentile(errs, 99)) if errs else float("inf")
        late = a.lateness_s[~np.isnan(a.lateness_s)]
        ok = int(a.is_ok.sum())
        return {
            "rate": rate, "n": n, "ok": ok, "achieved": achieved, "noise": noise,
            "late_p99_ms": float(np.percentile(late, 99) * 1e3) if late.size else float("nan"),
            "ttft_err_p50_ms": float(np.median(errs) * 1e3) if errs else float("nan"),
            "ttft_err_p99_ms": err_p99 * 1e3,
            "driver_cpu_ms_per_req": driver_cpu_s / max(1, n) * 1e3,
            "actor_cpu_ms_per_req": None if actor_cpu_s is None else actor_cpu_s / max(1, n + rate * 0.5) * 1e3,
            "on_rate": ok == n and abs(achieved - rate) <= noise,
        }


def held(row: dict[str, Any], limit_ms: float) -> bool:
    return bool(row["on_rate"] and row["ttft_err_p99_ms"] < limit_ms)


async def highest_held(prober: Prober, rates: list[float], label: str, limits_ms: list[float]
                       ) -> dict[float, float | None]:
    """Climb the ladder until the loosest limit is missed; per limit, the highest rate held with every
    rate below it held too."""
    rows = []
    for rate in rates:
        row = await prober.probe(rate)
        rows.append(row)
        _show(label, row, limits_ms)
        if not held(row, max(limits_ms)):
            break
    best: dict[float, float | None] = {}
    for limit in limits_ms:
        best[limit] = None
        for row in rows:
            if not held(row, limit):
                break
            best[limit] = row["rate"]
    return best


def _show(label: str, r: dict[str, Any], limits_ms: list[float]) -> None:
    acpu = "-" if r["actor_cpu_ms_per_req"] is None else f"{r['actor_cpu_ms_per_req']:.2f}"
    print(f"| {label} | {r['rate']:g} | {r['achieved']:.1f} (±{r['noise']:.1f}) | {r['ok']}/{r['n']} | "
          f"{r['late_p99_ms']:.2f} | {r['ttft_err_p50_ms']:.2f} | {r['ttft_err_p99_ms']:.2f} | "
          f"{r['driver_cpu_ms_per_req']:.2f} | {acpu} | "
          f"{' / '.join('yes' if held(r, x) else 'no' for x in limits_ms)} |", flush=True)


async def measure(args: argparse.Namespace, srv: TokenServerProcess) -> dict[str, dict[float, float | None]]:
    rates = [float(r) for r in args.rates.split(",")]
    options = TargetOptions(model=srv.model, server_profile="vllm")
    limits = [float(x) for x in args.limits_ms.split(",")]
    best: dict[str, dict[float, float | None]] = {}
    print("| client | target req/s | achieved req/s (Poisson 3σ) | ok | lateness p99 ms | TTFT error p50 ms | "
          "TTFT error p99 ms | driver CPU ms/req | actor CPU ms/req | held (TTFT err p99 < "
          + " / ".join(f"{x:g}" for x in limits) + " ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if not args.no_inprocess:
        async with OpenAITarget(srv.base_url, options, Clock()) as t:
            best["in-process"] = await highest_held(Prober(srv, t, args.seconds, args.output_len), rates,
                                                    "in-process", limits)
    for n in (int(x) for x in args.actors.split(",")):
        async with RayPool(n, srv.base_url, options) as pool:
            label = f"ray × {n}"
            best[label] = await highest_held(Prober(srv, pool, args.seconds, args.output_len), rates, label, limits)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", default="1,2,4")
    ap.add_argument("--rates", default="25,50,100,150,200,300,400,600,800")
    ap.add_argument("--limits-ms", default=",".join(f"{x:g}" for x in TTFT_ERR_P99_LIMITS_MS),
                    help="TTFT error p99 bars, ms (default 2,10: the target, and a looser one)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--no-pin", action="store_true", help="leave the server and the client on every core")
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process reference")
    args = ap.parse_args()
    if os.environ.get("SLOBENCH_RAY_NETNS") != "1":  # Ray and the server only ever see loopback
        cmd = 'ip link set lo up && exec "$0" "$@"'
        env = {**os.environ, "SLOBENCH_RAY_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        sys.exit(subprocess.call(["unshare", "-n", "bash", "-c", cmd, sys.executable, *sys.argv], env=env))
    import ray

    cores = sorted(os.sched_getaffinity(0))
    with TokenServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, log=True) as srv:
        pinned = not args.no_pin and len(cores) >= 2
        if pinned:  # the server on a core of its own; the driver, Ray and its actors (inherited) on the rest
            os.sched_setaffinity(srv.pid or 0, {cores[-1]})
            os.sched_setaffinity(0, set(cores[:-1]))
        client_cores = len(cores) - 1 if pinned else len(cores)
        ray.init(address="local", num_cpus=max(8, client_cores), include_dashboard=False, log_to_driver=False)
        try:
            best = asyncio.run(measure(args, srv))
        finally:
            ray.shutdown()
    load = os.getloadavg()
    print(f"\nscale-out: {args.output_len}-token streams, server TTFT {args.ttft_ms:g} ms / ITL {args.itl_ms:g} ms, "
          f"{args.seconds:g} s per rate; {len(cores)} cores, server "
          f"{'pinned to its own core' if pinned else 'sharing every core'}, client (driver + Ray + actors) on "
          f"{client_cores} core(s); load average {load[0]:.1f} (other work on the machine counts)")
    limits = [float(x) for x in args.limits_ms.split(",")]
    print("| client | " + " | ".join(f"highest rate held, TTFT error p99 < {x:g} ms (req/s)" for x in limits) + " |")
    print("|---|" + "---|" * len(limits))
    for label, per in best.items():
        print(f"| {label} | " + " | ".join("none of the ladder" if per[x] is None else f"{per[x]:g}" for x in limits)
              + " |")


if __name__ == "__main__":
    main()
