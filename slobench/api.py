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
from slobench.load_options import LoadOptions
from slobench.load_setup import LoadSetup, run_once
from slobench.report import build_report
from slobench.run.event_loop import run_async
from slobench.run.manifest import build_manifest
from slobench.run.outdir import claim_out_dir
from slobench.run.records import RequestRecord
from slobench.run.rundir import Run
from slobench.run.rundir import load_run as _load_run
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
    api: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    seed: int = 0,
    progress: bool = False,
    **options: Any,
) -> Run:
    """One open-loop run against an OpenAI-compatible endpoint: `slobench run` from Python. It takes the
    CLI's own setup (`slobench.load_setup.LoadSetup`, the same option groups and checks, preflight, the
    server's limits, the /metrics scraper, the notes) and writes the same run directory when `out` is
    given: an `out` that holds a run already is refused unless `overwrite=True`, as the CLI refuses it.
    `options` are any other `slobench run` flag by its name (`header=("K:V",)`, `extra_body={...}`,
    `timeout=30.0`, `transport="httpx"`, `api_key_env="MY_KEY"`, `max_in_flight=8`, `warmup="auto"`,
    `scrape_interval=0`, ...). `api` defaults to the workload's, `model` to the first the server lists.
    The manifest's `command` is the `slobench run ...` line that makes the same run. Returns the run read
    back (or, without `out`, its records and summary)."""
    if "api_key" in options:
        raise TypeError("run_load: give api_key_env, the name of the environment variable that holds the key "
                        "(as --api-key-env); the key itself is never passed around")
    values: dict[str, Any] = {
        "url": url, "rate": rate, "workload": workload if isinstance(workload, WorkloadSpec) else str(workload),
        "num_requests": num_requests, "duration": duration_s, "slo": slo, "model": model, "api": api,
        "out": None if out is None else str(out), "overwrite": overwrite, "seed": seed, "no_progress": not progress,
        **options,
    }
    values = {k: v for k, v in values.items() if v is not None}
    setup = LoadSetup(LoadOptions.make("run", **values), command=LoadOptions.as_argv("run", **values))

    async def go() -> Run:
        run_dir = None if out is None else claim_out_dir(Path(out), overwrite=overwrite)  # exit 2 before a request
        res, _, _ = await run_once(setup, run_dir)
        if run_dir is not None:
            return load_run(run_dir)
        return Run(Path("."), {}, list(res.records), res.summary)

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
        slo=slo_.to_dict() if slo_ else None,
        # the options `slobench run` records, so a gate compares a simulated run with a measured one
        options={"num_requests": num_requests, "duration_s": duration_s, "input_len": None, "output_len": None,
                 "warmup": 0, "max_in_flight": None, "concurrency": None},
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
