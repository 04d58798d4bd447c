"""Each configuration's operating point at the SLO, and the Pareto front of output tokens/s per GPU against
output tokens/s per user.

A configuration's point is read from its own capacity search: the probe at the highest offered rate whose
attainment met the target (at or just under the capacity), from that probe's summary.json. Per GPU: the
probe's output token throughput over the configuration's GPUs; per user: 1 / the mean TPOT, the decode
speed one user sees. A configuration with no such probe (failed, or its search met the SLO at no rate) has
no point, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slobench.errors import SlobenchError
from slobench.run.rundir import read_capacity, read_summary
from slobench.tune.result import TuneRow


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    name: str
    rate_rps: float
    output_tps_per_gpu: float
    output_tps_per_user: float
    probe_dir: str  # relative to the tune directory

    def __post_init__(self) -> None:
        if self.output_tps_per_gpu < 0 or self.output_tps_per_user <= 0:
            raise ValueError(f"{self.name}: an operating point needs throughputs above 0 (got "
                             f"{self.output_tps_per_gpu}, {self.output_tps_per_user})")

    def dominates(self, other: OperatingPoint) -> bool:
        """At least as good on both axes and better on one."""
        return (self.output_tps_per_gpu >= other.output_tps_per_gpu
                and self.output_tps_per_user >= other.output_tps_per_user
                and (self.output_tps_per_gpu > other.output_tps_per_gpu
                     or self.output_tps_per_user > other.output_tps_per_user))


def operating_point(tune_dir: Path, row: TuneRow) -> OperatingPoint | None:
    """The row's point from the highest-rate probe of its search that met the SLO; None where there is none
    or its files cannot be read (the page then lists the configuration without a point)."""
    if row.capacity_dir is None or row.ranked_capacity is None:
        return None
    search_dir = tune_dir / row.capacity_dir
    try:
        doc = read_capacity(search_dir)
    except (SlobenchError, OSError):
        return None
    target = float(doc.get("attainment_target") or 0.0)
    met = [p for p in doc.get("probes") or []
           if p.get("attainment") is not None and p["attainment"] >= target and p.get("run_dir")]
    for probe in sorted(met, key=lambda p: (-float(p["rate_rps"]), int(p.get("seed") or 0))):
        try:
            summary = read_summary(search_dir / str(probe["run_dir"]))
        except (SlobenchError, OSError):
            continue
        tpot_s = summary.tpot.mean if summary is not None else None
        if summary is None or not tpot_s or tpot_s <= 0:
            continue
        return OperatingPoint(row.name, float(probe["rate_rps"]), summary.output_token_throughput_tps / row.gpus,
                              1.0 / tpot_s, str(Path(row.capacity_dir) / str(probe["run_dir"])))
    return None


def pareto_front(points: list[OperatingPoint]) -> list[OperatingPoint]:
    """The points no other point dominates, by output tokens/s per GPU (ascending): the line to draw."""
    front = [p for p in points if not any(q.dominates(p) for q in points)]
    return sorted(front, key=lambda p: (p.output_tps_per_gpu, -p.output_tps_per_user))


__all__ = ["OperatingPoint", "operating_point", "pareto_front"]
