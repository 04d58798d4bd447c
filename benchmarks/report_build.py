"""How long `slobench report` takes for a large sweep and `slobench summarize` for one large run, their peak
memory, and how big the HTML gets.

Synthesises a sweep (slobench.report.synthetic: a queue with a real cliff, one content chunk per token,
server metrics every second) of --records records over --rates rates, and one run of --records records;
then runs `slobench report` on the sweep and `slobench summarize` on the run, each in a child process
timed from start to exit, with its CPU seconds (user + system: the steadier figure on a shared machine) and
its peak RSS (os.wait4's ru_maxrss, what /usr/bin/time -v reports). Inputs are synthesised in a child
process (a parent that held them would lend its own peak to every child it spawns).
Targets at 1,000,000 records: report < 10 s and < 2 GB, summarize < 5 s. --jsonl repeats both with
requests.parquet moved aside (the fallback reader). --against TREE times another checkout's slobench on
the same inputs, alternating with this one, --repeat times each (a shared machine's speed drifts: compare
side by side). The children import slobench from the checkout this script is in (or TREE), not from the
working directory. The report's parts are then timed in this process. Figures: docs/measurements/report_build.md.

    python benchmarks/report_build.py [--records 1000000] [--rates 5] [--median-output-tokens 32] [--jsonl]
                                      [--keep DIR] [--against TREE] [--repeat N]"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from result_json import write_result  # this folder is on sys.path

from slobench.cli import no_huge_page_stalls


def timed_child(argv: list[str], tree: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS in GB of `python -m slobench argv`, slobench imported from the
    checkout `tree` (-P: not from the working directory, which `-m` would put first). posix_spawn (vfork),
    not fork: a forked child's peak would count this process's memory until it execs."""
    cmd = [sys.executable, "-P", "-m", "slobench", *argv]
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        pid = os.posix_spawn(cmd[0], cmd, env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, null.fileno(), 1)], setsid=False)
        _, status, usage = os.wait4(pid, 0)
    wall_s = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"slobench {' '.join(argv)}: exit {os.waitstatus_to_exitcode(status)}")
    return wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux


@contextmanager
def parquet_aside(root: Path, name: str) -> Iterator[None]:
    moved = [p.rename(p.with_name(name + ".aside")) for p in root.rglob(name)]
    try:
        yield
    finally:
        for p in moved:
            p.rename(p.with_name(name))


def synthesise(path: Path, rates: list[float], per_rate: int, median_output_tokens: int) -> None:
    if (path / "sweep.json").exists():
        print(f"reusing {path} (delete it to synthesise again)")
        return
    child = multiprocessing.get_context("spawn").Process(target=_synthesise, args=(path, rates, per_rate,
                                                                                    median_output_tokens))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"synthesising {path}: exit {child.exitcode}")


def _synthesise(path: Path, rates: list[float], per_rate: int, median_output_tokens: int) -> None:
    from slobench.report.synthetic import write_synthetic_sweep

    write_synthetic_sweep(path, rates, per_rate, median_output_tokens=median_output_tokens)


