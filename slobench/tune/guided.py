"""Guided tuning: every configuration ranked by simulated capacity before any server starts, the top K
measured live, and whether the simulator's order of those K held against the measured one.

The simulation is the same `slobench capacity --simulate` child process `tune --simulate` runs, given the
configuration's parameters that name a knob of the bundled engine; a parameter with no knob equivalent
(another server's flag) is passed over for the simulation, and the result says which.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slobench.errors import UsageError
from slobench.tune.configs import ENGINE_KNOBS, GPUS, TuneConfig, knob_flags
from slobench.tune.result import TuneRow
from slobench.tune.search import SearchResult, capacity_argv, run_search

SIMULATED_DIR = "simulated"
SIMULATED_LOG = "simulated.log"
SIMULATED_ONLY = "simulated only"


@dataclass(frozen=True, slots=True)
class Guide:
    """`--simulate-first K --profile PROFILE`; with `calibrate`, PROFILE is the base whose host costs are
    fitted on the first configuration measured live (calibrate_first.py) before anything is simulated."""

    k: int
    profile: str
    calibrate: bool = False

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UsageError(f"--simulate-first must be 1 or more (got {self.k})")
        if not self.profile:
            raise UsageError("--simulate-first needs a profile to simulate with (--profile)")


def simulated_knobs(params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A configuration's engine-knob flags for the simulator, and the parameters with no knob equivalent."""
    knobs = {name: value for name, value in params.items() if name in ENGINE_KNOBS}
    ignored = [name for name in params if name not in knobs and name != GPUS]
    return knob_flags(knobs, ENGINE_KNOBS), ignored


def ignored_params(configs: list[TuneConfig]) -> list[str]:
    """The parameters the simulation passes over; exit 2 when no parameter maps to an engine knob."""
    mapped: set[str] = set()
    ignored: dict[str, None] = {}
    for cfg in configs:
        flags, skipped = simulated_knobs(cfg.params)
        mapped.update(f for f in flags[::2])
        ignored.update(dict.fromkeys(skipped))
    if not mapped:
        names = sorted({n for c in configs for n in c.params if n != GPUS})
        raise UsageError(f"--simulate-first: no parameter ({', '.join(names) or 'none'}) is a knob of the "
                         f"bundled engine ({', '.join(ENGINE_KNOBS)}), so the simulator cannot tell the "
                         f"configurations apart")
    return list(ignored)


def simulation_argv(cfg: TuneConfig, guide: Guide, out: Path, passed: list[str]) -> list[str]:
    """The configuration's `slobench capacity --simulate` command, as `tune --simulate` runs it."""
    flags, _ = simulated_knobs(cfg.params)
    # the profile first: a configuration's own `profile` parameter comes after it and wins
    return capacity_argv(out, url=None, knob_flags=["--profile", guide.profile, *flags], passed=passed)


def simulate_all(configs: list[TuneConfig], guide: Guide, out_dir: Path, passed: list[str],
                 grace_s: float) -> dict[str, SearchResult]:
    """Each configuration's simulated capacity search, in OUT/<configuration>/simulated/."""
    results: dict[str, SearchResult] = {}
    for i, cfg in enumerate(configs):
        cfg_dir = out_dir / cfg.name
        cfg_dir.mkdir(parents=True, exist_ok=True)
        argv = simulation_argv(cfg, guide, cfg_dir / SIMULATED_DIR, passed)
        results[cfg.name] = run_search(argv, cfg_dir / SIMULATED_DIR, cfg_dir, server=None, grace_s=grace_s,
                                       log_name=SIMULATED_LOG)
        cap = (results[cfg.name].capacity or {}).get("capacity_rps")
        what = f"{cap:.3g} req/s simulated" if cap is not None else results[cfg.name].reason
        print(f"[simulate {i + 1}/{len(configs)}] {cfg.name}: {what}", file=sys.stderr)
    return results


def guide_rps(cap: dict[str, Any] | None) -> float | None:
    """What the guide ranks a simulation by: its capacity, or where its seeds' crossings were too spread for
    one (an inconclusive search: short probes), their mean. The guide needs an order, not an interval; ranked
    last instead, such a configuration was never measured however high its seeds crossed."""
    cap = cap or {}
    if cap.get("capacity_rps") is not None:
        return float(cap["capacity_rps"])
    crossings = cap.get("seed_crossings_rps") or []
    return sum(crossings) / len(crossings) if crossings else None


def simulated_rows(configs: list[TuneConfig], sims: dict[str, SearchResult]) -> list[TuneRow]:
    """Every configuration as a "simulated only" row, best simulated capacity per GPU first (`guide_rps`),
    then the lower edge of its interval; those with neither a capacity nor a crossing last."""
    rows = [TuneRow(c.name, c.params, SIMULATED_ONLY, c.gpus, c.command(), simulated_capacity=sims[c.name].capacity,
                    reason=sims[c.name].reason, capacity_dir=f"{c.name}/{SIMULATED_DIR}") for c in configs]

    def key(r: TuneRow) -> tuple[int, float, float]:
        value = guide_rps(r.simulated_capacity)
        low = ((r.simulated_capacity or {}).get("interval_rps") or [None])[0]
        return ((0, -value / r.gpus, -(low if low is not None else float("-inf")) / r.gpus) if value is not None
                else (1, 0.0, 0.0))

    return sorted(rows, key=key)


def per_gpu(cap: dict[str, Any] | None, gpus: int) -> float | None:
    value = (cap or {}).get("capacity_rps")
    return None if value is None else float(value) / gpus


def guided_block(rows: list[TuneRow], guide: Guide, ignored: list[str],
                 calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """Whether the simulator's order of the measured configurations is their measured order."""
    both = [r for r in rows if per_gpu(r.capacity, r.gpus) is not None
            and per_gpu(r.simulated_capacity, r.gpus) is not None]
    simulated_order = [r.name for r in sorted(both, key=lambda r: -(per_gpu(r.simulated_capacity, r.gpus) or 0.0))]
    measured_order = [r.name for r in sorted(both, key=lambda r: -(per_gpu(r.capacity, r.gpus) or 0.0))]
    # held: no pair the simulator puts strictly one way round and the measurement strictly the other (ties
    # on either side contradict nothing)
    pairs = [(per_gpu(r.simulated_capacity, r.gpus) or 0.0, per_gpu(r.capacity, r.gpus) or 0.0) for r in both]
    held = not any(sa > sb and ma < mb for sa, ma in pairs for sb, mb in pairs)
    extra = {"calibrated": calibration} if calibration is not None else {}
    return {"k": guide.k, "profile": guide.profile, "ranking_held": held,
            "simulated_order": simulated_order, "measured_order": measured_order, "ignored_params": ignored,
            **extra}


__all__ = ["SIMULATED_DIR", "SIMULATED_ONLY", "Guide", "guided_block", "ignored_params", "simulate_all",
           "simulated_rows", "simulation_argv"]
