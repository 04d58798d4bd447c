"""A tune directory as one side of `slobench gate`: its best configuration's capacity search.

`gate --baseline BASE_TUNE --candidate CAND_TUNE` holds a candidate build's best configuration against a
baseline tune: each tune stands for the capacity directory of the configuration it ranked first (per
GPU), said on stderr. The gate then reads that capacity.json as it reads any other, so different
workloads or SLOs are refused (exit 2) as they are between two capacity results, and the tunes are named
in the message. A tune in which no configuration was measured has nothing to gate: exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from slobench.errors import UsageError
from slobench.tune.result import best_row, is_tune_dir, read_tune
from slobench.tune.table import params_text


def best_capacity_dir(path: Path) -> Path | None:
    """The capacity directory of the tune at `path`'s best configuration; None when `path` holds no tune."""
    if not (path.is_dir() and is_tune_dir(path)):
        return None
    best = best_row(read_tune(path))
    if best is None or best.capacity_dir is None:
        raise UsageError(f"{path}: a tune in which no configuration has a capacity: nothing to gate "
                         f"(`slobench tune --resume --out {path}` finishes it)")
    where = path / best.capacity_dir
    kind = "simulated " if best.capacity is None else ""  # a `tune --simulate`: its ranking is simulated
    print(f"gate: {path} is a tune: its best configuration ({params_text(best)}, {best.per_gpu_rps:.3g} req/s "
          f"per GPU {kind}on {best.gpus} GPU{'s' if best.gpus > 1 else ''}) stands for it: {where}",
          file=sys.stderr)
    return where


__all__ = ["best_capacity_dir"]
