"""Claiming an output directory (`--out`) before anything is sent: a new run never lands in an old one.

A directory that already holds a run, sweep or capacity search is refused (exit 2) unless `--overwrite`
is given, and then only slobench's own files are removed from it, never anything else a user keeps there.
`--overwrite` replaces one run directory (a run, or a sweep or search with its own per-rate or per-probe
folders), never a folder that holds other runs (`runs/`): that is refused, overwrite or not. A path that is
a file, sits under a file or cannot be created is refused too, before any request. A default name
(`new_out_dir`) is created exclusively, so two runs started in the same second never share a directory.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slobench.errors import UsageError
from slobench.run.columnar import PARQUET
from slobench.run.records import REQUESTS
from slobench.run.rundir import BASELINE, CAPACITY, MANIFEST, SERVER_METRICS, SUMMARY, SWEEP

# Every file a run, sweep or capacity directory holds (the .tmp files: a run cut short while writing them).
ARTEFACTS = (MANIFEST, REQUESTS, f"{REQUESTS}.tmp", PARQUET, f"{PARQUET}.tmp", SUMMARY, SERVER_METRICS, SWEEP,
             CAPACITY, BASELINE)
# The folders a sweep (`rate_dir_name`) or a capacity search (`probe_dir_name`) makes for its runs.
OWN_SUB_RUN = re.compile(r"(rate-[^/]+|probe-\d+-rate-[^/]+-seed-\d+)")
MAX_SAME_SECOND = 1000  # default names tried in one second before giving up


def _holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in ARTEFACTS)


def _sub_runs(path: Path) -> list[Path]:
    """Folders in `path` that hold a run: a sweep's per-rate or a search's per-probe run directories, or,
    in a folder of runs, the runs themselves."""
    return [d for d in sorted(path.iterdir()) if d.is_dir() and (_holds_run(d) or _holds_sub_run(d))]


def _holds_sub_run(path: Path) -> bool:  # a sweep or search cut short before its sweep.json/capacity.json
    return any(d.is_dir() and _holds_run(d) for d in path.iterdir())


def claim_out_dir(path: Path, *, overwrite: bool = False) -> Path:
    """`path`, created and free of any earlier run; UsageError (exit 2, one line) otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path}: is a file, not a directory")
    try:
        subs = _sub_runs(path) if path.is_dir() else []
        if path.is_dir() and (_holds_run(path) or subs):
            foreign = [d.name for d in subs if not OWN_SUB_RUN.fullmatch(d.name)]
            if foreign:  # a folder of runs (runs/): --overwrite would destroy every one of them
                shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise UsageError(f"--out {path}: holds {len(foreign)} other run(s) in its folders ({shown}); "
                                 "--overwrite replaces one run directory, never a folder of runs: choose a new "
                                 "directory")
            if not overwrite:
                raise UsageError(f"--out {path}: already holds a slobench run; choose a new directory or pass "
                                 "--overwrite to replace it")
            for d in [*subs, path]:
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


def check_out_file(path: Path, flag: str) -> None:
    """An output file that can be made: not a directory, not under a file (exit 2 before the run, which
    would otherwise find out only at its end)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name in it")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
            break


def new_out_dir(prefix: str, parent: Path = Path("runs"), *, stamp: str | None = None) -> Path:
    """A new directory `parent/prefix-YYYYmmdd-HHMMSS` (then `-2`, `-3`, ... in the same second), created
    here with an exclusive mkdir: of two runs started at once each gets its own, whatever the timing. Pair
    it with `removed_if_unused`, so a run that fails before it starts leaves no empty folder."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for i in range(1, MAX_SAME_SECOND + 1):
            path = parent / (f"{prefix}-{stamp}" if i == 1 else f"{prefix}-{stamp}-{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
    except OSError as e:
        raise UsageError(f"cannot create a run directory in {parent} ({e.strerror or e}); give --out") from None
    raise UsageError(f"{parent}: {MAX_SAME_SECOND} run directories named {prefix}-{stamp} already; give --out")


@contextmanager
def removed_if_unused(path: Path | None) -> Iterator[None]:
    """Remove `path` (a `new_out_dir`) when what runs inside fails and has written nothing to it."""
    try:
        yield
    except BaseException:
        if path is not None:
            try:
                path.rmdir()  # only an empty folder: anything measured is kept
            except OSError:
                pass
        raise
