"""What `sweep` and `demo` run: one run per rate, the rates given or chosen from the server (`--rates
auto`, slobench.experiments.auto_rates), a progress line while it goes, the table and headline at the end."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from slobench.cli.common import check_refine_knee, error_rate_verdict, maybe_report, print_sweep
from slobench.cli.sweep_progress import SweepProgress, planned_s, point_label
from slobench.errors import UsageError
from slobench.experiments.auto_rates import SERVICE_RATE_RPS, SERVICE_REQUESTS, RunSize, plan_rates
from slobench.experiments.sweep import parse_rates, run_sweep
from slobench.load_setup import MIN_PROBE_S, LoadSetup, probe_duration
from slobench.report.terminal import make_console, run_title
from slobench.run.outdir import claim_out_dir

AUTO = "auto"


def parse_sweep_rates(text: str) -> list[float] | None:
    """`--rates`: a list or geometric range (`parse_rates`), or `auto` (None: chosen from the server)."""
    return None if text.strip().lower() == AUTO else parse_rates(text)


def check_auto(setup: LoadSetup) -> None:
    """`--rates auto` sizes and places every point itself, from an SLO: exit 2 for what it cannot honour."""
    o = setup.options
    if setup.slo is None:
        raise UsageError("--rates auto looks for the SLO's crossing: give --slo too")
    for flag, value in (("--num-requests", o.num_requests), ("--duration", o.duration), ("--trace", o.trace),
                        ("--concurrency", o.concurrency)):
        if value is not None:
            raise UsageError(f"--rates auto sizes each point from the server's service time (open loop, a "
                             f"workload): drop {flag}, or give the rates")


def set_size(setup: LoadSetup, size: RunSize) -> None:
    """The next runs' size: the probe makes its requests from `setup.options` when it runs."""
    setup.options = replace(setup.options, num_requests=size.num_requests, duration=size.duration_s)


class Interrupted(Exception):
    """Ctrl-C during the bracket: nothing of the sweep itself was measured."""


async def sweep_rates(setup: LoadSetup, rates: Sequence[float] | None, out: Path, *, seed: int) -> int:
    """One run per rate through `setup`'s probe (rates None: `--rates auto`), a line per point and the table
    at the end; the exit code (130 interrupted, 1 over --max-error-rate). `out` is claimed here, before any
    request (exit 2)."""
    refine = check_refine_knee(setup.options.refine_knee, has_slo=setup.slo is not None)
    if rates is None:
        check_auto(setup)
        set_size(setup, RunSize(num_requests=SERVICE_REQUESTS))
    else:
        setup.min_duration_s = MIN_PROBE_S  # high-rate points as long as low-rate ones (probe_duration)
    out = claim_out_dir(out, overwrite=setup.options.overwrite)  # exit 2, one line
    console = make_console()
    show = SweepProgress(not setup.options.no_progress)
    if show.enabled:  # one live display at a time: the sweep's line stands for each run's own
        setup.options = replace(setup.options, no_progress=True)

    def on_run(row: dict[str, Any]) -> None:
        show.done()
        s = row["summary"]
        console.print(f"rate {row['rate_rps']:g} req/s done: {s.num_ok}/{s.num_requests} ok")

    first = (rates[0] if rates else SERVICE_RATE_RPS, seed)
    try:
        async with show, setup.probe(first=first) as (probe, manifest, served):
            extra: dict[str, Any] | None = None
            if rates is None:
                plan = await _plan(setup, probe, manifest, out, seed, show, console)
                rates, extra = plan.rates_rps, {"auto_rates": plan.to_dict()}
                probe = _sized(setup, probe, plan.size)
            for r in rates:
                show.add(_planned(setup, r))

            def on_start(rate: float, index: int, most: int) -> None:
                show.start(point_label(rate, index, most), _planned(setup, rate))

            doc = await run_sweep(list(rates), probe, out_dir=out, slo=setup.slo, manifest=manifest, seed=seed,
                                  on_run=on_run, refine_knee=refine, on_start=on_start, doc_extra=extra)
    except Interrupted:
        print("slobench: interrupted while bracketing the crossing, before any rate of the sweep; exit 130",
              file=sys.stderr)
        return 130
    print_sweep(doc, console, title=run_title(served, f"workload {setup.workload.name}", f"{setup.api} API", str(out)))
    maybe_report(setup.options.report, [out])
    if doc.get("interrupted"):
        print("slobench: interrupted: the last point is partial and left out of the headline; exit 130",
              file=sys.stderr)
        return 130
    n = sum(r["summary"].num_requests for r in doc["runs"])
    ok = sum(r["summary"].num_ok for r in doc["runs"])
    if (verdict := error_rate_verdict(n, ok, setup.max_error_rate)) is not None:
        print(verdict, file=sys.stderr)
        return 1
    return 0


def _planned(setup: LoadSetup, rate: float) -> float:
    o = setup.options
    duration = probe_duration(setup.workload, o.num_requests, o.duration, rate, setup.min_duration_s)
    count = o.num_requests if o.num_requests is not None else getattr(setup.workload, "num_requests", None)
    return planned_s(rate, count, duration)


def _sized(setup: LoadSetup, probe: Any, size_of: Any) -> Any:
    """`probe`, each run sized by `size_of(rate)` first."""

    async def sized(rate: float, seed: int, run_dir: Path | None, manifest: dict[str, Any]) -> Any:
        set_size(setup, size_of(rate))
        return await probe(rate, seed, run_dir, manifest)

    return sized


async def _plan(setup: LoadSetup, probe: Any, manifest: dict[str, Any], out: Path, seed: int,
                show: SweepProgress, console: Any) -> Any:
    """`--rates auto`: the service probe and the bracket (slobench.experiments.auto_rates.plan_rates)."""
    count = 0

    def on_probe(rate: float, size: RunSize) -> None:
        nonlocal count
        count += 1
        planned = planned_s(rate, size.num_requests, size.duration_s)
        show.add(planned)
        show.start(f"{'service probe' if count == 1 else 'bracket'} {rate:g} req/s (probe {count})", planned)

    async def measure(rate: float, size: RunSize, name: str) -> Any:
        set_size(setup, size)
        res = await probe(rate, seed, out / name, {**manifest, "rate_rps": rate})
        show.done()
        if res.interrupted:
            raise Interrupted
        s = res.summary
        att = "-" if s.attainment_value is None else f"{s.attainment_value:.0%}"
        stage = "service probe" if name.startswith("bracket/probe-00") else "bracket"
        console.print(f"{stage} {rate:g} req/s: attainment {att}"
                      + (" (past capacity)" if s.overloaded else ""), highlight=False)
        return s

    plan = await plan_rates(measure, setup.slo.target, on_probe=on_probe)  # type: ignore[union-attr]
    lo, hi = plan.bracket_rps
    console.print(f"service time {plan.service_s * 1e3:.0f} ms; the quick probes cross between "
                  f"{'-' if lo is None else f'{lo:g}'} and {'-' if hi is None else f'{hi:g}'} req/s; sweeping "
                  f"{', '.join(f'{r:g}' for r in plan.rates_rps)} req/s, {plan.point_duration_s:.1f} s of "
                  "arrivals each", highlight=False)
    return plan
