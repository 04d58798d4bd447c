"""CLI verb `capacity`: the largest offered rate meeting the SLO (a search), or replicates at fixed rates."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from slobench.analysis.slo import parse_fraction
from slobench.cli.common import add_load_flags, default_out, maybe_report, options_from_args
from slobench.errors import UsageError
from slobench.experiments.capacity import (
    SEED_PROBES,
    CapacityResult,
    FixedRates,
    SearchOptions,
    capacity_document,
    replicate_at_rates,
    search_capacity,
)
from slobench.experiments.probe import ProbeMeasure
from slobench.experiments.sweep import parse_rates
from slobench.gate import EXIT_INCONCLUSIVE, load_samples
from slobench.load_setup import MIN_PROBE_S, LoadSetup
from slobench.report.capacity_progress import SearchProgress
from slobench.run.early_stop import StoppedEarly
from slobench.run.event_loop import run_async
from slobench.run.outdir import claim_out_dir, removed_if_unused
from slobench.run.rundir import CAPACITY, write_capacity, write_json_atomic
from slobench.workload import WorkloadSpec

CAPACITY_HELP = """\
Finds the largest offered rate whose SLO attainment (share of all requests meeting every SLO) is at or
above the SLO's target (default 90%). Probes upward geometrically from --start-rate until attainment
breaks and bisects until the bracket is narrower than --tolerance. Then every seed (the search's and
--replicates more) locates its own crossing: run at the bracket's edges, widened until that seed crosses,
narrowed to --tolerance, at most --seed-probes probes each. The capacity is the mean of the seeds'
crossings; its interval a t-interval on their standard error combined with where each crossing lies in its
bracket (the mean bracket width over sqrt(12)), never narrower than their brackets. A seed not bracketed
within its probes is censored and the result "inconclusive": exit 4, the reason and the numbers printed
and in capacity.json, no capacity. With --rates it skips the search and runs --replicates seeds at each
fixed rate (for gating at the same offered load). Writes OUT/capacity.json and one run directory per probe
(probe-XX-rate-R-seed-S). A probe lasts 60 s of traffic unless --num-requests or --duration fix it: past
capacity the queue grows with run length, so probes that shrink as the rate rises would overstate
capacity.
"""


def add_arguments(verb: str, cap: argparse.ArgumentParser) -> None:
    cap.description = CAPACITY_HELP
    add_load_flags(cap, sweep=True)
    s = cap.add_argument_group("search")
    s.add_argument("--start-rate", type=float, default=1.0, help="first probe, req/s (default 1)")
    s.add_argument("--factor", type=float, default=2.0, help="geometric step while bracketing (default 2)")
    s.add_argument("--tolerance", default="5%", help="stop when (hi-lo)/lo is below this (default 5%%)")
    s.add_argument("--max-probes", type=int, default=12, help="search probes, replicates not counted")
    s.add_argument("--max-rate", type=float, default=None, help="never offer more than this, req/s")
    s.add_argument("--replicates", type=int, default=5,
                   help="seeds besides the search's that locate their own crossing (default 5)")
    s.add_argument("--seed-probes", type=int, default=SEED_PROBES,
                   help=f"probes each seed may run to bracket and narrow its crossing (default {SEED_PROBES})")
    s.add_argument("--level", type=float, default=0.95, help="confidence level of the interval")
    s.add_argument("--gpus", type=int, default=None, help="also report goodput per GPU (capacity / N)")
    s.add_argument("--slo-scale", action="store_true",
                   help="also the tightest SLO scale still meeting the target, per replicate at the lower edge")
    s.add_argument("--baseline-out", default=None, metavar="FILE", help="also write a committable baseline file")
    s.add_argument("--check-only", action="store_true",
                   help="check every flag as the search would, then exit 0, or 2 naming the one refused "
                        "(`slobench tune` runs it before it starts a server)")


def fixed_probe_length(setup: LoadSetup, args: argparse.Namespace) -> bool:
    """Whether probes get a fixed minute of traffic: a workload spec without phases, no size given. Sized by
    the workload's request count instead, `chat`'s first probe (1,031 requests at 1 req/s) lasted 17
    minutes; a minute at 1 req/s is 60 requests, far below capacity where attainment is ~100%, and near
    capacity a minute holds as many requests as before wherever the capacity is above count / 60 s."""
    wl = setup.workload
    return (args.num_requests is None and args.duration is None and isinstance(wl, WorkloadSpec)
            and not wl.phases)


def capacity(args: argparse.Namespace) -> int:
    return run_async(_capacity(args))


def _tolerance(text: str) -> float:
    return parse_fraction(text, "tolerance", "0.05 or 5%")


def checked(args: argparse.Namespace) -> tuple[LoadSetup, SearchOptions, list[float] | None]:
    """The search's setup, options and fixed rates from its flags, every one checked (exit 2 on a bad one),
    before anything is sent or written (`--check-only` stops there)."""
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
        seed=setup.options.seed, seed_probes=args.seed_probes,
    )
    if fixed and opts.replicates < 2:
        raise UsageError("--rates needs --replicates >= 2: fixed-rate replicates are what the gate compares")
    return setup, opts, fixed


async def _capacity(args: argparse.Namespace) -> int:
    setup, opts, fixed = checked(args)
    if args.check_only:
        return 0
    if fixed:  # the gate compares whole runs at the same rates: none stops early
        setup.options = setup.options.with_values(no_early_stop=True)
    out = claim_out_dir(Path(args.out) if args.out else default_out("capacity"),
                        overwrite=setup.options.overwrite)  # before any request: exit 2, one line
    console = Console(stderr=True)

    setup.min_duration_s = MIN_PROBE_S
    if fixed_probe_length(setup, args):  # every probe one minute of traffic, the first (at 1 req/s) too
        setup.options = setup.options.with_values(duration=MIN_PROBE_S)

    def on_probe(rate: float, seed: int, summary: Any) -> None:  # a RunSummary
        att = summary.attainment_value
        console.print(f"rate {rate:8.3f} req/s  seed {seed:3d}  attainment "
                      f"{'-' if att is None else f'{att:6.1%}'}  ({summary.run_dir})")
        if summary.stopped_early is not None:
            console.print(f"  {StoppedEarly.from_dict(summary.stopped_early).text()}", markup=False)
        ray = summary.client.ray or {}  # sent from Ray load actors (--ray)
        for note in (ray.get("warning"), f"{ray['num_died']} Ray load actor(s) died" if ray.get("num_died") else None):
            if note:
                console.print(f"  {note}", markup=False)

    with removed_if_unused(None if args.out else out):
        # the one path every verb takes (setup.specs), so a trace replay is searched like a workload spec
        async with setup.probe(intervals=False, scrape=False) as (probe, manifest, _served):
            seeds = [opts.seed + 1 + i for i in range(opts.replicates)]
            measure = SearchProgress(ProbeMeasure(probe, out_dir=out, manifest=manifest, on_probe=on_probe),
                                     search_seed=opts.seed, replicates=opts.replicates, console=console,
                                     show=console.is_terminal and not args.no_progress,
                                     fixed_total=len(seeds) * len(fixed) if fixed else None)
            if fixed:
                probes = await replicate_at_rates(measure, fixed, seeds, target=opts.target)
                result: CapacityResult | FixedRates = FixedRates(fixed, opts.target, tuple(probes))
            else:
                result = await search_capacity(measure, opts)

    if not args.gpus and setup.options.simulate and setup.options.replicas > 1:
        args.gpus = setup.options.replicas  # a simulated fleet: one GPU a replica
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
    if doc.get("inconclusive"):
        return EXIT_INCONCLUSIVE
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
    elif doc.get("inconclusive"):
        print(f"capacity: inconclusive: {doc['inconclusive']}")
    elif doc["capacity_rps"] is None:
        print(f"capacity: attainment is below {doc['attainment_target']:.0%} at every rate tried")
    else:
        iv = doc.get("interval_rps")
        rng = f" [{iv[0]:.3g}, {iv[1]:.3g}] ({doc['level']:.0%}, {len(doc['replicates'])} seeds)" if iv else ""
        lb = " (a lower bound)" if doc["is_lower_bound"] else ""
        print(f"capacity: {doc['capacity_rps']:.3g} req/s at >= {doc['attainment_target']:.0%} attainment{rng}{lb}")
        if "goodput_per_gpu_rps" in doc:
            print(f"goodput per GPU: {doc['goodput_per_gpu_rps']:.3g} req/s over {doc['gpus']} GPU(s)")
    for row in doc.get("slo_scale") or []:
        print(f"tightest SLO scale at {row['rate_rps']:g} req/s: {row['scale']:.3g}")
    for note in doc.get("notes") or []:
        print(f"note: {note}", file=sys.stderr)
    print(f"result: {out / 'capacity.json'}")
