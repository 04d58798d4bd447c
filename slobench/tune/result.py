"""tune.json: one row per configuration, written whole after each, and the ranking by capacity per GPU."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slobench.errors import UsageError
from slobench.run.rundir import write_json_atomic

TUNE = "tune.json"
TUNE_SCHEMA_VERSION = 1
STATUSES = ("measured", "simulated", "simulated only", "inconclusive", "failed", "interrupted")
# what --resume keeps; failed and interrupted run again, and a guided tune simulates every configuration again
FINISHED = ("measured", "simulated", "inconclusive")


@dataclass(frozen=True, slots=True)
class TuneRow:
    name: str
    params: dict[str, Any]
    status: str
    gpus: int
    command: list[str]
    capacity: dict[str, Any] | None = None
    simulated_capacity: dict[str, Any] | None = None
    reason: str | None = None
    log_tail: list[str] = field(default_factory=list)
    capacity_dir: str | None = None
    server_log: str | None = None
    ready_s: float | None = None
    wall_s: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES} (got {self.status!r})")

    @property
    def ranked_capacity(self) -> dict[str, Any] | None:
        """What the row is ranked by: its measured capacity, or for a `--simulate` tune the simulated one. A
        guided tune's simulated capacity is beside the measured one, never in its place."""
        if self.capacity is not None:
            return self.capacity
        return self.simulated_capacity if self.status == "simulated" else None

    @property
    def per_gpu_rps(self) -> float | None:
        cap = self.ranked_capacity
        value = cap.get("capacity_rps") if cap else None
        return None if value is None else float(value) / self.gpus

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["command_line"] = shlex.join(self.command)
        d["capacity_per_gpu_rps"] = self.per_gpu_rps
        return d


def row_from_dict(d: dict[str, Any], path: Path) -> TuneRow:
    try:
        return TuneRow(**{k: d[k] for k in TuneRow.__dataclass_fields__ if k in d})
    except (TypeError, ValueError) as e:
        raise UsageError(f"{path}: a configuration row that tune cannot read ({e})") from None


def ranked(rows: list[TuneRow]) -> list[TuneRow]:
    """Best first: capacity per GPU, then the interval's lower edge; rows without a capacity last."""
    def key(r: TuneRow) -> tuple[int, float, float]:
        per_gpu = r.per_gpu_rps
        interval = (r.ranked_capacity or {}).get("interval_rps") or [None, None]
        low = interval[0] / r.gpus if interval[0] is not None else float("-inf")
        return (0, -per_gpu, -low) if per_gpu is not None else (1, 0.0, 0.0)
    return sorted(rows, key=key)


def best_row(rows: list[TuneRow]) -> TuneRow | None:
    leaders = ranked(rows)
    return leaders[0] if leaders and leaders[0].per_gpu_rps is not None else None


def tune_doc(rows: list[TuneRow], settings: dict[str, Any], guided: dict[str, Any] | None = None) -> dict[str, Any]:
    best = best_row(rows)
    extra = {"guided": guided} if guided is not None else {}
    return {"schema_version": TUNE_SCHEMA_VERSION, "kind": "tune", "settings": settings,
            "configs": [r.to_dict() for r in rows],
            "best": dict(best.params) if best else None, "best_config": best.name if best else None,
            "best_command": shlex.join(best.command) if best else None, **extra}


def write_tune(out_dir: Path, rows: list[TuneRow], settings: dict[str, Any],
               guided: dict[str, Any] | None = None) -> None:
    write_json_atomic(out_dir / TUNE, tune_doc(rows, settings, guided))


def is_tune_dir(path: str | Path) -> bool:
    return (Path(path) / TUNE).is_file()


def read_tune_doc(out_dir: Path) -> dict[str, Any]:
    """The tune directory's tune.json, its schema version checked (exit 2 on a bad one)."""
    path = out_dir / TUNE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != TUNE_SCHEMA_VERSION:
        raise UsageError(f"{path}: not a tune.json of schema version {TUNE_SCHEMA_VERSION}")
    return doc


def tune_rows(doc: dict[str, Any], out_dir: Path) -> list[TuneRow]:
    """The rows of a tune.json read by `read_tune_doc` from `out_dir`."""
    return [row_from_dict(d, out_dir / TUNE) for d in doc.get("configs", [])]


def read_tune(out_dir: Path) -> list[TuneRow]:
    return tune_rows(read_tune_doc(out_dir), out_dir)
