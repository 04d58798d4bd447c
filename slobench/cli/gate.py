"""CLI verbs `capacity` (search, or replicates at fixed rates) and `gate` (the CI verdict)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from slobench.analysis.slo import parse_fraction
from slobench.cli.common import add_load_flags, default_out, maybe_report, options_from_args
from slobench.errors import UsageError
from slobench.experiments.capacity import (
    CapacityResult,
    FixedRates,
    SearchOptions,
    capacity_document,
    replicate_at_rates,
    search_capacity,
)
from slobench.experiments.probe import ProbeMeasure
from slobench.experiments.sweep import parse_rates
from slobench.gate import BASELINE_KIND, Threshold, junit_xml, load_samples, markdown
from slobench.gate import gate as judge
from slobench.load_setup import MIN_PROBE_S, LoadSetup
from slobench.run.outdir import claim_out_dir
from slobench.run.records import CAPACITY, write_capacity, write_json_atomic

CAPACITY_HELP = """\
Finds the largest offered rate whose SLO attainment (share of all requests meeting every SLO) is at or
above the SLO's target (default 90%). Probes upward geometrically from --start-rate until attainment
breaks, bisects until the bracket is narrower than --tolerance, then runs --replicates seeds at both
bracket edges: the capacity's interval comes from those replicates. With --rates it skips the search and
runs --replicates seeds at each fixed rate (for gating at the same offered load). Writes OUT/capacity.json
and one run directory per probe (probe-XX-rate-R-seed-S). A probe lasts max(60 s, the workload's request
count at that rate) unless --num-requests or --duration fix it: past capacity the queue grows with run
length, so probes that shrink as the rate rises would overstate capacity.
"""

GATE_HELP = """\
Compares a candidate with a baseline (capacity.json, sweep.json, or a committed baseline file; several
files per side are merged as replicates). A metric fails only when its change is beyond the threshold AND
significant across replicates (one-sided t-test, paired by seed when both sides share seeds).
Thresholds: --max-drop capacity=5%  --max-drop attainment@4=2pt  --max-rise ttft.p99=10%  --max-rise
tpot.p99@4=5ms. A metric without @RATE is checked at every rate both sides measured. Default: capacity
-5%, attainment -2pt, ttft.p99 and tpot.p99 +10% where measured. Exit 0 pass, 1 regression, 4
inconclusive (the message says how many replicates would decide), 2 bad input (different workloads or
SLOs, missing or corrupt file).
"""


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "capacity":
        _add_capacity_arguments(p)
    else:
        _add_gate_arguments(p)


def _add_capacity_arguments(cap: argparse.ArgumentParser) -> None:
    cap.description = CAPACITY_HELP
    add_load_flags(cap, sweep=True)
    s = cap.add_argument_group("search")
    s.add_argument("--start-rate", type=float, default=1.0, help="first probe, req/s (default 1)")
    s.add_argument("--factor", type=float, default=2.0, help="geometric step while bracketing (default 2)")
    s.add_argument("--tolerance", default="5%", help="stop when (hi-lo)/lo is below this (default 5%%)")
    s.add_argument("--max-probes", type=int, default=12, help="search probes, replicates not counted")
    s.add_argument("--max-rate", type=float, default=None, help="never offer more than this, req/s")
    s.add_argument("--replicates", type=int, default=5, help="seeds run at each bracket edge (default 5)")
    s.add_argument("--level", type=float, default=0.95, help="confidence level of the interval")
    s.add_argument("--gpus", type=int, default=None, help="also report goodput per GPU (capacity / N)")
    s.add_argument("--slo-scale", action="store_true",
                   help="also the tightest SLO scale still meeting the target, per replicate at the lower edge")
    s.add_argument("--baseline-out", default=None, metavar="FILE", help="also write a committable baseline file")


def _add_gate_arguments(g: argparse.ArgumentParser) -> None:
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


def capacity(args: argparse.Namespace) -> int:
    return asyncio.run(_capacity(args))


# --- gate -----------------------------------------------------------------------------------------------


def gate(args: argparse.Namespace) -> int:
    if not args.candidate:
        raise UsageError("--candidate is required")
    cand = load_samples(args.candidate)
    if args.write_baseline:
        out = Path(args.write_baseline)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, cand.to_baseline())
        print(f"baseline written: {out} ({len(cand.metrics)} metrics from {cand.source})")
        return 0
    if not args.baseline:
        raise UsageError("--baseline is required (or --write-baseline to make one)")
    if args.update_baseline_on_pass:
        check_updatable(args.baseline)
    base = load_samples(args.baseline)
    ths = [Threshold.parse(t, "drop") for t in args.max_drop] + [Threshold.parse(t, "rise") for t in args.max_rise]
    res = judge(base, cand, ths, alpha=args.alpha, pass_confidence=args.pass_confidence)
    md = markdown(res)
    print(md, end="")
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
        kind = json.loads(path.read_text()).get("kind") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
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


# --- capacity -------------------------------------------------------------------------------------------


def _tolerance(text: str) -> float:
    return parse_fraction(text, "tolerance", "0.05 or 5%")


async def _capacity(args: argparse.Namespace) -> int:
    if args.concurrency:
        raise UsageError("--concurrency: capacity searches offered (open-loop) rates; drop --concurrency")
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus: must be >= 1 (got {args.gpus})")
    setup = LoadSetup(options_from_args(args))
    if setup.slo is None:
        raise UsageError("--slo is required for capacity (e.g. --slo ttft=500ms,tpot=50ms)")
    fixed = parse_rates(args.rates) if args.rates else None
    opts = SearchOptions(
        target=setup.slo.target, start_rps=args.start_rate, factor=args.factor, rel_tol=_tolerance(args.tolerance),
        max_probes=args.max_probes, max_rate_rps=args.max_rate, replicates=args.replicates, level=args.level,
        seed=args.seed,
    )
    if fixed and opts.replicates < 2:
        raise UsageError("--rates needs --replicates >= 2: fixed-rate replicates are what the gate compares")
    out = claim_out_dir(Path(args.out) if args.out else default_out("capacity"),
                        overwrite=getattr(args, "overwrite", False))  # before any request: exit 2, one line
    console = Console(stderr=True)

    setup.min_duration_s = MIN_PROBE_S

    def on_probe(rate: float, seed: int, summary: Any) -> None:  # a RunSummary
        att = summary.attainment_value
        console.print(f"rate {rate:8.3f} req/s  seed {seed:3d}  attainment "
                      f"{'-' if att is None else f'{att:6.1%}'}  ({summary.run_dir})")
        ray = summary.client.ray or {}  # sent from Ray load actors (--ray)
        for note in (ray.get("warning"), f"{ray['num_died']} Ray load actor(s) died" if ray.get("num_died") else None):
            if note:
                console.print(f"  {note}", markup=False)

    # the one path every verb takes (setup.specs), so a trace replay is searched like a workload spec
    async with setup.probe(intervals=False, scrape=False) as (probe, manifest, _served):
        measure = ProbeMeasure(probe, out_dir=out, manifest=manifest, on_probe=on_probe)
        if fixed:
            seeds = [opts.seed + 1 + i for i in range(opts.replicates)]
            probes = await replicate_at_rates(measure, fixed, seeds, target=opts.target)
            result: CapacityResult | FixedRates = FixedRates(fixed, opts.target, tuple(probes))
        else:
            result = await search_capacity(measure, opts)

    if not args.gpus and args.simulate and args.replicas > 1:
        args.gpus = args.replicas  # a simulated fleet: one GPU a replica
    doc = capacity_document(result, slo=setup.slo, manifest=manifest, gpus=args.gpus,
                            slo_scale_dir=out if args.slo_scale else None)
    write_capacity(out, doc)
    if args.baseline_out:
        bpath = Path(args.baseline_out)
        bpath.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(bpath, load_samples([out / CAPACITY]).to_baseline())
        console.print(f"baseline written: {bpath}", markup=False)
    _print_capacity(doc, out)
    maybe_report(args.report, [out])
    if doc["mode"] == "search" and doc["capacity_rps"] is None:
        return 1
    return 0


def _print_capacity(doc: dict[str, Any], out: Path) -> None:
    if doc["mode"] == "fixed-rates":
        by_rate: dict[float, list[float]] = {}
        for p in doc["probes"]:
            by_rate.setdefault(p["rate_rps"], []).append(p["attainment"])
        for rate, vals in sorted(by_rate.items()):
            print(f"rate {rate:g} req/s: attainment {min(vals):.1%} .. {max(vals):.1%} over {len(vals)} seeds")
    elif doc["capacity_rps"] is None:
        print(f"capacity: attainment is below {doc['attainment_target']:.0%} at every rate tried")
    else:
        iv = doc.get("interval_rps")
        rng = f" [{iv[0]:.3g}, {iv[1]:.3g}] ({doc['level']:.0%}, {len(doc['replicates'])} replicates)" if iv else ""
        lb = " (a lower bound)" if doc["is_lower_bound"] else ""
        print(f"capacity: {doc['capacity_rps']:.3g} req/s at >= {doc['attainment_target']:.0%} attainment{rng}{lb}")
        if "goodput_per_gpu_rps" in doc:
            print(f"goodput per GPU: {doc['goodput_per_gpu_rps']:.3g} req/s over {doc['gpus']} GPU(s)")
    for row in doc.get("slo_scale") or []:
        print(f"tightest SLO scale at {row['rate_rps']:g} req/s: {row['scale']:.3g}")
    for note in doc.get("notes") or []:
        print(f"note: {note}", file=sys.stderr)
    print(f"result: {out / 'capacity.json'}")
