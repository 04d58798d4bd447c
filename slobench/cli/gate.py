"""CLI verb `gate`: the CI verdict, a candidate against a baseline."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from slobench.errors import UsageError
from slobench.gate import BASELINE_KIND, Threshold, junit_xml, load_samples, markdown
from slobench.gate import gate as judge
from slobench.printable import printable
from slobench.run.outdir import check_out_file
from slobench.run.rundir import read_json, write_json_atomic

GATE_HELP = """\
Compares a candidate with a baseline (capacity.json, sweep.json, a committed baseline file, or a tune
directory: its best configuration's capacity search; several files per side are merged as replicates). A metric fails only when its change is beyond the threshold AND
significant across replicates (one-sided t-test, paired by seed when both sides share seeds).
Thresholds: --max-drop capacity=5%  --max-drop attainment@4=2pt  --max-rise ttft.p99=10%  --max-rise
tpot.p99@4=5ms. A metric without @RATE is checked at every rate both sides measured. Default: capacity
-5%, attainment -2pt, ttft.p99 and tpot.p99 +10% where measured. Exit 0 pass, 1 regression, 4
inconclusive (the message says how many replicates would decide), 2 bad input (different workloads or
SLOs, missing or corrupt file).
"""


def add_arguments(verb: str, g: argparse.ArgumentParser) -> None:
    g.description = GATE_HELP
    g.add_argument("--baseline", action="append", default=[], metavar="FILE", help="repeatable")
    g.add_argument("--candidate", action="append", default=[], metavar="FILE", help="repeatable")
    g.add_argument("--max-drop", action="append", default=[], metavar="METRIC=AMOUNT")
    g.add_argument("--max-rise", action="append", default=[], metavar="METRIC=AMOUNT")
    g.add_argument("--alpha", type=float, default=0.01, help="significance for a regression (default 0.01)")
    g.add_argument("--pass-confidence", type=float, default=0.9,
                   help="confidence that the change is within the threshold needed to pass (default 0.9)")
    g.add_argument("--junit", default=None, metavar="XML")
    g.add_argument("--markdown", default=None, metavar="MD", help="also appended to $GITHUB_STEP_SUMMARY")
    g.add_argument("--json", default=None, metavar="FILE", help="the verdict and every number, as JSON")
    g.add_argument("--write-baseline", default=None, metavar="FILE",
                   help="write the --candidate's replicate values as a committable baseline file and exit")
    g.add_argument("--update-baseline-on-pass", action="store_true",
                   help="when the verdict is pass, rewrite the (one) --baseline file from the candidate, so a "
                        "baseline follows main; never on an inconclusive or failing run (the exit code is the gate's)")


def gate(args: argparse.Namespace) -> int:
    if not args.candidate:
        raise UsageError("--candidate is required")
    for flag, path in (("--junit", args.junit), ("--markdown", args.markdown), ("--json", args.json),
                       ("--write-baseline", args.write_baseline)):
        if path:
            check_out_file(Path(path), flag)  # before the files are read: exit 2 naming the flag
    cand = load_samples(args.candidate)
    if args.write_baseline:
        out = Path(args.write_baseline)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, cand.to_baseline())
        print(f"baseline written: {out} ({len(cand.metrics)} metrics from {printable(cand.source)})")
        return 0
    if not args.baseline:
        raise UsageError("--baseline is required (or --write-baseline to make one)")
    if args.update_baseline_on_pass:
        check_updatable(args.baseline)
    base = load_samples(args.baseline)
    ths = [Threshold.parse(t, "drop") for t in args.max_drop] + [Threshold.parse(t, "rise") for t in args.max_rise]
    res = judge(base, cand, ths, alpha=args.alpha, pass_confidence=args.pass_confidence)
    md = markdown(res)
    print(printable(md), end="")  # metric names and sources come from files
    if args.markdown:
        Path(args.markdown).write_text(md)
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a") as fh:
            fh.write(md + "\n")
    if args.junit:
        Path(args.junit).write_text(junit_xml(res))
    if args.json:
        write_json_atomic(Path(args.json), res.to_dict())
    if args.update_baseline_on_pass:
        updated, msg = update_baseline_on_pass(res, cand, Path(args.baseline[0]))
        print(msg, file=sys.stdout if updated else sys.stderr)
    return res.exit_code


def check_updatable(baselines: list[str]) -> None:
    """--update-baseline-on-pass rewrites one committed baseline file; anything else is bad usage."""
    if len(baselines) != 1:
        raise UsageError("--update-baseline-on-pass: give exactly one --baseline (the file to refresh)")
    path = Path(baselines[0])
    try:
        kind = read_json(path).get("kind") if path.is_file() else None
    except (UsageError, AttributeError):
        kind = None  # load_samples names what is wrong with it
    if path.is_file() and kind is not None and kind != BASELINE_KIND:
        raise UsageError(f"--update-baseline-on-pass: {path} is a {kind} result, not a baseline file "
                         f"(slobench gate --write-baseline makes one); refusing to overwrite it")


def update_baseline_on_pass(res: Any, cand: Any, path: Path) -> tuple[bool, str]:
    """Refresh the baseline from the candidate when the verdict is pass; (updated, what to tell the user)."""
    if res.verdict != "pass":
        return False, (f"baseline not updated: the verdict is {res.verdict}; {path} follows main only on a pass "
                       f"(an inconclusive or failing run would move the bar)")
    write_json_atomic(path, cand.to_baseline())
    return True, f"baseline updated: {path} ({len(cand.metrics)} metrics from {cand.source})"
