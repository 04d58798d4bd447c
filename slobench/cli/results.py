"""The verbs that read what runs wrote: `summarize` (a run's summary again, from its records) and `report`
(the HTML report of runs and sweeps). Apart from the load verbs: they import no target, engine or
simulator, a half second at the start of every call."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from slobench.analysis.slo import SLO, load_slo
from slobench.analysis.summary import read_columns
from slobench.analysis.summary import summarize as summarize_records
from slobench.errors import UsageError
from slobench.report import build_report
from slobench.report.terminal import print_run
from slobench.report.tune_page import build_tune_page, check_tune_inputs
from slobench.run.columnar import PARQUET, write_parquet
from slobench.run.records import REQUESTS, read_records
from slobench.run.rundir import read_manifest, read_summary


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "summarize":
        p.add_argument("run_dir")
        p.add_argument("--slo", default=None, help="re-judge against another SLO")
        p.add_argument("--rewrite", action="store_true",
                       help="(re)write requests.parquet from requests.jsonl (runs from an older slobench, or cut short)")
    else:
        p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                       help="run, sweep or capacity directories; or one tune directory (its own page)")
        p.add_argument("-o", "--output", default="report.html")
        p.add_argument("--title", default=None)


def summarize(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    manifest = read_manifest(run_dir)
    if args.rewrite:
        if not (run_dir / REQUESTS).is_file():
            raise UsageError(f"{run_dir / REQUESTS}: missing, so there is nothing to rewrite requests.parquet from")
        (run_dir / PARQUET).unlink(missing_ok=True)  # read the JSON lines, not the file being replaced
        if not write_parquet(run_dir, read_records(run_dir / REQUESTS)):
            return 2
        print(f"wrote {run_dir / PARQUET}")
    if args.slo:
        slo = load_slo(args.slo)
    elif manifest.get("slo"):
        slo = SLO.from_dict(manifest["slo"])
    else:
        slo = None
    summary = summarize_records(read_columns(run_dir), slo, seed=manifest.get("seed", 0))
    saved = read_summary(run_dir)
    if saved is not None:  # what the run alone knew: kept from its summary.json
        summary = replace(summary, interrupted=bool(saved.interrupted), trace_rows=saved.trace_rows,
                          stopped_by=saved.stopped_by)
    print_run(summary, title=str(args.run_dir))
    return 0


def report(args: argparse.Namespace) -> int:
    tune_dir = check_tune_inputs(args.run_dirs)  # a tune directory: its own page (tune_page's docstring)
    path = (build_tune_page(tune_dir, args.output, title=args.title) if tune_dir is not None else
            build_report(args.run_dirs, args.output, title=args.title))
    print(f"report: {path}")
    return 0
