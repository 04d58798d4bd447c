"""Synthetic commit histories with a known truth, for the tests and benchmarks/history_changepoint.py.

Each commit is one CI job running the same seeds: replicate value = level × (1 + seed effect + job effect +
run noise). The seed effect is the same at every commit (common random numbers: the workload a seed draws),
the job effect is shared by one job's replicates (its runner), the run noise is each run's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class NoiseModel:
    seed_sd: float = 0.02  # relative sd of a seed's effect, shared across commits
    job_sd: float = 0.005  # relative sd of a job's effect, shared by its replicates
    run_sd: float = 0.01  # relative sd of one run's own noise
    num_seeds: int = 5
    job_df: float | None = None  # Student-t job effects of this many degrees of freedom (an odd runner), else Gaussian


def drift_levels(num_commits: int, *, start: float = 20.0, per_commit: float = -0.02) -> np.ndarray:
    """A level that moves by `per_commit` (relative) at every commit after the first."""
    return start * (1 + per_commit) ** np.arange(num_commits)


def step_levels(num_commits: int, *, start: float = 20.0, at: int = 5, size: float = -0.1) -> np.ndarray:
    return np.where(np.arange(num_commits) < at, start, start * (1 + size))


def replicate_values(levels: Sequence[float], rng: np.random.Generator,
                     noise: NoiseModel = NoiseModel()) -> list[dict[int, float]]:
    """Per commit: {seed: value} for seeds 1..num_seeds."""
    seeds = np.arange(1, noise.num_seeds + 1)
    seed_effect = rng.normal(0, noise.seed_sd, len(seeds))
    out = []
    for level in levels:
        job = noise.job_sd * (rng.standard_t(noise.job_df) if noise.job_df else rng.standard_normal())
        run = rng.normal(0, noise.run_sd, len(seeds))
        vals = float(level) * (1 + seed_effect + job + run)
        out.append({int(s): float(v) for s, v in zip(seeds, vals, strict=True)})
    return out
