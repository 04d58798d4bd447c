"""How much of a validation's misses is the machine: the engine's step log read back, offline.

Reads what `validate_sim.py` leaves (steps.jsonl, the engine's step log; windows.json, each run's wall-clock
window) and, for every measured run, how fast the machine ran the engine's steps against the refinement
that fitted its profile (`machine_speed`). Then re-simulates every run: as calibrated; scaled by the speed
of the run before (a forecast); by the run's own speed; second by second (`SpeedTrace`); and 40 times along
paths of an AR(1) speed process fitted on the refinement (a band). With `--repeat` runs, the server against
itself beside the two runs' speeds. Figures: docs/measurements/speed_drift.md.

    python benchmarks/speed_drift.py runs/validate-YYYYMMDD-HHMMSS"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_sim  # noqa: E402  (its SLOs, limits, judging and table)

from reference_engine.executor.modeled_executor import CostProfile  # noqa: E402
from reference_engine.step_log import machine_speed, read_step_log, speeds_across  # noqa: E402
from slobench.analysis.slo import SLO  # noqa: E402
from slobench.fleet.replica import SpeedTrace  # noqa: E402
from slobench.fleet.simulate import calibrated_extras, simulate_records  # noqa: E402
from slobench.workload import generate, load_workload  # noqa: E402

BIN_S, MIN_STEPS = 1.0, 10  # the second-by-second trace: bin width, and the fewest steps a bin is read from


def simulate(root: Path, name: str, rate: float, n: int, seed: int, slo: str, prof: Path,
             speed: SpeedTrace | None, o_factor: float) -> dict[str, Any]:
    """The same requests as the measured run, simulated with `prof` (its o times `o_factor`) at `speed`."""
    wl = str(root / "prefill-heavy.toml") if name == "prefill-heavy" else name
    specs = generate(load_workload(wl), rate_rps=rate, num_requests=n, seed=seed)
    o, jitter = calibrated_extras(CostProfile.load(prof))
    flags = validate_sim.engine_flags()
    knobs = {"profile": str(prof), "kv_blocks": int(flags[flags.index("--kv-blocks") + 1]),
             "max_num_seqs": int(flags[flags.index("--max-num-seqs") + 1])}
    records = simulate_records(specs, knobs, seed=0, jitter_sd=jitter, request_overhead_s=o * o_factor, speed=speed)
    return validate_sim.judge(records, SLO.parse(slo))


def per_bin(ref: list[dict[str, float]], steps: list[dict[str, float]], origin: float,
            t0: float = 0.0) -> dict[int, float]:
    """The machine's speed in each BIN_S of `steps` (bin k: from t0 + k BIN_S, Unix time) that holds at least
    MIN_STEPS steps, against a model fitted on the reference's (`speeds_across`)."""
    bins: dict[int, list[dict[str, float]]] = {}
    for st in steps:
        bins.setdefault(int((origin + st["t"] - t0) // BIN_S), []).append(st)
    keys = [k for k, b in bins.items() if len(b) >= MIN_STEPS]
    return {k: v for k, v in zip(keys, speeds_across([bins[k] for k in keys], ref), strict=True) if v is not None}


def trace_of(ref: list[dict[str, float]], steps: list[dict[str, float]], origin: float, anchor: float,
             whole: float) -> SpeedTrace:
    """The machine's speed in each BIN_S of a run (virtual time: the run's clock, 0 at `anchor`), from the
    run's steps against a model fitted on the reference's; `whole` (the run's) where a bin has few steps."""
    speeds = per_bin(ref, steps, origin, anchor)
    first, last = (int((origin + st["t"] - anchor) // BIN_S) for st in (steps[0], steps[-1]))
    return SpeedTrace(tuple(k * BIN_S for k in range(first, last + 1)),
                      tuple(speeds.get(k, whole) for k in range(first, last + 1)))


DRAWS, BAND = 40, (5.0, 95.0)  # speed paths drawn a point, and the band of their simulations (percentiles)


def speed_process(ref: list[dict[str, float]], origin: float) -> tuple[float, float, int]:
    """How the machine's speed wandered while the profile was fitted: the sd and lag-1 autocorrelation of its
    log per BIN_S (an AR(1) process), from the reference's steps against a model fitted on them, and the number
    of bins read."""
    logs = {k: math.log(v) for k, v in per_bin(ref, ref, origin).items()}
    if len(logs) < 4:
        return 0.0, 0.0, len(logs)
    pairs = np.array([(v, logs[k + 1]) for k, v in logs.items() if k + 1 in logs])
    phi = float(np.corrcoef(pairs.T)[0, 1]) if len(pairs) > 2 else 0.0
    return float(np.std(list(logs.values()))), max(0.0, min(phi, 0.99)), len(logs)


def draw_trace(rng: np.random.Generator, sigma: float, phi: float, num_bins: int) -> SpeedTrace:
    """One path of the AR(1) speed process, mean factor 1, BIN_S a step."""
    x = np.empty(num_bins)
    x[0] = rng.normal(0.0, sigma)
    shocks = rng.normal(0.0, sigma * math.sqrt(1.0 - phi * phi), num_bins)
    for t in range(1, num_bins):
        x[t] = phi * x[t - 1] + shocks[t]
    return SpeedTrace(tuple(i * BIN_S for i in range(num_bins)), tuple(np.exp(x - sigma * sigma / 2)))


def print_bands(rows: list[tuple[str, float, dict[str, Any], dict[str, tuple[float, float]]]]) -> int:
    """A table of measured values and the simulated bands; the count of values inside their band."""
    keys = ("attainment", *validate_sim.PERCENTILES)
    print("\n| workload | rate req/s | attainment meas [band] | TTFT p50 ms | TTFT p90 | TPOT p50 ms | TPOT p90 |")
    print("|---|---|---|---|---|---|---|")
    hits = total = 0
    for name, rate, m, band in rows:
        cells = []
        for k in keys:
            lo, hi = band[k]
            v = m[k]
            ok = v is not None and lo <= v <= hi
            hits += ok
            total += 1
            f = (lambda x: f"{x:.0%}") if k == "attainment" else (lambda x: f"{x * 1e3:.{1 if x < 0.01 else 0}f}")
            cells.append(f"{'n/a' if v is None else f(v)} [{f(lo)}-{f(hi)}]{'' if ok else ' ✗'}")
        print(f"| {name} | {rate:.2f} | " + " | ".join(cells) + " |")
    print(f"\n{hits} of {total} measured values inside the simulated {BAND[0]:g}-{BAND[1]:g}% band")
    return hits


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
    as_is, forecast, own, traced, again, banded = [], [], [], [], [], []
    processes = {}  # per workload: the speed process while its profile was fitted (AR(1) on log speed)
    origin = float(rows_log.header["origin_unix"])
    for name in {k.split("/")[0] for k, _ in runs}:
        processes[name] = speed_process(rows_log.between(*(refs.get(name) or next(iter(refs.values())))), origin)
        sigma, phi, nb = processes[name]
        print(f"  {name}: while its profile was fitted, log speed per {BIN_S:g} s had sd {sigma:.3f} and lag-1 "
              f"autocorrelation {phi:.2f} ({nb} bins)")
    previous: float | None = None
    for key, w in runs:
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
            first_key = f"{name}/measured-{leaf.removeprefix('measured-again-')}"
            first = validate_sim.load_and_judge(root / first_key, SLO.parse(slo))
            first_sp = speed.get(first_key)
            again.append((name, rate, first, m, None if sp is None or first_sp is None else sp / first_sp))
        else:
            def sim(trace: SpeedTrace | None, o_factor: float = 1.0) -> dict[str, Any]:
                return simulate(root, name, rate, n, seed, slo, prof, trace, o_factor)  # noqa: B023 (used at once)

            as_is.append((name, rate, m, sim(None)))
            sigma, phi, _ = processes[name]
            if sigma > 0:
                rng = np.random.default_rng(zlib.crc32(key.encode()))
                num_bins = int(3 * n / rate / BIN_S) + 30  # past the knee the queue drains long after the last arrival
                draws = [sim(draw_trace(rng, sigma, phi, num_bins)) for _ in range(DRAWS)]
                band = {k: (float(np.percentile([d[k] for d in draws], BAND[0])),
                            float(np.percentile([d[k] for d in draws], BAND[1])))
                        for k in ("attainment", *validate_sim.PERCENTILES)}
                banded.append((name, rate, m, band))
            if previous is not None:
                forecast.append((name, rate, m, sim(SpeedTrace((0.0,), (previous,)), previous)))
            if sp is not None:
                own.append((name, rate, m, sim(SpeedTrace((0.0,), (sp,)), sp)))
                ref = refs.get(name) or next(iter(refs.values()))
                trace = trace_of(rows_log.between(*ref), rows_log.between(*w), float(rows_log.header["origin_unix"]),
                                 float(man["clock"]["wall_anchor_unix_s"]), sp)
                traced.append((name, rate, m, sim(trace, sp)))
                print(f"  {key}: second by second x{min(trace.factors):.2f}-x{max(trace.factors):.2f} "
                      f"over {len(trace.factors)} s", flush=True)
        previous = sp if sp is not None else previous
    print("\nAs calibrated:")
    validate_sim.print_rows(as_is)
    print("\nForecast: the profile scaled by the machine's speed in the measured run before (the first run has none):")
    validate_sim.print_rows(forecast, "meas / forecast")
    print("\nAt the run's own speed, one number (a diagnosis, not a prediction):")
    validate_sim.print_rows(own, "meas / sim@speed")
    print("\nAt the run's speed second by second (a diagnosis: what the step log can tell the simulation):")
    validate_sim.print_rows(traced, "meas / sim@trace")
    if banded:
        print(f"\nA band, not a point: {DRAWS} simulations a point, each with a path of the machine's speed drawn "
              "from the process measured while the profile was fitted (a prediction: nothing of the run is used):")
        print_bands(banded)
    if again:
        print("\nThe server against itself, and how much slower the second run's steps were than the first's:")
        validate_sim.print_rows([(n_, r, a, b) for n_, r, a, b, _ in again], "meas / again")
        for n_, r, a, b, ratio in again:
            print(f"  {n_} {r:.2f} req/s: attainment {a['attainment']:.1%} then {b['attainment']:.1%}; second run's "
                  "steps " + ("n/a" if ratio is None else f"x{ratio:.3f} the first's"))


if __name__ == "__main__":
    main()
