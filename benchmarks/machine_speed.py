"""How steady is this machine? A fixed piece of CPU work, timed again and again.

Two fixed loads, alternated every `--every` seconds for `--seconds`, each pinned to one core in turn: a
pure-Python loop (the interpreter, as the HTTP server, scheduler and client run) and, with torch, 200 fp32
256x256 matmuls on one thread (the kernels, as the CPU engine's steps run). Prints, per load and core, the
fastest, median and slowest time and slowest / fastest: near 1 on a steady machine; above 1, speed no
calibration made before a run can know (benchmarks/speed_drift.py reads the same from the engine's steps).
Figures: docs/measurements/machine_speed.md.

    python benchmarks/machine_speed.py --seconds 60"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable


def python_loop() -> None:
    s = 0
    for i in range(300_000):
        s += i * i


def matmuls() -> Callable[[], None] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    a = torch.randn(256, 256)

    def run() -> None:
        for _ in range(200):
            a @ a

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=0.5, help="pause between samples, s (default 0.5)")
    args = ap.parse_args()
    loads: dict[str, Callable[[], None]] = {"python loop": python_loop}
    mm = matmuls()
    if mm is not None:
        loads["torch matmul"] = mm
    cores = sorted(os.sched_getaffinity(0))
    times: dict[tuple[str, int], list[float]] = {(name, c): [] for name in loads for c in cores}
    by_minute: dict[tuple[str, int], list[float]] = {}  # every core's samples of a load, per minute
    start = time.monotonic()
    end = start + args.seconds
    try:
        while time.monotonic() < end:
            for c in cores:
                os.sched_setaffinity(0, {c})
                for name, fn in loads.items():
                    t0 = time.perf_counter()
                    fn()
                    dt = time.perf_counter() - t0
                    times[(name, c)].append(dt)
                    by_minute.setdefault((name, int((t0 - start) // 60)), []).append(dt)
            time.sleep(args.every)
    finally:
        os.sched_setaffinity(0, set(cores))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.seconds:g} s, load average "
          f"{os.getloadavg()[0]:.2f}")
    print("| load | core | samples | fastest ms | median ms | slowest ms | slowest / fastest |")
    print("|---|---|---|---|---|---|---|")
    for (name, c), ts in times.items():
        if ts:
            print(f"| {name} | {c} | {len(ts)} | {min(ts) * 1e3:.1f} | {statistics.median(ts) * 1e3:.1f} | "
                  f"{max(ts) * 1e3:.1f} | {max(ts) / min(ts):.2f} |")
    minutes = sorted({m for _, m in by_minute})
    if len(minutes) > 1:  # the slower drift: each minute's median, against the fastest minute's
        print("\nmedian ms per minute (both cores), and slowest / fastest minute:")
        for name in loads:
            meds = [statistics.median(by_minute[(name, m)]) for m in minutes if (name, m) in by_minute]
            print(f"  {name}: " + " ".join(f"{x * 1e3:.1f}" for x in meds) + f"  ({max(meds) / min(meds):.2f})")


if __name__ == "__main__":
    main()
