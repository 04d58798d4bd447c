"""False alarms and detections of the history's change-point search, on synthetic commit histories.

Each history is a series of CI jobs running the same 5 seeds (slobench.history.synthetic: noise only, a
-2% drift per commit, or a -10% step halfway; one noise kind heavy-tailed). Each is judged by the
per-commit gate (each commit against the one before) and by slobench.history.find_change_points on the
commit means, with and without its size floor; a last row tests a page of 11 noise-only metrics at
alpha / 11, as `slobench history report` does. Figures: docs/measurements/history_changepoint.md.

    .venv/bin/python benchmarks/history_changepoint.py [--histories 100] [--commits 10,20,40]"""

from __future__ import annotations

import argparse
import time

import numpy as np

from slobench.gate import Threshold, compare_metric
from slobench.history.changepoint import find_change_points, shift_test
from slobench.history.synthetic import NoiseModel, drift_levels, replicate_values, step_levels

TH = Threshold.parse("capacity=5%", "drop")


def gate_never_fails(history: list[dict[int, float]]) -> bool:
    return all(compare_metric("capacity", TH, a, b).verdict != "regression"
               for a, b in zip(history, history[1:], strict=False))


def means(history: list[dict[int, float]]) -> list[float]:
    return [float(np.mean(list(h.values()))) for h in history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", type=int, default=100)
    ap.add_argument("--commits", default="10,20,40")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--calibration", type=int, default=4000, help="Gaussian series per length for the calibration")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f"{'history':<30}{'commits':>8}{'gate never fails':>18}{'change found':>14}{'test alone':>12}"
          f"{'ms/history':>12}")
    heavy = NoiseModel(job_sd=0.01, job_df=3)
    for n in (int(x) for x in a.commits.split(",")):
        flat = drift_levels(n, per_commit=0.0)
        kinds = {"noise only": (flat, NoiseModel()), "noise, t3 job effects 1%": (flat, heavy),
                 "drift -2%/commit": (drift_levels(n, per_commit=-0.02), NoiseModel()),
                 "step -10% halfway": (step_levels(n, at=n // 2, size=-0.10), NoiseModel())}
        for name, (levels, noise) in kinds.items():
            quiet = found = raw = 0
            t0 = time.perf_counter()
            for _ in range(a.histories):
                h = replicate_values(levels, rng, noise)
                quiet += gate_never_fails(h)
                found += bool(find_change_points(means(h), alpha=0.01, min_shift=0.05))
                raw += bool(find_change_points(means(h), alpha=0.01, min_shift=0.0))
            ms = (time.perf_counter() - t0) / a.histories * 1e3
            print(f"{name:<30}{n:>8}{quiet / a.histories:>18.0%}{found / a.histories:>14.0%}"
                  f"{raw / a.histories:>12.0%}{ms:>12.1f}")
        pages = 0
        for _ in range(a.histories):
            series = [means(replicate_values(flat, rng)) for _ in range(11)]
            pages += any(find_change_points(s, alpha=0.01 / 11, min_shift=0.0) for s in series)
        print(f"{'page of 11 noise metrics':<30}{n:>8}{'':>18}{'':>14}{pages / a.histories:>12.0%}")
    print("\ncalibration of the test alone on i.i.d. Gaussian series, share with p < alpha:")
    for n in (int(x) for x in a.commits.split(",")):
        ps = np.array([shift_test(rng.standard_normal(n))[1] for _ in range(a.calibration)])
        print(f"  {n:>3} commits, {a.calibration} series: " + ", ".join(
            f"alpha {al:g}: {np.mean(ps < al):.2%}" for al in (0.01, 0.05, 0.1)))
    print("\nchange found: alpha 0.01 and a shift >= 5%, as the report does; test alone: the same without the size "
          "floor.\nNoise rows are false alarms; the page row tests each metric at alpha/11 (the report's default).")


if __name__ == "__main__":
    main()
