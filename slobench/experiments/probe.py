"""One probe: measure one offered rate with one seed into one run directory. The seam between what
chooses rates (`run`: one; `sweep`: a list; `capacity`: a search and its replicates) and what measures
one (`LiveProbe`: the runner against a target; `VirtualProbe`: the engine's scheduler on a virtual
clock). Both write the same run directory (records, manifest, summary), so every reader downstream
(terminal, report, gate) sees one shape whichever measured it, and no verb branches on `--simulate`.

    probe(rate_rps, seed, run_dir, manifest) -> ProbeResult(summary: RunSummary, interrupted)
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slobench.analysis.slo import SLO
from slobench.fleet.disagg import split_fleet_knobs
from slobench.fleet.replica import EngineFactory
from slobench.fleet.simulate import SimOptions, as_factory, simulate_run
from slobench.run import interrupts
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.rundir import RunWriter
from slobench.run.runner import run
from slobench.targets.options import Api
from slobench.workload import generate, load_workload

if TYPE_CHECKING:
    from slobench.analysis.summary import RunSummary

SpecMaker = Callable[[Any, int], Iterable[RequestSpec]]  # (rate_rps or None, seed) -> the requests of one run


@dataclass(frozen=True, slots=True)
class ProbeResult:
    summary: RunSummary
    interrupted: bool = False  # Ctrl-C cut the run short: what finished is kept and marked
    records: Sequence[RequestRecord] = ()  # what was measured; a simulated run streams them to its run directory instead


class Probe(Protocol):
    async def __call__(self, rate_rps: float | None, seed: int, run_dir: Path | None,
                       manifest: dict[str, Any]) -> ProbeResult: ...


class LiveProbe:
    """One open-loop run through `slobench.run.runner.run` against an already started target.

    `monitors_for(run_dir)`: coroutines beside the run (the /metrics scraper); `after_run(run_dir,
    summary)`: what to add once the run is written (Ray load actors' clocks and health); `settle`: after
    a run that stopped early (`opts.early_stop`), the wait for the server to go idle before the next probe
    (`slobench.run.server_idle`)."""

    def __init__(self, make_specs: SpecMaker, target: Any, *, slo: Any, opts: Any, clock: Any = None,
                 monitors_for: Callable[[Path], Sequence[Any]] | None = None,
                 after_run: Callable[[Path, RunSummary], Awaitable[RunSummary]] | None = None,
                 settle: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.make_specs = make_specs
        self.target = target
        self.slo = slo
        self.opts = opts
        self.clock = clock
        self.monitors_for = monitors_for
        self.after_run = after_run
        self.settle = settle
        self.last_monitors: Sequence[Any] = ()  # the last run's, for their notes (a server without /metrics)

    async def __call__(self, rate_rps: float | None, seed: int, run_dir: Path | None,
                       manifest: dict[str, Any]) -> ProbeResult:
        self.last_monitors = self.monitors_for(run_dir) if self.monitors_for and run_dir is not None else ()
        specs = self.make_specs(rate_rps, seed)
        with interrupts.hold() as held:  # what is added after the run (after_run) is under the run's signal policy
            res = await run(
                specs, self.target, clock=self.clock, opts=self.opts, slo=self.slo,
                run_dir=run_dir, manifest=manifest, seed=seed, monitors=self.last_monitors, settle=self.settle,
            )
            summary = res.summary
            if self.after_run is not None and run_dir is not None:
                summary = await self.after_run(run_dir, summary)
            summary = interrupts.marked(held, summary, run_dir)
        return ProbeResult(summary, res.interrupted or held.received, res.records)


class VirtualProbe:
    """The same run on the bundled engine's real scheduler and a virtual clock (`slobench.fleet.simulate`).

    `engine`: `build_engine` knobs (a disaggregated fleet's included) or an engine factory such as
    `ModeledEngine`; `opts` (`SimOptions`, or its fields as keywords): how each run is simulated, its seed
    aside: `jitter_seed(rate_rps, seed)` seeds each probe's step-time noise (default: drawn from the rate,
    the seed and the engine's name, so each probe of a search sees its own noise)."""

    def __init__(self, make_specs: SpecMaker, engine: Mapping[str, Any] | EngineFactory, *, slo: Any,
                 opts: SimOptions | None = None, intervals: bool = True,
                 jitter_seed: Callable[[Any, int], int] | None = None, **knobs: Any) -> None:
        opts = SimOptions.of(opts, knobs)
        if isinstance(engine, Mapping):
            engine, disagg = split_fleet_knobs(dict(engine), opts.router)
            if disagg is not None and opts.disagg is None:
                opts = replace(opts, disagg=disagg)
        self.factory = as_factory(engine)
        self.name = str(getattr(self.factory, "name", "") or type(self.factory).__name__)
        self.make_specs = make_specs
        self.slo = slo
        self.opts = opts
        self.intervals = intervals
        self.jitter_seed = jitter_seed

    async def __call__(self, rate_rps: float | None, seed: int, run_dir: Path | None,
                       manifest: dict[str, Any]) -> ProbeResult:
        specs = self.make_specs(rate_rps, seed)
        noise_seed = self.jitter_seed(rate_rps, seed) if self.jitter_seed else probe_jitter_seed(rate_rps, seed, self.name)
        opts = replace(self.opts, seed=noise_seed)
        if run_dir is None:
            records, summary = simulate_run(_as_run(specs), self.factory, opts, slo=self.slo, intervals=self.intervals)
        else:  # each record written as it finishes, none kept (`simulate_run`'s on_record)
            writer = RunWriter(run_dir, {**manifest, "clock": {"kind": "virtual"}})
            try:
                records, summary = simulate_run(_as_run(specs), self.factory, opts, slo=self.slo,
                                                intervals=self.intervals, on_record=writer.write)
            except BaseException:
                with interrupts.hold():  # Ctrl-C in the simulation: what it wrote is closed whole, then it ends
                    writer.close()
                raise
        if (row_report := getattr(specs, "row_report", None)) is not None:
            summary = replace(summary, trace_rows=row_report())  # a trace: what its rows became, as a live run says it
        if run_dir is None:
            return ProbeResult(summary, records=records)
        with interrupts.hold() as held:  # the files written whole, summary.json marked where a signal came meanwhile
            if writer.error is not None:  # the disk refused a record: the summary of them all is not kept
                writer.close()
                raise writer.error
            writer.finish(summary)
            summary = interrupts.marked(held, summary, run_dir)
        return ProbeResult(summary, held.received, records=records)


MAX_LISTED = 20_000  # a stream of about this many requests or fewer is simulated from a list (~200 MB of prompts)


def _as_run(specs: Iterable[RequestSpec]) -> Iterable[RequestSpec]:
    """What the simulator takes: a list as it is; a flat workload's `FlatSpecs` as a stream (its prompts'
    first blocks tell the simulator which blocks no other prompt shares); another stream (a streamed
    trace) as a list when it holds at most MAX_LISTED requests, where knowing every prompt first makes the
    simulation ~1.8x faster (`simulate_records`' private blocks), else as a stream, in flat memory."""
    if isinstance(specs, list) or hasattr(specs, "prompt_heads"):
        return specs
    if isinstance(specs, Iterator):
        hint = getattr(specs, "count_hint", lambda: None)()
        return list(specs) if hint is not None and hint <= MAX_LISTED else specs
    return list(specs)


def probe_jitter_seed(rate_rps: float | None, seed: int, engine_name: str, trial: int = 0) -> int:
    """A probe's step-time noise seed: (trial, rate, seed, engine), so a second trial of the same requests
    sees fresh noise."""
    rate = None if rate_rps is None else round(rate_rps, 6)  # None: the workload's (or trace's) own rate
    return zlib.crc32(repr((trial, rate, seed, engine_name)).encode())


def probe_dir_name(index: int, rate_rps: float, seed: int) -> str:
    return f"probe-{index:02d}-rate-{rate_rps:.4g}-seed-{seed}"


class ProbeMeasure:
    """`slobench.experiments.capacity`'s `measure(rate_rps, seed) -> summary` over a probe: each probe in its own
    numbered run directory under `out_dir` (none without it), Ctrl-C raised as KeyboardInterrupt."""

    def __init__(self, probe: Probe, *, out_dir: str | Path | None = None, manifest: dict[str, Any] | None = None,
                 on_probe: Callable[[float, int, RunSummary], None] | None = None) -> None:
        self.probe = probe
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.manifest = manifest or {}
        self.on_probe = on_probe
        self.count = 0

    def manifest_for(self, rate_rps: float, seed: int) -> dict[str, Any]:
        return {**self.manifest, "rate_rps": rate_rps, "seed": seed}

    async def __call__(self, rate_rps: float, seed: int) -> RunSummary:  # capacity probes always name a rate
        name = probe_dir_name(self.count, rate_rps, seed)
        self.count += 1
        run_dir = self.out_dir / name if self.out_dir is not None else None
        res = await self.probe(rate_rps, seed, run_dir, self.manifest_for(rate_rps, seed))
        if res.interrupted:
            raise KeyboardInterrupt
        summary = replace(res.summary, rate_rps=rate_rps, run_dir=name if run_dir is not None else None)
        if self.on_probe is not None:
            self.on_probe(rate_rps, seed, summary)
        return summary


class SimulatedMeasure(ProbeMeasure):
    """`slobench.experiments.capacity`'s `measure(rate_rps, seed) -> summary`, on the virtual clock: a `ProbeMeasure`
    over a `VirtualProbe`.

    `workload`: a WorkloadSpec, a bundled workload name or TOML path, or a `(rate_rps, seed) -> specs`
    callable (e.g. the CLI's trace replay). The jitter stream of each probe is drawn from
    (trial, rate, seed, engine name), so two measures differing only in `trial` see fresh timing noise on
    the same requests. With `out_dir`, each probe is also written as a run directory (records, manifest,
    summary) named as a live probe's is, so gates and reports read simulated probes like real ones.
    `opts` (`SimOptions`, or its fields as keywords): how each probe is simulated; its API is the
    workload's unless `api` says otherwise.
    """

    def __init__(
        self,
        workload: Any,
        engine: Mapping[str, Any] | EngineFactory,
        slo: SLO,
        opts: SimOptions | None = None,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
        input_len: int | None = None,
        output_len: int | None = None,
        api: Api | None = None,
        trial: int = 0,
        intervals: bool = False,
        out_dir: str | Path | None = None,
        manifest: dict[str, Any] | None = None,
        on_probe: Callable[[float, int, RunSummary], None] | None = None,
        **knobs: Any,
    ) -> None:
        opts = SimOptions.of(opts, knobs)
        make_specs: Callable[[float, int], Sequence[RequestSpec]]
        if callable(workload):
            make_specs = workload
            api_: Api = api or "completions"
        else:
            wl = load_workload(workload) if isinstance(workload, str | Path) else workload
            api_ = api or ("chat" if wl.api == "chat" else "completions")

            def make_specs(rate_rps: float, seed: int) -> list[RequestSpec]:
                return generate(wl, rate_rps=rate_rps, num_requests=num_requests, duration_s=duration_s, seed=seed,
                                input_len=input_len, output_len=output_len, api=api_)

        self.trial = trial
        self.jitter_sd = opts.jitter_sd
        probe = VirtualProbe(make_specs, engine, slo=slo, opts=replace(opts, api=api_), intervals=intervals,
                             jitter_seed=self.jitter_seed)
        self.factory = probe.factory
        self.name = probe.name
        super().__init__(probe, out_dir=out_dir, manifest=manifest, on_probe=on_probe)

    def jitter_seed(self, rate_rps: float, seed: int) -> int:
        return probe_jitter_seed(rate_rps, seed, self.name, self.trial)

    def manifest_for(self, rate_rps: float, seed: int) -> dict[str, Any]:
        return {**super().manifest_for(rate_rps, seed), "engine": repr(self.factory), "jitter_sd": self.jitter_sd,
                "trial": self.trial}
