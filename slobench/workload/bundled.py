"""The files slobench reads at run time from inside its own package, under `slobench/data/`: the bundled
workload specs (`--workload chat`), the sample traces (`--trace azure-code-sample`), with the traces'
license and attribution, and the datasheet figures of the GPUs known by name (`gpus.toml`, read by
`slobench.profiles.specs`).

They live in the package so that an installed wheel finds them wherever it runs; the repository's top-level
`workloads/` is a link to `slobench/data/workloads/`, one copy of each file. `package_files` lists every such
file; the packaging test checks that a built wheel holds each one (and the engine's cost profiles, which
`reference_engine.executor.modeled_executor.PROFILES_DIR` reads from its own package).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DATA_DIR",
    "TRACES_DIR",
    "WORKLOADS_DIR",
    "bundled_workload",
    "list_traces",
    "list_workloads",
    "package_files",
    "trace_path",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
WORKLOADS_DIR = DATA_DIR / "workloads"
TRACES_DIR = DATA_DIR / "traces"
# shipped with the sample traces: what they are, where from, and the license they are under (CC-BY-4.0)
TRACE_NOTICES = ("README.md", "LICENSE.CC-BY-4.0.txt")


def list_workloads() -> list[str]:
    """Names of the bundled workloads."""
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.toml"))


def bundled_workload(name: str) -> Path | None:
    """The spec file of the bundled workload `name`, or None when there is none by that name."""
    path = WORKLOADS_DIR / f"{name}.toml"
    return path if path.is_file() else None


def list_traces() -> list[str]:
    """Names of the bundled sample traces (`--trace NAME`)."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.csv"))


def trace_path(source: str | Path) -> Path:
    """The file `--trace SOURCE` reads: SOURCE itself when it is a path or a file here, else the bundled
    sample trace of that name when there is one (a file of the same name in the working folder wins)."""
    path = Path(source)
    if isinstance(source, Path) or path.exists() or "/" in str(source) or "\\" in str(source):
        return path
    bundled = TRACES_DIR / f"{source}.csv"
    return bundled if bundled.is_file() else path


def package_files() -> list[Path]:
    """Every file of slobench's own that a verb may read at run time, or that must travel with one
    (absolute paths, in this installation)."""
    return sorted([*DATA_DIR.glob("*.toml"), *WORKLOADS_DIR.glob("*.toml"), *TRACES_DIR.glob("*.csv"),
                   *(TRACES_DIR / name for name in TRACE_NOTICES)])
