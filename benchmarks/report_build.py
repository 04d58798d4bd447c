"""How long the HTML report takes to build for a large sweep, and how big the file gets.

Synthesises a sweep (slobench.report.synthetic: a queue with a real cliff, one content chunk per token,
server metrics every second), then times build_report and its parts. Targets: < 10 s and < 15 MB for
100,000 records. Reading requests.jsonl grows with the chunk timestamps each record carries, so the
table shows the input size beside the time. Figures: docs/measurements/report_build.md.

    python benchmarks/report_build.py [--records 100000] [--rates 5] [--median-output-tokens 32]"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from slobench.report import build_report
from slobench.report.html import render
from slobench.report.load import load_series
from slobench.report.stats import analyze
from slobench.report.style import series_color
from slobench.report.synthetic import write_synthetic_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rates", type=int, default=5)
    ap.add_argument("--median-output-tokens", type=int, default=32)
    ap.add_argument("--keep", default=None, help="write the sweep and report here (and reuse a sweep found there)")
    args = ap.parse_args()

    root = Path(args.keep or tempfile.mkdtemp(prefix="slobench-report-bench-"))
    rates = [2.0 * (i + 1) for i in range(args.rates)]  # capacity 10 req/s: the cliff sits inside the sweep
    per_rate = args.records // args.rates
    t0 = time.perf_counter()
    sweep = root / "sweep"
    if args.keep and (sweep / "sweep.json").exists():
        print(f"reusing {sweep} (delete it to synthesise again)")
    else:
        write_synthetic_sweep(sweep, rates, per_rate, median_output_tokens=args.median_output_tokens)
    setup_s = time.perf_counter() - t0
    input_mb = sum(p.stat().st_size for p in sweep.rglob("*.jsonl")) / 1e6

    t0 = time.perf_counter()
    out = build_report([sweep], root / "report.html")
    total_s = time.perf_counter() - t0

    # the same work again, in parts (second pass: files are in the page cache either way)
    t0 = time.perf_counter()
    series = load_series(sweep)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    view = analyze(series, series_color(0))
    analyze_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    render([view])
    render_s = time.perf_counter() - t0

    size_mb = out.stat().st_size / 1e6
    print(f"synthesised in {setup_s:.1f} s under {root}")
    print()
    print("| records | rates | median out tok | input jsonl MB | build_report s | load s | analyze s | render s | HTML MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {per_rate * args.rates:,} | {args.rates} | {args.median_output_tokens} | {input_mb:.0f} | {total_s:.2f} | "
          f"{load_s:.2f} | {analyze_s:.2f} | {render_s:.2f} | {size_mb:.1f} |")
    verdict = "ok" if total_s < 10 and size_mb < 15 else "OVER BUDGET"
    print(f"\nbudget: < 10 s and < 15 MB for 100,000 records -> {verdict}")


if __name__ == "__main__":
    main()
