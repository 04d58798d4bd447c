"""slobench from Python, for notebooks and scripts: each function takes its verb's code path, so a run made
here and one made by `slobench run` write the same run directory. Synchronous; inside a running event loop
(a Jupyter cell with one) use the async `slobench.run.runner.run`.

    run = slobench.run_load("http://127.0.0.1:8000/v1", workload="chat", rate=4, num_requests=200,
                            slo="ttft=500ms,tpot=50ms", out="runs/chat-4")
    sim = slobench.simulate_load(workload="chat", rate=4, num_requests=200, slo="ttft=500ms,tpot=50ms")
    verdict = slobench.compare("runs/baseline", "runs/chat-4")      # the CI gate's verdict
    slobench.render_report(["runs/chat-4"], "report.html")
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.analysis.summary import summarize as _summarize
from slobench.experiments.probe import VirtualProbe
from slobench.fleet.simulate import ModeledEngine
from slobench.gate import GateResult, gate, load_samples
from slobench.report import build_report
from slobench.run.event_loop import run_async
from slobench.run.manifest import build_manifest
from slobench.run.records import RequestRecord
from slobench.run.rundir import Run
from slobench.run.rundir import load_run as _load_run
from slobench.run.runner import RunOptions
from slobench.run.runner import run as run_records
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.workload.spec import WorkloadSpec, generate, load_workload

__all__ = ["SLO", "Run", "RequestRecord", "RunSummary", "WorkloadSpec", "compare", "load_run", "load_workload",
           "render_report", "run_load", "simulate_load", "summarize"]


@contextmanager
def ordinary_pages() -> Iterator[None]:
    """numpy's large arrays on ordinary pages while slobench reads or summarises a run, the setting the
    caller had restored after. The `slobench` command sets NUMPY_MADVISE_HUGEPAGE=0 before numpy is
    imported (`slobench.cli.no_huge_page_stalls`): where transparent huge pages are `madvise`d with
    synchronous defrag, the kernel compacts memory at each first touch of a large array. From Python numpy
    is usually imported already, so its switch is turned instead; a NUMPY_MADVISE_HUGEPAGE the caller set
    is theirs and left alone, as is a numpy without the switch."""
    switch = getattr(getattr(np, "_core", None), "multiarray", None)
    set_madvise = getattr(switch, "_set_madvise_hugepage", None)
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ or set_madvise is None:
        yield
        return
    before = set_madvise(False)
    try:
        yield
    finally:
        set_madvise(before)


def load_run(run_dir: str | Path) -> Run:
    """A run directory read back: its manifest, its records (requests.parquet where it is sound, else
    requests.jsonl) and its summary; large arrays on ordinary pages meanwhile (`ordinary_pages`)."""
    with ordinary_pages():
        return _load_run(run_dir)


def _slo(slo: SLO | str | None) -> SLO | None:
    return SLO.parse(slo) if isinstance(slo, str) else slo


def _workload(workload: WorkloadSpec | str | Path) -> WorkloadSpec:
    return workload if isinstance(workload, WorkloadSpec) else load_workload(workload)


def _specs(workload: WorkloadSpec | str | Path, rate: float, num_requests: int | None, duration_s: float | None,
           seed: int, api: str) -> tuple[WorkloadSpec, list[Any]]:
    spec = _workload(workload)
    return spec, generate(spec, rate_rps=rate, num_requests=num_requests, duration_s=duration_s, seed=seed, api=api)


def run_load(
    url: str,
    *,
    rate: float,
    workload: WorkloadSpec | str | Path = "chat",
    num_requests: int | None = None,
    duration_s: float | None = None,
    slo: SLO | str | None = None,
    model: str | None = None,
    api: str = "completions",
    out: str | Path | None = None,
    seed: int = 0,
    progress: bool = False,
    **target_options: Any,
) -> Run:
    """One open-loop run against an OpenAI-compatible endpoint; the run directory is written when `out` is
    given. `model` defaults to the first the server lists; `target_options` are `TargetOptions` fields
    (headers, extra_body, timeouts, transport, ...) and `api_key`. Preflight negotiates the server's
    capabilities as the CLI does. Returns the run read back (or, without `out`, its records and summary)."""
    spec, specs = _specs(workload, rate, num_requests, duration_s, seed, api)
    slo_ = _slo(slo)
    api_key = target_options.pop("api_key", None)
    options = TargetOptions(model=model, api=api, **target_options)  # type: ignore[arg-type]

    async def go() -> Run:
        async with OpenAITarget(url, options, api_key=api_key) as target:
            served = await target.preflight()  # finds the model when none is given
            manifest = build_manifest(
                spec, seed=seed, made_by="slobench.api.run_load", rate_rps=rate,
                target={"url": url, "model": target.model, "api": api, "served": served},
                slo=slo_.to_dict() if slo_ else None, options={"num_requests": num_requests, "duration_s": duration_s})
            res = await run_records(specs, target, opts=RunOptions(progress=progress), slo=slo_, run_dir=out,
                            manifest=manifest, handle_sigint=False, seed=seed)
        if out is not None:
            return load_run(out)
        return Run(Path("."), manifest, list(res.records), res.summary)

    return run_async(go())


def simulate_load(
    *,
    rate: float,
    workload: WorkloadSpec | str | Path = "chat",
    num_requests: int | None = None,
    duration_s: float | None = None,
    slo: SLO | str | None = None,
    engine: ModeledEngine | None = None,
    replicas: int = 1,
    out: str | Path | None = None,
    seed: int = 0,
) -> Run:
    """The same run on the bundled engine's real scheduler, on a virtual clock (no server, no wall time):
    `engine` is a `slobench.fleet.simulate.ModeledEngine` (its cost profile, KV blocks, batch limits)."""
    spec, specs = _specs(workload, rate, num_requests, duration_s, seed, "completions")
    slo_ = _slo(slo)
    engine_ = engine or ModeledEngine()
    manifest = build_manifest(
        spec, seed=seed, made_by="slobench.api.simulate", rate_rps=rate,
        target={"simulated": True, "engine": engine_.name, "replicas": replicas},
        slo=slo_.to_dict() if slo_ else None, options={"num_requests": num_requests, "duration_s": duration_s},
        clock={"kind": "virtual"})
    # the probe the CLI's `--simulate` takes, with the API's seed as the step-time noise seed
    probe = VirtualProbe(lambda _rate, _seed: specs, engine_, slo=slo_, replicas=replicas,
                         jitter_seed=lambda _rate, _seed: seed)
    res = asyncio.run(probe(rate, seed, Path(out) if out is not None else None, manifest))
    return load_run(out) if out is not None else Run(Path("."), manifest, list(res.records), res.summary)


def summarize(records: Sequence[RequestRecord] | Path, slo: SLO | str | None = None, *, seed: int = 0) -> RunSummary:
    """The `RunSummary` that `summary.json` holds (attainment with its interval, TTFT/TPOT/ITL percentiles,
    errors) of records, or of a run directory given as a `Path` (read column by column, requests.parquet
    where it is there); `.to_dict()` is the file's JSON. Large arrays on ordinary pages meanwhile
    (`ordinary_pages`)."""
    with ordinary_pages():
        return _summarize(records, _slo(slo), seed=seed)


def compare(baseline: str | Path | Sequence[str | Path], candidate: str | Path | Sequence[str | Path], *,
            alpha: float = 0.01) -> GateResult:
    """The regression gate's verdict on two runs (or sweeps, or capacity probes, or a baseline file):
    `.verdict` is pass / regression / inconclusive, `.exit_code` what `slobench gate` exits with, `.checks` each
    metric's test."""
    def paths(p: str | Path | Sequence[str | Path]) -> list[str | Path]:
        return [p] if isinstance(p, str | Path) else list(p)

    return gate(load_samples(paths(baseline)), load_samples(paths(candidate)), alpha=alpha)


def render_report(run_dirs: Sequence[str | Path], out: str | Path = "report.html", *, title: str | None = None) -> Path:
    """The self-contained HTML report of run or sweep directories (opens from disk, no network); large
    arrays on ordinary pages meanwhile (`ordinary_pages`)."""
    with ordinary_pages():
        return Path(build_report(list(run_dirs), out, title=title))
