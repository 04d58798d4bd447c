"""Streaming trace replay against loading the trace whole, on a synthetic Mooncake-style trace.

Writes a trace once to --dir (--rows requests at 200 req/s, lognormal lengths, `hash_ids` whose first block
comes from 1,000 Zipf-popular system prompts), then, each way in a fresh process, sends its first --seconds
through `slobench.run.runner.run` to a target that answers at once. Prints the time to the first request,
RSS while sending and at its peak, and send lateness. "whole" is `TraceReplay` (sweep, capacity); "stream"
is `StreamingReplay` (`run --trace`); "all" pulls every request, nothing sent, to show memory flat in the
trace's length. Figures: docs/measurements/trace_replay.md.

    .venv/bin/python benchmarks/trace_replay.py [--rows 1000000] [--seconds 20] [--dir /tmp]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import numpy as np
from result_json import write_result  # this folder is on sys.path

RATE_RPS = 200.0


def write_trace(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    t_ms = np.floor(np.cumsum(rng.exponential(1000.0 / RATE_RPS, rows))).astype(np.int64)
    ins = np.clip(np.rint(np.exp(rng.normal(np.log(1000), 1.0, rows))), 1, 16_000).astype(np.int64)
    outs = np.clip(np.rint(np.exp(rng.normal(np.log(200), 0.8, rows))), 1, 4_000).astype(np.int64)
    system = np.minimum(rng.zipf(1.2, rows), 1000) - 1
    next_id = 1000
    with open(path, "w") as fh:
        for ts, n_in, n_out, first in zip(t_ms.tolist(), ins.tolist(), outs.tolist(), system.tolist(), strict=True):
            num_blocks = -(-n_in // 512)
            ids = [first, *range(next_id, next_id + num_blocks - 1)]
            next_id += num_blocks - 1
            fh.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                 "hash_ids": ids}, separators=(",", ":")) + "\n")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def _run(mode: str, path: str, n: int) -> tuple[float, np.ndarray, float]:
    """Open the trace, run its first `n` requests; (seconds from opening to the first send, lateness, the
    largest RSS sampled while sending)."""
    from slobench.run.clock import Clock
    from slobench.run.records import RequestRecord, RequestSpec
    from slobench.run.runner import RunOptions, run
    from slobench.targets.base import TargetBase
    from slobench.workload.base import RunShape
    from slobench.workload.replay import TraceReplay
    from slobench.workload.trace_stream import StreamingReplay

    class InstantTarget(TargetBase):
        """Answers every request at once: what is left is the client's own timing. Notes the first send on
        the process's performance counter. (Defined here: the child measures its RSS before importing.)"""

        def __init__(self, clock: Clock) -> None:
            self.clock = clock
            self.first_send_perf_s: float | None = None

        async def send(self, spec: RequestSpec, rec: RequestRecord) -> None:
            if self.first_send_perf_s is None:
                self.first_send_perf_s = time.perf_counter()
            t = self.clock.now_s()
            rec.sent_s = rec.first_token_s = rec.done_s = t
            rec.output_tokens = 1

    t0 = time.perf_counter()
    source = TraceReplay.open(path) if mode == "whole" else StreamingReplay.open(path)
    specs = source.specs(RunShape(num_requests=n))
    clock = Clock()
    target = InstantTarget(clock)
    rss = [_current_rss_mib()]

    async def sample(_clock: object) -> None:
        while True:
            rss.append(_current_rss_mib())
            await asyncio.sleep(0.01)

    res = await run(specs, target, clock=clock, opts=RunOptions(progress=False), handle_sigint=False,
                    monitors=[sample])
    assert len(res.records) == n and target.first_send_perf_s is not None
    late = np.array([r.sent_s - r.scheduled_s for r in res.records if r.sent_s is not None])
    return target.first_send_perf_s - t0, late, max(rss)


