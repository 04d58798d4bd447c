"""Read the report's inputs (sweep directories and run directories) into numpy columns, once.

Each input becomes one `Series`: a sweep is its runs ordered by offered rate; a single run directory is a
series of one point. Everything is recomputed from the records (requests.parquet, else requests.jsonl):
summary.json may be from an older slobench, or judged against another SLO.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from slobench.analysis.metrics import RecordArrays, throughput
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunColumns, RunSummary, read_columns
from slobench.errors import SpecError, UsageError
from slobench.report.server_state import ServerSamples, load_server_metrics
from slobench.run.rundir import (
    CAPACITY,
    MANIFEST,
    SERVER_METRICS,
    SWEEP,
    read_capacity,
    read_manifest,
    read_summary,
    read_sweep,
)


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start_s: float


@dataclass(frozen=True, slots=True)
class RunData:
    label: str  # the run directory's name
    run_dir: Path
    rate_rps: float  # offered rate: the sweep's nominal rate, else the manifest's, else measured
    manifest: dict[str, Any]
    columns: RunColumns  # the one column reader's (slobench.analysis.summary.read_columns)
    phases: tuple[Phase, ...]
    server: ServerSamples | None
    # summary.json as the run wrote it (None: absent or unreadable), for what records cannot tell: the
    # client's GC pauses and Ray actors during the load
    saved: RunSummary | None = None

    @property
    def arrays(self) -> RecordArrays:
        return self.columns.arrays


@dataclass(frozen=True, slots=True)
class Series:
    label: str  # what legends and tables call this input
    path: Path
    kind: str  # "sweep" | "run"
    manifest: dict[str, Any]
    runs: tuple[RunData, ...]  # by offered rate
    slo: SLO | None
    # a capacity search's own result (capacity.json: mode, capacity_rps, interval_rps, level,
    # is_lower_bound, attainment_target, num_replicates, and `inconclusive`, why it located none); None else
    capacity: dict[str, Any] | None = None


def load_series(path: str | Path, *, slo: SLO | None = None) -> Series:
    p = Path(path)
    if (p / SWEEP).is_file():
        return _load_sweep(p, slo)
    if (p / CAPACITY).is_file():
        return _load_capacity(p, slo)
    if (p / MANIFEST).is_file():
        run = _load_run(p, read_manifest(p), read_columns(p), rate_rps=None)
        return Series(p.name or str(p), p, "run", run.manifest, (run,), _slo_for(slo, run.manifest, p / MANIFEST))
    if not p.exists():
        raise UsageError(f"{p}: no such directory")
    raise UsageError(f"{p}: neither a sweep ({SWEEP}), a capacity search ({CAPACITY}) nor a run directory ({MANIFEST})")


def unique_labels(series: list[Series]) -> list[Series]:
    """Disambiguate equal directory names (two `sweep` folders) by prefixing their parents."""
    names = [s.label for s in series]
    out = []
    for s in series:
        if names.count(s.label) > 1:
            s = replace(s, label=f"{s.path.parent.name}/{s.label}")
        out.append(s)
    return out


def _load_sweep(p: Path, slo: SLO | None) -> Series:
    path = p / SWEEP
    doc = read_sweep(p)
    rates = [float(r["rate_rps"]) for r in doc["runs"]]
    dirs = [p / str(r["run_dir"]) for r in doc["runs"]]
    manifests = [read_manifest(d) for d in dirs]  # every directory checked before the slow part
    runs = [_load_run(d, m, c, rate_rps=rate) for d, m, c, rate in zip(dirs, manifests, map(read_columns, dirs), rates, strict=True)]
    runs.sort(key=lambda r: r.rate_rps)
    manifest = doc.get("manifest") or (runs[0].manifest if runs else {})
    return Series(p.name or str(p), p, "sweep", manifest, tuple(runs), _slo_for(slo, manifest, path))


def _load_capacity(p: Path, slo: SLO | None) -> Series:
    """A capacity search drawn as a sweep over the rates it probed: at each rate the probe with the lowest
    seed (the search's own path); the replicates at the bracket edges stay in capacity.json."""
    path = p / CAPACITY
    doc = read_capacity(p)
    probes = [(float(r["rate_rps"]), int(r["seed"]), str(r["run_dir"])) for r in doc["probes"]]
    first: dict[float, tuple[int, str]] = {}
    for rate, seed, run_dir in probes:
        if rate not in first or seed < first[rate][0]:
            first[rate] = (seed, run_dir)
    dirs = [(rate, p / run_dir) for rate, (_, run_dir) in sorted(first.items())]
    manifests = [read_manifest(d) for _, d in dirs]
    runs = tuple(_load_run(d, m, read_columns(d), rate_rps=rate) for (rate, d), m in zip(dirs, manifests, strict=True))
    m = doc.get("manifest")
    manifest: dict[str, Any] = m if isinstance(m, dict) else (runs[0].manifest if runs else {})
    result = {k: doc.get(k) for k in ("mode", "capacity_rps", "interval_rps", "level", "is_lower_bound",
                                      "attainment_target", "inconclusive")}
    result["num_replicates"] = len(doc.get("replicates") or [])
    return Series(p.name or str(p), p, "sweep", manifest, runs, _slo_for(slo, manifest, path), result)


def _slo_for(override: SLO | None, manifest: dict[str, Any], where: Path) -> SLO | None:
    if override is not None:
        return override
    d = manifest.get("slo")
    if not d:
        return None
    try:
        return SLO.from_dict(d)
    except (SpecError, TypeError, AttributeError) as e:
        raise UsageError(f"{where}: bad 'slo' ({e})") from None


def _load_run(run_dir: Path, manifest: dict[str, Any], cols: RunColumns, *, rate_rps: float | None) -> RunData:
    a = cols.arrays
    if rate_rps is None:
        m = manifest.get("rate_rps")
        rate_rps = float(m) if isinstance(m, (int, float)) else throughput(a).offered_rps
    has_server = (run_dir / SERVER_METRICS).is_file()
    return RunData(
        label=run_dir.name,
        run_dir=run_dir,
        rate_rps=float(rate_rps),
        manifest=manifest,
        columns=cols,
        phases=_phases(manifest, a.scheduled_s, a.tag),
        server=load_server_metrics(run_dir) if has_server else None,
        saved=_saved_summary(run_dir),
    )


def _saved_summary(run_dir: Path) -> RunSummary | None:
    try:
        return read_summary(run_dir)
    except UsageError:  # a damaged summary.json: the report recomputes every number from the records
        return None


def _phases(manifest: dict[str, Any], scheduled_s: np.ndarray, tags: np.ndarray) -> tuple[Phase, ...]:
    """Phase boundaries from the manifest (`phases: [{name, start_s}]`), else from record tags when each
    tag occupies one contiguous stretch of the arrival order (tags that interleave are request classes)."""
    listed = manifest.get("phases")
    if isinstance(listed, list):
        out = [
            Phase(str(ph["name"]), float(ph["start_s"]))
            for ph in listed
            if isinstance(ph, dict) and "name" in ph and isinstance(ph.get("start_s"), (int, float))
        ]
        return tuple(sorted(out, key=lambda ph: ph.start_s))
    if len(tags) == 0:
        return ()
    starts = np.concatenate([[0], np.flatnonzero(tags[1:] != tags[:-1]) + 1])
    if len(starts) < 2 or len(set(tags[starts])) != len(starts):
        return ()
    return tuple(Phase(str(tags[i]), float(scheduled_s[i])) for i in starts)
