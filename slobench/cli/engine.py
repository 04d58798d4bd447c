"""CLI verbs around the bundled reference engine: `serve` and `demo`."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import slobench.profiles  # noqa: F401  (registers `--profile roofline:GPU/MODEL` with the engine)
from reference_engine import step_log
from reference_engine.serve_args import add_serve_arguments
from slobench.cli.common import check_refine_knee, default_out, load_options, parse_sweep_rates, sweep_rates
from slobench.errors import UsageError
from slobench.load_setup import LoadSetup
from slobench.report import build_report
from slobench.report.terminal import make_console
from slobench.run.outdir import removed_if_unused
from slobench.run.rundir import load_run
from slobench.testing.process import EngineServerProcess

# The demo: a sweep of the `tiny` workload across the engine's cliff, its rates chosen from the engine in
# front of it (`--rates auto`: a service probe, a doubling bracket, then rates straddling the crossing,
# each as long as a number of service times), so the cliff shows on a fast machine and a slow one alike.
# Its SLO suits a 2-core CPU running the tiny model (a 4-layer, d=256 Llama): TTFT 250 ms, TPOT 30 ms.
DEMO_RATES = "auto"
DEMO_REFINE = 0  # the auto rates straddle the crossing already; N more narrow it, a point each
DEMO_SLO = "ttft=250ms,tpot=30ms,target=0.9"


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "serve":
        add_serve_arguments(p)
    elif verb == "demo":
        p.add_argument("--executor", choices=("auto", "torch", "modeled"), default="auto",
                       help="auto: the torch tiny model when torch is installed, else the modeled executor")
        p.add_argument("--rates", default=DEMO_RATES, help=f"offered rates, req/s (default {DEMO_RATES})")
        p.add_argument("--refine-knee", type=int, default=DEMO_REFINE, metavar="N",
                       help=f"then N rates between the two that bracket the knee (default {DEMO_REFINE})")
        p.add_argument("--num-requests", type=int, default=None,
                       help="requests per rate, with --rates given (default: a minute of arrivals; auto sizes each rate)")
        p.add_argument("--profile", default=None,
                       help="with --executor modeled: the engine's cost profile, a name or JSON path (default cpu-tiny)")
        p.add_argument("--no-progress", action="store_true")
        p.add_argument("--slo", default=DEMO_SLO)
        p.add_argument("--workload", default="tiny")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", default=None, help="sweep directory (default runs/demo-<time>)")
        p.add_argument("--report", default=None, metavar="HTML",
                       help="HTML report path (default: report.html in the sweep directory)")
        p.add_argument("--no-report", action="store_true")


def require_server_stack(verb: str) -> None:
    """`serve` and `demo` run the engine's HTTP server: without the `serve` extra, exit 2 saying so."""
    missing = []
    for name in ("fastapi", "uvicorn"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(f"slobench {verb} runs the bundled engine's HTTP server, which needs "
                         f"{' and '.join(missing)}: pip install 'slobench[serve]' (or '[engine]' for the torch model)")


def serve(args: argparse.Namespace) -> int:
    require_server_stack("serve")
    from reference_engine.server import serve_from_args

    serve_from_args(args)
    return 0


def demo(args: argparse.Namespace) -> int:
    require_server_stack("demo")
    return asyncio.run(_demo(args))


def demo_engine_args(executor: str, profile: str | None = None) -> list[str]:
    if executor == "auto":
        executor = "torch" if importlib.util.find_spec("torch") is not None and profile is None else "modeled"
    if executor == "torch":
        if profile is not None:
            raise UsageError("--profile is the modeled executor's cost profile: give --executor modeled with it")
        return ["--executor", "torch", "--model", "tiny", "--kv-blocks", "512", "--max-num-seqs", "32"]
    return ["--executor", "modeled", "--profile", profile or "cpu-tiny", "--model", "tiny", "--kv-blocks", "512",
            "--max-num-seqs", "32"]


async def _demo(args: argparse.Namespace) -> int:
    console = make_console()
    engine_args = demo_engine_args(args.executor, args.profile)
    rates = parse_sweep_rates(args.rates)  # a bad --rates is exit 2 before the engine starts
    if rates is None and args.num_requests is not None:
        raise UsageError("--num-requests sizes fixed rates; --rates auto sizes each rate from the engine's service "
                         "time: drop one of them")
    check_refine_knee(args.refine_knee, has_slo=True)  # the demo always has its SLO; exit 2 before the engine starts
    out = Path(args.out) if args.out else default_out("demo")
    console.print(f"[bold]slobench demo[/bold]: starting the bundled engine ({' '.join(engine_args)}) on 127.0.0.1")
    t0 = time.monotonic()
    # leave the client a core: on 2 cores, torch's default threads starve the load generator
    threads = max(1, (os.cpu_count() or 2) - 1)
    # the engine logs its steps (reference_engine.step_log) beside the sweep, read back for the speed line
    fd, steps_tmp = tempfile.mkstemp(prefix="slobench-demo-steps-", suffix=".jsonl")
    os.close(fd)
    try:
        with (removed_if_unused(None if args.out else out),
              EngineServerProcess(*engine_args, "--step-log", steps_tmp, torch_threads=threads) as srv):
            what = "choosing rates around its cliff" if rates is None else f"sweeping {args.rates} req/s"
            console.print(f"engine ready at {srv.base_url} in {time.monotonic() - t0:.1f} s; {what}")
            options = load_options(url=srv.base_url, workload=args.workload, rates=args.rates,
                                   num_requests=args.num_requests, slo=args.slo, seed=args.seed, out=str(out),
                                   refine_knee=args.refine_knee,
                                   scrape_interval=0.5, no_progress=args.no_progress or not sys.stderr.isatty())
            code = await sweep_rates(LoadSetup(options), rates, out, seed=args.seed)
        line = _keep_step_log(Path(steps_tmp), out)
    finally:
        Path(steps_tmp).unlink(missing_ok=True)  # moved into the sweep directory, unless the sweep made none
    if line:
        console.print(line, markup=False, soft_wrap=True)  # one line, whatever the width
    if not args.no_report:
        path = build_report([str(out)], args.report or out / "report.html")
        console.print(f"report: {path}", markup=False)
    console.print(f"demo finished in {time.monotonic() - t0:.0f} s; run directories under {out}", markup=False)
    return code


SPEED_SPREAD_WARN = 1.15  # slowest / fastest point beyond which the demo says its knee moves with the machine


def _keep_step_log(steps_tmp: Path, out: Path) -> str | None:
    """Move the engine's step log into the sweep directory (engine-steps.jsonl; with no sweep there, the caller
    removes `steps_tmp`) and say how fast the machine ran each point's steps against the sweep's mean
    (reference_engine.step_log.speeds_across): on a shared machine the knee moves with that speed from one
    demo to the next. None when there is nothing to say."""
    try:
        if not out.is_dir() or not (out / "sweep.json").exists():
            return None
        kept = out / "engine-steps.jsonl"
        shutil.move(str(steps_tmp), kept)
        rows = step_log.read_step_log(kept)
        points, parts = [], []
        for run in json.loads((out / "sweep.json").read_text()).get("runs", []):
            d = out / run["run_dir"]
            anchor = json.loads((d / "manifest.json").read_text())["clock"]["wall_anchor_unix_s"]
            recs = load_run(d).records
            ends = [r.done_s for r in recs if r.done_s is not None] or [r.sent_s for r in recs if r.sent_s is not None]
            if not recs or not ends:
                continue
            points.append(run["rate_rps"])
            parts.append(rows.between(anchor + min(r.scheduled_s for r in recs), anchor + max(ends) + 0.01))
        speeds = [(r, s) for r, s in zip(points, step_log.speeds_across(parts), strict=True) if s is not None]
    except (OSError, ValueError, KeyError) as e:  # the sweep is measured and kept: this line is only a note
        return f"(machine speed: the engine's step log could not be read: {e})"
    if len(speeds) < 2:
        return None
    lo, hi = min(speeds, key=lambda x: x[1]), max(speeds, key=lambda x: x[1])
    text = (f"machine speed (the engine's own steps, {kept.name}): the points ran x{lo[1]:.2f} ({lo[0]:g} req/s) "
            f"to x{hi[1]:.2f} ({hi[0]:g} req/s) of the sweep's mean step time")
    if hi[1] / lo[1] > SPEED_SPREAD_WARN:
        text += ("; the machine's speed moved during the sweep, and the knee moves with it: compare demos only "
                 "from a quiet machine (docs/measurements/machine_speed.md)")
    return text