def child(mode: str, path: str, seconds: float, pull: int | None) -> dict[str, float]:
    from slobench.workload.trace_stream import StreamingReplay

    base = _rss_mib()
    n = int(RATE_RPS * seconds)
    t0 = time.perf_counter()
    out: dict[str, float] = {}
    if mode in ("whole", "stream"):
        out["first_s"], late, out["sending_mib"] = asyncio.run(_run(mode, path, n))
    else:  # the first --pull requests of the trace (all by default), nothing sent; RSS at each tenth
        it = StreamingReplay(path).specs()
        out["first_s"] = time.perf_counter() - t0
        step = max(1, pull // 10)
        count = 0
        for _ in islice(it, pull):
            count += 1
            if count % step == 0:
                out[f"rss_at_{count}"] = _current_rss_mib()
        out["rows"] = count
        out["all_s"] = time.perf_counter() - t0
        out["sending_mib"] = max(v for k, v in out.items() if k.startswith("rss_at_"))
        late = np.empty(0)
    out["peak_mib"] = _rss_mib()
    out["base_mib"] = base
    if len(late):
        out["late_p50_ms"], out["late_p99_ms"] = (float(x) * 1e3 for x in np.quantile(late, (0.5, 0.99)))
        out["sent"] = float(len(late))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of the trace sent (at 200 req/s)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--modes", default="whole,stream,all", help="which of whole, stream, all to run")
    ap.add_argument("--pull", type=int, default=None, help="'all': pull this many requests (default: every one)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        if a.child == "write":
            write_trace(Path(a.path), a.rows)
        else:
            print(json.dumps(child(a.child, a.path, a.seconds, a.pull)))
        return
    path = Path(a.dir) / f"slobench-synthetic-mooncake-{a.rows}.jsonl"
    if not path.exists():  # in a child: a child forked from a large parent reports the parent's RSS as its own
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--child", "write", "--path", str(path), "--rows", str(a.rows)],
                       check=True)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs")
    print(f"trace: {a.rows:,} rows at {RATE_RPS:g} req/s; sending the first {a.seconds:g} s "
          f"({int(RATE_RPS * a.seconds):,} requests)\n")
    print("| way of reading | first request s | RSS sending MiB | peak RSS MiB | lateness p50 ms | lateness p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    labels = {"whole": "whole (TraceReplay: sweep, capacity)", "stream": "stream (StreamingReplay: run --trace)",
              "all": "stream, all rows pulled"}
    base = 0.0
    figures: dict[str, float | int] = {"rows": a.rows}
    for mode in a.modes.split(","):
        label = labels[mode]
        cmd = [sys.executable, __file__, "--child", mode, "--path", str(path), "--seconds", str(a.seconds)]
        cmd += ["--pull", str(a.pull)] if a.pull else []
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        p50 = f"{res['late_p50_ms']:.2f}" if "late_p50_ms" in res else "–"
        p99 = f"{res['late_p99_ms']:.2f}" if "late_p99_ms" in res else "–"
        extra = f" ({int(res['rows']):,} requests in {res['all_s']:.0f} s)" if "rows" in res else ""
        sending = f"{res['sending_mib']:.0f}" if "sending_mib" in res else "–"
        print(f"| {label}{extra} | {res['first_s']:.2f} | {sending} | {res['peak_mib']:.0f} | {p50} | {p99} |")
        base = res["base_mib"]
        if mode in ("whole", "stream") and "sending_mib" in res:
            figures |= {f"{mode}_first_request_s": round(res["first_s"], 2), f"{mode}_rss_mib": round(res["sending_mib"])}
        at = {int(k[7:]): v for k, v in res.items() if k.startswith("rss_at_")}
        if at:
            print("|   RSS after " + ", ".join(f"{k:,}: {v:.0f}" for k, v in sorted(at.items())) + " MiB | | | | | |")
    print(f"| (the interpreter with slobench and numpy imported) | | | {base:.0f} | | |")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    write_result("trace_replay", figures)


if __name__ == "__main__":
    main()
