"""Claiming an output directory (`--out`) before anything is sent: a new run never lands in an old one.

A directory that already holds a run, sweep or capacity search is refused (exit 2) unless `--overwrite`
is given, and then only slobench's own files are removed from it, never anything else a user keeps there.
A path that is a file, sits under a file or cannot be created is refused too, before any request.
"""

from __future__ import annotations

from pathlib import Path

from slobench.errors import UsageError
from slobench.run.columnar import PARQUET
from slobench.run.records import REQUESTS
from slobench.run.rundir import BASELINE, CAPACITY, MANIFEST, SERVER_METRICS, SUMMARY, SWEEP

# Every file a run, sweep or capacity directory holds (the .tmp files: a run cut short while writing them).
ARTEFACTS = (MANIFEST, REQUESTS, f"{REQUESTS}.tmp", PARQUET, f"{PARQUET}.tmp", SUMMARY, SERVER_METRICS, SWEEP,
             CAPACITY, BASELINE)


def _holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in ARTEFACTS)


def _sub_runs(path: Path) -> list[Path]:
    """A sweep's per-rate or a capacity search's per-probe run directories."""
    return [d for d in sorted(path.iterdir()) if d.is_dir() and _holds_run(d)]


def claim_out_dir(path: Path, *, overwrite: bool = False) -> Path:
    """`path`, created and free of any earlier run; UsageError (exit 2, one line) otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path}: is a file, not a directory")
    try:
        if path.is_dir() and (_holds_run(path) or _sub_runs(path)):
            if not overwrite:
                raise UsageError(f"--out {path}: already holds a slobench run; choose a new directory or pass "
                                 "--overwrite to replace it")
            for d in [*_sub_runs(path), path]:
                for name in ARTEFACTS:
                    (d / name).unlink(missing_ok=True)
                if d != path and not any(d.iterdir()):
                    d.rmdir()
        # Check it can be written, leaving nothing behind: a run that then fails to start (an unreachable
        # server) must not leave an empty run directory, so folders made for the check are removed again
        # (the run makes them when it starts).
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".slobench-write-test"
        probe.touch()
        probe.unlink()
        for d in created:  # deepest first
            d.rmdir()
    except OSError as e:  # under a file, no permission, read-only file system
        raise UsageError(f"--out {path}: cannot write there ({e.strerror or e})") from None
    return path
