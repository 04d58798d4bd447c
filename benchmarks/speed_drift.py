"""How much of a validation's misses is the machine: the engine's step log read back, offline.

`validate_sim.py` (bundled engine) leaves `steps.jsonl`, the engine's step log (reference_engine.step_log),
and `windows.json`, the wall-clock windows of each refinement and each measured run. This reads them and,
for every measured run, says how fast the machine ran the engine's steps against the refinement that fitted
the run's profile (`machine_speed`: a step-time model fitted on the refinement's steps scores both on their
own compositions; 1.10 = 10% slower). Then three tables against the same measurements:

- the simulation as validated (the calibrated profile as it is), re-simulated here;
- *forecast*: the profile scaled by the machine's speed in the measured run just before (the last thing a
  user could know before the run: a prediction, not a fit);
- *at the run's speed*: scaled by the run's own speed (one number from the run itself: a diagnosis of how
  much of the miss is the machine's speed, not a prediction).

And, when the validation ran `--repeat`, the server against itself next to the ratio of the two runs' speeds.

    python benchmarks/speed_drift.py runs/validate-20261202-092315
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_sim  # noqa: E402  (its SLOs, limits, judging and table)

from reference_engine.step_log import machine_speed, read_step_log  # noqa: E402
from slobench.analysis.slo import SLO  # noqa: E402


def simulate(root: Path, name: str, rate: float, n: int, seed: int, slo: str, prof: Path, tag: str) -> dict[str, Any]:
    wl = str(root / "prefill-heavy.toml") if name == "prefill-heavy" else name
    out = root / name / f"drift-{tag}-{rate:.4g}"
    validate_sim.quiet([*validate_sim.run_args(wl, rate, n, seed, slo, out), "--simulate", "--profile", str(prof),
                        *validate_sim.engine_flags()])
    return validate_sim.load_and_judge(out, SLO.parse(slo))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="a validate_sim.py output directory with steps.jsonl and windows.json")
    args = ap.parse_args()
    root: Path = args.dir
    for need in ("steps.jsonl", "windows.json"):
        if not (root / need).exists():
            raise SystemExit(f"speed_drift: {root / need} is missing (validate_sim.py against the bundled engine writes it)")
    rows_log = read_step_log(root / "steps.jsonl")
    win = json.loads((root / "windows.json").read_text())
    refs = {Path(k).stem.removeprefix("calibrated-"): tuple(v) for k, v in win["refinements"].items()}
    runs = sorted(((k, tuple(v)) for k, v in win["runs"].items()), key=lambda kv: kv[1][0])
    speed: dict[str, float | None] = {}
    for key, w in runs:
        name = key.split("/")[0]
        ref = refs.get(name) or next(iter(refs.values()))  # `--refine-workload mix`: one refinement for all
        speed[key] = machine_speed(rows_log.between(*ref), rows_log.between(*w))
    print("The machine's speed in each measured run, against its workload's refinement (>1: slower):")
    for key, _ in runs:
        sp = speed[key]
        print(f"  {key}: " + ("n/a" if sp is None else f"x{sp:.3f}"))
    as_is, forecast, own, again = [], [], [], []
    previous: float | None = None
    for key, _ in runs:
        name, leaf = key.split("/")
        is_again = leaf.startswith("measured-again-")
        rate = float(leaf.rsplit("-", 1)[1])
        run_dir = root / key
        man = json.loads((run_dir / "manifest.json").read_text())
        slo = validate_sim.SLOS.get(name, validate_sim.SLOS["tiny"])
        n, seed = len(validate_sim.load_run(run_dir).records), int(man["seed"])
        m = validate_sim.load_and_judge(run_dir, SLO.parse(slo))
        prof = root / f"calibrated-{name}.json"
        if not prof.exists():
            prof = root / "calibrated-refined.json"
        sp = speed[key]
        if is_again:
            first = validate_sim.load_and_judge(root / name / f"measured-{leaf.removeprefix('measured-again-')}",
                                               SLO.parse(slo))
            first_sp = speed.get(f"{name}/measured-{leaf.removeprefix('measured-again-')}")
            again.append((name, rate, first, m, None if sp is None or first_sp is None else sp / first_sp))
        else:
            as_is.append((name, rate, m, simulate(root, name, rate, n, seed, slo, prof, "as-is")))
            if previous is not None:
                p = validate_sim.at_speed(prof, previous, root / name / f"profile-forecast-{rate:.4g}.json")
                forecast.append((name, rate, m, simulate(root, name, rate, n, seed, slo, p, "forecast")))
            if sp is not None:
                p = validate_sim.at_speed(prof, sp, root / name / f"profile-own-{rate:.4g}.json")
                own.append((name, rate, m, simulate(root, name, rate, n, seed, slo, p, "own")))
        previous = sp if sp is not None else previous
    print("\nThe calibrated simulation as validated:")
    validate_sim.print_rows(as_is)
    print("\nForecast: the profile scaled by the machine's speed in the measured run before (the first run has none):")
    validate_sim.print_rows(forecast, "meas / forecast")
    print("\nAt the run's own speed (a diagnosis, not a prediction):")
    validate_sim.print_rows(own, "meas / sim@speed")
    if again:
        print("\nThe server against itself, and how much slower the second run's steps were than the first's:")
        validate_sim.print_rows([(n_, r, a, b) for n_, r, a, b, _ in again], "meas / again")
        for n_, r, a, b, ratio in again:
            print(f"  {n_} {r:.2f} req/s: attainment {a['attainment']:.1%} then {b['attainment']:.1%}; second run's "
                  "steps " + ("n/a" if ratio is None else f"x{ratio:.3f} the first's"))


if __name__ == "__main__":
    main()
