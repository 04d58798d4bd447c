"""The guide's profile calibrated on the fly: the first configuration is measured live, the host costs of a
base profile are fitted on its probes (`slobench calibrate --from-runs`, a child process, with the engine
knobs of that configuration), and every configuration is then simulated with the fitted profile.

The fit is `calibrate --from-runs`'s own (its held-out error is in OUT/calibrate.log). Where it cannot be
made (the first configuration failed, or the fit exits non-zero), the guide simulates with the base profile
as given, and the tune says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slobench.errors import SlobenchError
from slobench.run.rundir import read_capacity
from slobench.tune.configs import knob_flags
from slobench.tune.result import TuneRow
from slobench.tune.search import run_child

CALIBRATED = "calibrated-profile.json"
CALIBRATE_LOG = "calibrate.log"
# the engine flags `slobench calibrate --from-runs` takes to describe the served engine
CALIBRATE_KNOBS = ("kv_blocks", "block_size", "max_num_seqs", "max_batched_tokens", "max_model_len", "scheduler")


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the guide simulates with: the fitted profile's path, or None and why not."""

    base: str
    source: str  # the configuration the fit was made on
    profile: str | None
    reason: str | None = None

    def __post_init__(self) -> None:
        if (self.profile is None) == (self.reason is None):
            raise ValueError("a calibration has a fitted profile or a reason for none, not both")

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "source": self.source, "profile": self.profile, "reason": self.reason}

    def line(self) -> str:
        if self.profile is not None:
            return f"calibrated {self.base}'s host costs on {self.source}: {self.profile}"
        return f"not calibrated ({self.reason}): simulating with {self.base} as given"


def probe_dirs(tune_dir: Path, row: TuneRow) -> list[Path]:
    """The run directories of the row's search probes; none where it has no readable search."""
    if row.capacity_dir is None:
        return []
    try:
        doc = read_capacity(tune_dir / row.capacity_dir)
    except (SlobenchError, OSError):
        return []
    dirs = [tune_dir / row.capacity_dir / str(p["run_dir"]) for p in doc.get("probes") or []]
    return [d for d in dirs if d.is_dir()]


def calibration_argv(runs: list[Path], row: TuneRow, base: str, out: Path) -> list[str]:
    flags = knob_flags({k: v for k, v in row.params.items() if k in CALIBRATE_KNOBS}, CALIBRATE_KNOBS)
    return [sys.executable, "-m", "slobench", "calibrate", "--from-runs", *map(str, runs), "--profile", base,
            *flags, "-o", str(out)]


def calibrate_first(row: TuneRow, base: str, tune_dir: Path, grace_s: float) -> Calibration:
    """`base`'s host costs fitted on `row`'s probes, in OUT/calibrated-profile.json (log: OUT/calibrate.log)."""
    runs = probe_dirs(tune_dir, row)
    if row.status not in ("measured", "inconclusive") or not runs:
        return Calibration(base, row.name, None, f"{row.name} is {row.status}, with no probes to fit on")
    out = tune_dir / CALIBRATED
    out.unlink(missing_ok=True)  # never a stale fit from an earlier run
    code = run_child(calibration_argv(runs, row, base, out), tune_dir / CALIBRATE_LOG, server=None, grace_s=grace_s)
    if code != 0 or not out.is_file():
        return Calibration(base, row.name, None, f"slobench calibrate exited {code} (log: {tune_dir / CALIBRATE_LOG})")
    return Calibration(base, row.name, str(out))


__all__ = ["CALIBRATED", "CALIBRATE_LOG", "Calibration", "calibrate_first", "calibration_argv"]