def main() -> None:
    no_huge_page_stalls()  # as `slobench` does, before numpy and pyarrow are imported (below)
    from slobench.report import build_report
    from slobench.report.html import render
    from slobench.report.load import load_series
    from slobench.report.stats import analyze
    from slobench.report.style import series_color
    from slobench.run.columnar import PARQUET

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rates", type=int, default=5)
    ap.add_argument("--median-output-tokens", type=int, default=32)
    ap.add_argument("--jsonl", action="store_true", help="also time both with requests.parquet moved aside")
    ap.add_argument("--keep", default=None, help="write the inputs and report here (and reuse inputs found there)")
    ap.add_argument("--against", default=None, help="another checkout's root: its slobench timed alternately")
    ap.add_argument("--repeat", type=int, default=1, help="times each tree is timed")
    args = ap.parse_args()
    trees = [("this", Path(__file__).resolve().parents[1])]  # the checkout this script is in
    if args.against:
        trees.append((str(args.against), Path(args.against).resolve()))

    root = Path(args.keep or tempfile.mkdtemp(prefix="slobench-report-bench-"))
    rates = [2.0 * (i + 1) for i in range(args.rates)]  # capacity 10 req/s: the cliff sits inside the sweep
    per_rate = args.records // args.rates
    t0 = time.perf_counter()
    synthesise(root / "sweep", rates, per_rate, args.median_output_tokens)
    synthesise(root / "one", [8.0], args.records, args.median_output_tokens)
    setup_s = time.perf_counter() - t0
    run = root / "one" / "rate-8"

    def size_mb(pattern: str) -> float:
        return sum(p.stat().st_size for p in (root / "sweep").rglob(pattern)) / 1e6

    print(f"inputs under {root} (synthesised in {setup_s:.1f} s); the sweep's requests.jsonl "
          f"{size_mb('*.jsonl'):.0f} MB, requests.parquet {size_mb(PARQUET):.0f} MB")
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    print("| tree | run | records | rates | reader | `report` s | CPU s | peak GB | `summarize` 1 run s | CPU s | peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for reader in ("parquet", "jsonl") if args.jsonl else ("parquet",):
        with parquet_aside(root, PARQUET) if reader == "jsonl" else nullcontext():
            for i in range(args.repeat):
                for name, tree in trees:
                    html = root / ("report.html" if name == "this" else "report-against.html")
                    report_s, report_cpu, report_gb = timed_child(["report", str(root / "sweep"), "-o", str(html)], tree)
                    summ_s, summ_cpu, summ_gb = timed_child(["summarize", str(run)], tree)
                    if name == "this":
                        rows.append((report_s, report_gb, summ_s))
                    print(f"| {name} | {i + 1} | {per_rate * args.rates:,} | {args.rates} | {reader} | {report_s:.1f} | "
                          f"{report_cpu:.1f} | {report_gb:.2f} | {summ_s:.1f} | {summ_cpu:.1f} | {summ_gb:.2f} |",
                          flush=True)
    html_mb = (root / "report.html").stat().st_size / 1e6
    print(f"\nHTML {html_mb:.1f} MB", flush=True)
    if args.against:
        same = (root / "report.html").read_bytes() == (root / "report-against.html").read_bytes()
        print(f"the two trees' reports are {'the same bytes' if same else 'DIFFERENT'}", flush=True)

    # the report's parts, in this process (second pass: the files are in the page cache)
    t0 = time.perf_counter()
    series = load_series(root / "sweep")
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    view = analyze(series, series_color(0))
    analyze_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    render([view])
    render_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_report([root / "sweep"], root / "report-again.html")
    build_s = time.perf_counter() - t0

    print(f"in process: build_report {build_s:.2f} s = load {load_s:.2f} + analyze {analyze_s:.2f} + "
          f"render {render_s:.2f} (+ writing)")
    report_s, report_gb, summ_s = (min(column) for column in zip(*rows[:args.repeat], strict=True))
    ok = report_s < 10 and report_gb < 2 and summ_s < 5 and html_mb < 15
    print(f"\nbudget at 1,000,000 records: report < 10 s and < 2 GB, summarize < 5 s, HTML < 15 MB -> "
          f"{'ok' if ok else 'OVER BUDGET'} (load average {os.getloadavg()[0]:.2f} at the end)")
    parquet_rows = rows[:args.repeat]  # this tree's, read from requests.parquet
    write_result("report_build", {
        "records": per_rate * args.rates, "html_mb": round(html_mb, 1),
        "report_s_min": round(min(r[0] for r in parquet_rows), 1), "report_s_max": round(max(r[0] for r in parquet_rows), 1),
        "report_peak_gb": round(max(r[1] for r in parquet_rows), 2),
        "summarize_s_min": round(min(r[2] for r in parquet_rows), 1),
        "summarize_s_max": round(max(r[2] for r in parquet_rows), 1),
    })


if __name__ == "__main__":
    main()
