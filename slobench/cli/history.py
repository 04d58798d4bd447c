"""CLI verb `history`: `add` a result's headline metrics to a JSONL history, `report` it as an HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from slobench.errors import UsageError
from slobench.gate import Threshold
from slobench.history.page import build_history_page, is_worse
from slobench.history.record import append_entry, entry_from_results, read_history
from slobench.printable import printable

HISTORY_HELP = """\
Keeps a project's headline metrics over commits, so a slow drift over many merges is as visible as one bad
commit. `add` appends one JSON line per commit (capacity and its interval; attainment and TTFT/TPOT p50/p99
at each fixed rate) to the history file; `report` draws each metric over commits with its interval, marks
the gate's verdicts and finds change points: shifts no single commit's gate caught because each step was
small (binary segmentation with a likelihood-ratio test; see slobench/history/changepoint.py).

  slobench history add runs/capacity --commit "$(git rev-parse HEAD)" --date "$(git show -s --format=%cI)" \\
      --verdict pass --history perf-history.jsonl
  slobench history report perf-history.jsonl -o history.html

Exit 0 ok (report: also when change points are found, unless --fail-on-change, then 1), 2 bad input.
"""


def add_arguments(verb: str, h: argparse.ArgumentParser) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    epilog = h.epilog
    h.description = HISTORY_HELP
    hs = h.add_subparsers(dest="history_verb", required=True)
    a = hs.add_parser("add", help="append a result's headline metrics to the history file", epilog=epilog,
                      formatter_class=fmt)
    a.add_argument("results", nargs="+", metavar="RUN",
                   help="a capacity directory or capacity.json, sweeps (one per seed), a baseline file or a run directory")
    a.add_argument("--history", required=True, metavar="FILE", help="the JSONL history (created if absent)")
    a.add_argument("--commit", required=True, metavar="SHA")
    a.add_argument("--date", default=None, metavar="ISO8601", help="the commit's date (default: now, UTC)")
    a.add_argument("--verdict", default=None, help="the gate's verdict for this commit: pass, fail or inconclusive")
    a.add_argument("--rates", default=None, metavar="R1,R2", help="only these offered rates (default: every one)")
    r = hs.add_parser("report", help="the history as a self-contained HTML page", epilog=epilog, formatter_class=fmt)
    r.add_argument("history", metavar="FILE")
    r.add_argument("-o", "--out", default="history.html", metavar="HTML")
    r.add_argument("--title", default=None)
    r.add_argument("--alpha", type=float, default=0.01,
                   help="false-alarm rate of the whole page on a noise-only history (default 0.01)")
    r.add_argument("--min-shift", action="append", default=[], metavar="METRIC=AMOUNT",
                   help="smallest shift reported (default: the gate's thresholds, capacity=5%%, attainment=2pt, "
                        "ttft=10%%, tpot=10%%); repeatable")
    r.add_argument("--fail-on-change", action="store_true", help="exit 1 when a change for the worse is found")


def history(args: argparse.Namespace) -> int:
    if args.history_verb == "add":
        rates = None
        if args.rates:
            try:
                rates = [float(x) for x in args.rates.split(",") if x.strip()]
            except ValueError:
                raise UsageError(f"--rates: expected numbers such as 12,20 (got {args.rates!r})") from None
        entry = entry_from_results(args.results, commit=args.commit, date=args.date, verdict=args.verdict,
                                   rates=rates)
        size = append_entry(args.history, entry)
        print(f"history: {args.history} += {printable(entry['commit'])} ({len(entry['metrics'])} metrics, {size} bytes)")
        return 0
    if not 0 < args.alpha < 0.5:
        raise UsageError(f"--alpha: must be in (0, 0.5) (got {args.alpha})")
    shifts = {}
    for text in args.min_shift:
        th = Threshold.parse(text, "drop")
        shifts[th.metric] = (th.amount, th.is_relative)
    out, metrics = build_history_page(args.history, Path(args.out), alpha=args.alpha, title=args.title,
                                      min_shift=shifts)
    entries = read_history(args.history)
    worse = 0
    for h in metrics:
        for c in h.changes:
            shift = f"{c.shift:+.1%}" if c.is_relative else f"{c.shift * 100:+.1f}pt"
            bad = is_worse(h.key, c)
            worse += bad
            print(f"change point: {printable(h.key)} {shift} ({'worse' if bad else 'better'}) from commit "
                  f"{printable(entries[c.index]['commit'])} "
                  f"(p={c.p_value:.2g})")
    print(f"history report: {out}")
    return 1 if worse and args.fail_on_change else 0
