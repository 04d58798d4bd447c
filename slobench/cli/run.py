"""The verbs that load one target from the common flags: `run` (one rate) and `sweep` (one run per rate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slobench.cli.common import (
    add_load_flags,
    default_out,
    error_rate_verdict,
    maybe_report,
    options_from_args,
    parse_sweep_rates,
    sweep_rates,
)
from slobench.errors import UsageError
from slobench.load_setup import LoadSetup, run_once
from slobench.printable import printable
from slobench.report.terminal import print_run, run_title
from slobench.run.event_loop import run_async
from slobench.run.outdir import claim_out_dir, removed_if_unused
from slobench.targets.ray_pool import client_clock_lines


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    add_load_flags(p, sweep=verb == "sweep")


def run(args: argparse.Namespace) -> int:
    return run_async(_run(args))


def sweep(args: argparse.Namespace) -> int:
    if not args.rates:
        raise UsageError("--rates is required for sweep (e.g. --rates 1,2,4, --rates 1:16:5 or --rates auto)")
    rates = parse_sweep_rates(args.rates)
    setup = LoadSetup(options_from_args(args))
    o = setup.options
    out = Path(o.out) if o.out else default_out("sweep")
    with removed_if_unused(None if o.out else out):
        return run_async(sweep_rates(setup, rates, out, seed=o.seed))


async def _run(args: argparse.Namespace) -> int:
    setup = LoadSetup(options_from_args(args))
    o = setup.options
    out = claim_out_dir(Path(o.out) if o.out else default_out("run"), overwrite=o.overwrite)  # exit 2, one line
    with removed_if_unused(None if o.out else out):
        res, probe, served = await run_once(setup, out)
    summary = res.summary
    print_run(summary, title=run_title(served, f"workload {setup.workload.name}", f"{setup.api} API", str(out)))
    for line in client_clock_lines(summary):
        print(line)
    for m in getattr(probe, "last_monitors", ()):  # no /metrics is a note: the report has no server-state panels
        if getattr(m, "disabled_reason", None) and getattr(m, "num_scrapes", 0):
            print(f"note: server metrics scraping stopped after {m.num_scrapes} scrapes "
                  f"({printable(m.disabled_reason)}); the report's server-state panels end there")
        elif getattr(m, "disabled_reason", None):
            print(f"note: no server metrics scraped ({printable(m.disabled_reason)}); the report has no "
                  "server-state panels")
    print(f"run directory: {out}")
    maybe_report(o.report, [out])
    if res.interrupted:
        print("slobench: interrupted: the summary covers the requests that finished; exit 130", file=sys.stderr)
        return 130
    att = summary.attainment
    if att and setup.slo and att.value < setup.slo.target:
        return 1
    if (verdict := error_rate_verdict(summary.num_requests, summary.num_ok, setup.max_error_rate)) is not None:
        print(verdict, file=sys.stderr)
        return 1
    return 0
