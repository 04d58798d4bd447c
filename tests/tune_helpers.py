"""A tune directory made in process, no server: each configuration's capacity search written from synthetic
probes (`report.synthetic`'s FIFO queue at a known capacity), its capacity.json and tune.json beside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO
from slobench.report.synthetic import DEFAULT_SLO, write_synthetic_sweep
from slobench.run.rundir import read_summary, write_capacity
from slobench.tune.result import TuneRow, write_tune

RATES = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0)
SPREAD = (0.97, 1.0, 1.03, 0.99, 1.01)  # each seed's crossing, a fraction of the capacity
# name: (capacity req/s, GPUs, simulated capacity req/s)
CONFIGS: dict[str, tuple[float, int, float]] = {
    "seqs-8": (11.0, 1, 12.0),
    "seqs-4": (7.0, 1, 7.5),
    "tp-2": (13.0, 2, 15.0),
    "seqs-1": (3.0, 1, 2.5),
}


def synthetic_search(search_dir: Path, capacity_rps: float, seed: int, *, workload: str = "synthetic",
                     slo: SLO = DEFAULT_SLO) -> dict[str, Any]:
    sweep = write_synthetic_sweep(search_dir, list(RATES), 120, capacity_rps=capacity_rps, seed=seed,
                                  with_server_metrics=False, slo=slo, workload_name=workload)
    probes = []
    for rate in RATES:
        run_dir = next(p for p in sweep.iterdir() if p.is_dir() and read_summary(p).rate_rps == rate)
        att = read_summary(run_dir).attainment_value
        probes.append({"rate_rps": rate, "seed": 0, "phase": "up", "attainment": att,
                       "ci": [max(0.0, att - 0.05), min(1.0, att + 0.05)], "run_dir": run_dir.name})
    cap = {"capacity_rps": capacity_rps, "interval_rps": [capacity_rps * 0.9, capacity_rps * 1.1], "level": 0.95,
           "is_lower_bound": False}
    # the seeds' own crossings, as a search's replicates record them: what `gate` compares
    replicates = [{"seed": k, "capacity_rps": capacity_rps * f} for k, f in enumerate(SPREAD)]
    write_capacity(search_dir, {"mode": "search", "kind": "capacity", "attainment_target": 0.9, **cap,
                                "inconclusive": None, "probes": probes, "replicates": replicates,
                                "slo": slo.to_dict(), "workload": workload,
                                "manifest": {"workload_name": workload, "workload": {"name": workload},
                                             "slo": slo.to_dict()}})
    return cap


def synthetic_tune(root: Path, *, failed: dict[str, str] | None = None, scale: float = 1.0,
                   workload: str = "synthetic", slo: SLO = DEFAULT_SLO) -> Path:
    """A guided tune of CONFIGS measured (each with its simulated capacity beside), plus a failed row whose
    parameter, reason and log are `failed`'s strings (hostile ones, for the escaping tests). `scale`
    multiplies every measured capacity (a slower or faster build)."""
    rows = []
    for i, (name, (cap_rps, gpus, sim_rps)) in enumerate(CONFIGS.items()):
        cap = synthetic_search(root / name / "capacity", cap_rps * scale, seed=i, workload=workload, slo=slo)
        sim = {**cap, "capacity_rps": sim_rps, "interval_rps": [sim_rps * 0.95, sim_rps * 1.05]}
        rows.append(TuneRow(name, {"config": name}, "measured", gpus, ["srv", "--port", "{port}", name],
                            capacity=cap, simulated_capacity=sim, capacity_dir=f"{name}/capacity"))
    if failed is not None:
        rows.append(TuneRow("broken", {"config": failed["param"]}, "failed", 1, ["srv", failed["param"]],
                            reason=failed["reason"], log_tail=[failed["log"]]))
    guided = {"k": len(CONFIGS), "profile": "cpu-tiny", "ranking_held": False, "ignored_params": [],
              "simulated_order": ["tp-2", "seqs-8", "seqs-4", "seqs-1"],
              "measured_order": ["seqs-8", "seqs-4", "tp-2", "seqs-1"]}
    write_tune(root, rows, {"simulate": False, "capacity_args": ["--workload", "synthetic"]}, guided)
    return root
