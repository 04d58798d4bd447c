"""The simulator and trace replay at scale, end to end through the CLI: wall time, CPU time and peak RSS of
each command run as a child process (`os.wait4`'s rusage: that child's own), this tree against another
checkout (--old, e.g. the main branch) in the same run, so the ratio is honest on a loaded machine (where
CPU time says more than wall time).

Cases: `run --simulate` of `chat` at 30 req/s with 100,000 requests (--million adds 1,000,000, this tree
only); `run --simulate --trace` of a 1,000,000-row Mooncake file with --num-requests 200; `sweep --simulate`
of two rates over that file (200 requests each). The trace is written once to a temporary folder
(lognormal lengths, `hash_ids` whose first block is one of 1,000 Zipf-popular system prompts).
Figures: docs/measurements/scale_sim.md.

    python benchmarks/scale_sim.py [--old /work/main] [--rows 1000000] [--million] [--only 100k,trace,sweep]"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from result_json import write_result  # this folder is on sys.path
from trace_replay import write_trace  # the same 200 req/s Mooncake trace

HERE = Path(__file__).resolve().parent.parent
SIM = ["--simulate", "--profile", "h100-llama-1b", "--no-progress"]


def run_child(tree: Path, argv: list[str], cwd: Path) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MiB, exit code) of `python -m slobench argv` importing `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "110"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "slobench", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):  # 1: the SLO was not met, still a measured run
        print(f"  exit {proc.returncode}: {err.strip()[-300:]}", file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, default=None, help="another checkout to run the same commands from")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the Mooncake trace")
    ap.add_argument("--million", action="store_true", help="also 1,000,000 simulated requests (this tree only)")
    ap.add_argument("--only", default="100k,trace,sweep", help="cases to run (100k, trace, sweep)")
    args = ap.parse_args()
    cases = set(args.only.split(","))
    trees = [("this", HERE)] + ([("old", args.old.resolve())] if args.old else [])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "mooncake.jsonl"
        if cases & {"trace", "sweep"}:
            t0 = time.perf_counter()
            write_trace(trace, args.rows)
            print(f"wrote {args.rows:,} Mooncake rows ({trace.stat().st_size / 2**20:.0f} MiB) in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        commands: list[tuple[str, list[str], bool]] = []  # (case, argv, old too)
        if "100k" in cases:
            commands.append(("run --simulate, chat, 100,000 requests",
                             ["run", *SIM, "--workload", "chat", "--rate", "30", "--num-requests", "100000"], True))
        if args.million:
            commands.append(("run --simulate, chat, 1,000,000 requests",
                             ["run", *SIM, "--workload", "chat", "--rate", "30", "--num-requests", "1000000"], False))
        if "trace" in cases:
            commands.append((f"run --simulate --trace ({args.rows:,} rows) --num-requests 200",
                             ["run", *SIM, "--trace", str(trace), "--num-requests", "200"], True))
        if "sweep" in cases:
            commands.append((f"sweep --simulate --trace ({args.rows:,} rows) --rates 5,10 --num-requests 200",
                             ["sweep", *SIM, "--trace", str(trace), "--rates", "5,10", "--num-requests", "200"], True))
        print("| command | tree | wall s | CPU s | peak RSS MiB | exit |")
        print("|---|---|---|---|---|---|")
        figures: dict[str, float] = {}  # this tree's, for the headline: the 100k and the 1M runs
        for k, (case, argv, with_old) in enumerate(commands):
            for name, tree in trees if with_old else trees[:1]:
                out = work / f"out-{k}-{name}"
                wall, cpu, rss, code = run_child(tree, [*argv, "--out", str(out)], work)
                print(f"| {case} | {name} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {code} |", flush=True)
                size = "100k" if "100,000 requests" in case else "1m" if "1,000,000 requests" in case else None
                if name == "this" and code == 0 and size == "100k":  # one run: the range collapses to it
                    figures |= {"wall_s_100k_min": round(wall, 1), "wall_s_100k_max": round(wall, 1),
                                "rss_mib_100k_min": round(rss), "rss_mib_100k_max": round(rss)}
                elif name == "this" and code == 0 and size == "1m":
                    figures |= {"wall_s_1m": round(wall), "rss_mib_1m": round(rss)}
        write_result("scale_sim", figures)


if __name__ == "__main__":
    main()
