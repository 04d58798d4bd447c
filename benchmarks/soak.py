"""Soak: 20k requests with random client aborts against the bundled engine; nothing may grow or leak.

Sends open-loop segments from slobench's runner and OpenAI target to the engine's server (a child process,
modeled executor), abandoning a share of requests at a random moment. After each segment, once the engine
is idle: every request has exactly one record, no KV block is held (free + cached == total), the engine's
idle check never failed, and the server finished no more requests than were sent. Prints both processes'
RSS per segment and fails (exit 1) when either grew more than 10% after warm-up.
Figures: docs/measurements/soak.md.

    python benchmarks/soak.py                       # 20,000 requests in 10 segments at 150 req/s
    python benchmarks/soak.py --requests 4000 --segments 4 --rate 100"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
from typing import Any

import httpx
from result_json import write_result  # this folder is on sys.path

from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts
from slobench.testing.process import EngineServerProcess

WARMUP_SEGMENTS = 2
MAX_GROWTH = 0.10


def rss_mib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class AbortingTarget(TargetBase):
    """The OpenAI target, with a share of requests abandoned by the client at a random moment."""

    def __init__(self, inner: OpenAITarget, abort_share: float, seed: int) -> None:
        self.inner, self.clock, self.abort_share = inner, inner.clock, abort_share
        self._rng = random.Random(seed)
        self.num_aborted = 0

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        if self._rng.random() >= self.abort_share:
            await self.inner.send(spec, record)
            return
        try:
            await asyncio.wait_for(self.inner.send(spec, record), self._rng.uniform(0.005, 0.15))
        except TimeoutError:
            self.num_aborted += 1
            record.fail("cancelled", "client abort (soak)", self.clock.now_s())


def specs(n: int, rate_rps: float, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    prefixes = ["You are a helpful assistant. " * 3, "Summarise the following text: ", ""]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate_rps)
        prompt = rng.choice(prefixes) + f"soak request {seed}-{i} " + "x" * rng.randint(0, 40)
        out.append(RequestSpec(request_id=i, arrival_s=t, prompt=prompt, input_tokens=len(prompt),
                               max_tokens=rng.randint(4, 48)))
    return out


def metrics(root_url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(root_url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = out.get(key, 0.0) + float(val)
    return out


def total(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def finished(m: dict[str, float]) -> float:
    return total(m, "vllm:request_success_total")


async def wait_idle(root_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(root_url)
        busy = (total(m, "vllm:num_requests_running") + total(m, "vllm:num_requests_waiting")
                + total(m, "slobench_engine:kv_blocks_in_use"))
        if busy == 0 or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.1)


async def soak(args: argparse.Namespace) -> int:
    per_segment = args.requests // args.segments
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    with EngineServerProcess("--executor", "modeled", "--kv-blocks", "4096", "--max-num-seqs", "128",
                             "--max-batched-tokens", "4096") as srv:
        assert srv.pid is not None
        target = OpenAITarget(srv.base_url, TargetOptions(model="tiny", timeouts=Timeouts(request_s=60.0)), Clock())
        await target.start()
        await target.preflight()
        aborting = AbortingTarget(target, args.abort, args.seed)
        before = finished(metrics(srv.root_url))
        t_start = time.monotonic()
        try:
            for seg in range(args.segments):
                batch = specs(per_segment, args.rate, args.seed * 1000 + seg)
                res = await run(batch, aborting, opts=RunOptions(progress=False, grace_s=30.0), handle_sigint=False)
                m = await wait_idle(srv.root_url)
                statuses: dict[str, int] = {}
                for r in res.records:
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                ids = {r.request_id for r in res.records}
                done = finished(m) - before
                before = finished(m)
                kv_total = total(m, "slobench_engine:kv_blocks_total")
                kv_free_cached = total(m, "slobench_engine:kv_blocks_free") + total(m, "slobench_engine:kv_blocks_cached")
                row = {"segment": seg + 1, "records": len(res.records), "statuses": statuses, "server_done": int(done),
                       "kv_in_use": int(total(m, "slobench_engine:kv_blocks_in_use")),
                       "kv_accounted": kv_free_cached == kv_total,
                       "idle_check_failures": int(total(m, "slobench_engine:idle_check_failures_total")),
                       "harness_rss_mib": rss_mib(), "engine_rss_mib": rss_mib(srv.pid)}
                rows.append(row)
                print(f"segment {row['segment']:2d}: {row['records']} records {statuses}  server finished "
                      f"{row['server_done']}  KV in use {row['kv_in_use']}  harness {row['harness_rss_mib']:.1f} MiB"
                      f"  engine {row['engine_rss_mib']:.1f} MiB", flush=True)
                if len(res.records) != per_segment or ids != {s.request_id for s in batch}:
                    problems.append(f"segment {seg + 1}: {len(res.records)} records for {per_segment} requests")
                if row["kv_in_use"] or not row["kv_accounted"] or row["idle_check_failures"]:
                    problems.append(f"segment {seg + 1}: KV leak or idle-check failure: {row}")
                if done > per_segment or done < statuses.get("ok", 0):
                    problems.append(f"segment {seg + 1}: server finished {done} for {per_segment} sent")
                del res, batch
                gc.collect()
        finally:
            await target.close()
        elapsed_s = time.monotonic() - t_start
        if srv.stderr_text().count("Traceback"):
            problems.append("the engine logged tracebacks")
    steady = rows[WARMUP_SEGMENTS:]
    print(f"\n{args.requests} requests ({aborting.num_aborted} abandoned by the client) in {elapsed_s:.0f} s")
    growths: dict[str, float] = {}
    for who in ("harness", "engine"):
        values = [r[f"{who}_rss_mib"] for r in steady]
        if values:
            growth = growths[who] = (max(values) - values[0]) / values[0]
            print(f"{who} RSS after warm-up: {values[0]:.1f} -> {values[-1]:.1f} MiB (max {max(values):.1f}, "
                  f"growth {growth:+.1%}, limit {MAX_GROWTH:.0%})")
            if growth > MAX_GROWTH:
                problems.append(f"{who} RSS grew {growth:.1%} after warm-up")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    print("soak: OK" if not problems else f"soak: {len(problems)} problem(s)")
    if not problems:  # the headline says every check held
        write_result("soak", {"requests": args.requests, "aborted": aborting.num_aborted,
                              "harness_rss_growth_pct": round(100 * growths["harness"], 1),
                              "engine_rss_growth_pct": round(100 * growths["engine"], 1)})
    return 1 if problems else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--segments", type=int, default=10)
    p.add_argument("--rate", type=float, default=150.0, help="offered req/s within a segment")
    p.add_argument("--abort", type=float, default=0.2, help="share of requests the client abandons")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.segments <= WARMUP_SEGMENTS:
        p.error(f"--segments must be more than {WARMUP_SEGMENTS} (the warm-up)")
    return asyncio.run(soak(args))


if __name__ == "__main__":
    raise SystemExit(main())
