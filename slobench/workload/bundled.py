"""The files slobench reads at run time from inside its own package, under `slobench/data/`: the bundled
workload specs (`--workload chat`).

They live in the package so that an installed wheel finds them wherever it runs; the repository's top-level
`workloads/` is a link to `slobench/data/workloads/`, one copy of each file. `package_files` lists every such
file; the packaging test checks that a built wheel holds each one (and the engine's cost profiles, which
`reference_engine.executor.modeled_executor.PROFILES_DIR` reads from its own package).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "WORKLOADS_DIR", "bundled_workload", "list_workloads", "package_files"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
WORKLOADS_DIR = DATA_DIR / "workloads"


def list_workloads() -> list[str]:
    """Names of the bundled workloads."""
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.toml"))


def bundled_workload(name: str) -> Path | None:
    """The spec file of the bundled workload `name`, or None when there is none by that name."""
    path = WORKLOADS_DIR / f"{name}.toml"
    return path if path.is_file() else None


def package_files() -> list[Path]:
    """Every file of slobench's own that a verb may read at run time (absolute paths, in this installation)."""
    return sorted(WORKLOADS_DIR.glob("*.toml"))
