"""The simulator against published GPU measurements: DistServe's OPT-13B runs on A100-80GB.

Each run file (one JSON line per request: start_s, prompt_len, output_len, ttft_ms, tpot_ms) is replayed with
its exact arrivals and lengths on the engine the setup ran (slobench.fleet.published: vllm, 1 GPU with the
vllm-v0 scheduler; distserve-c21d11, a TP-2 prefill and a TP-1 decode instance), with DistServe's fitted step
times or a roofline of the A100 and OPT-13B. Prints measured against simulated attainment (TTFT < 200 ms and
TPOT < 100 ms) and TTFT/TPOT p50/p90, with the targets each run meets; writes them to --json.
`--plan` adds the planner's answer from simulation alone. `--calibrate-on RUN.jsonl...` first fits the profile's
host costs on those runs (slobench.profiles.from_runs, as `slobench calibrate --from-runs` does) and replays the
positional runs with them. `--setup custom` replays on an engine built from the simulator's own flags
(`--scheduler`, `--kv-blocks`, ..., `--gpu`, `--model-config`, `--tp`, `--profile roofline|FILE`).
Figures: docs/measurements/validate_published.md.

    python benchmarks/validate_published.py --setup vllm --profile fitted RUN.jsonl [...] --json OUT.json
    python benchmarks/validate_published.py --setup distserve-c21d11 --profile fitted --calibrate-on LOW.jsonl \
        ... --json OUT.json RUN.jsonl ...
    python benchmarks/validate_published.py --setup custom --gpu a100 --model-config CONFIG.json --profile roofline \
        --scheduler chunked --max-num-seqs 256 --calibrate-on A.jsonl --json OUT.json B.jsonl"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from custom_setup import (  # this folder is on sys.path
    add_custom_arguments,
    custom_builder,
    custom_flags_given,
)
from result_json import write_result  # this folder is on sys.path

from reference_engine.errors import ConfigError
from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.headline import crossing_rate
from slobench.errors import SpecError
from slobench.fleet.published import (
    GPUS_PER_SETUP,
    NO_HOST,
    PLAN_TARGET,
    SETUPS,
    FleetBuilder,
    HostCosts,
    Run,
    ScaledBuilder,
    compare,
    cost_profile,
    measured_curve,
    mirrored_curve,
    pooled_lengths,
    read_run,
    setup_fleet,
    simulated_curve,
    targets_met,
)
from slobench.profiles.calibrate_runs import calibrate_runs, print_calibration
from slobench.profiles.run_consistency import describe, run_speeds

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "validation" / "distserve-opt13b-a100"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'run':28s} {'rate':>5s} {'n':>5s} | {'attained % meas  sim':>21s} | {'TTFT p50 ms meas  sim':>22s} "
            f"| {'TTFT p90 ms meas  sim':>22s} | {'TPOT p50 ms meas  sim':>22s} | {'TPOT p90 ms meas  sim':>22s} | missed")
    lines = [head, "-" * len(head)]
    for r in rows:
        m, s = r["measured"], r["simulated"]
        missed = [k for k, ok in r["targets_met"].items() if not ok]
        cells = [f"{m['attainment']:9.1f} {s['attainment']:5.1f} ({s['attainment'] - m['attainment']:+5.1f})"]
        for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"):
            err = (s[k] - m[k]) / m[k] * 100 if m[k] else float("nan")
            cells.append(f"{m[k]:8.0f} {s[k]:6.0f} ({err:+4.0f}%)")
        lines.append(f"{r['run']:28s} {r['rate_rps']:5.1f} {r['num_requests']:5d} | " + " | ".join(cells)
                     + " | " + (", ".join(missed) or "-"))
    return "\n".join(lines)


SWEEP_RATES = {"vllm": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0), "distserve-c21d11": (2.0, 3.0, 4.5, 6.0, 7.5, 9.0, 12.0)}


def _rate_cells(rate: float | None, lowest: float, gpus: int) -> tuple[str, str, float]:
    """(rate, per GPU) as printed, and the per-GPU rate to order by (0 where even the lowest rate missed)."""
    if rate is None:
        return f"< {lowest:g}", f"< {lowest / gpus:.2f}", 0.0
    return f"{rate:.2f}", f"{rate / gpus:.2f}", rate / gpus


def plan_section(data: Path, profile: str, hosts: dict[str, HostCosts] | None = None,
                 builds: dict[str, FleetBuilder] | None = None) -> str:
    """The planner's answer from simulation alone beside the measured one: the highest rate each setup serves
    with >= 90% of requests attaining both SLOs, and that rate per GPU (a setup's fleet from `builds` where
    given: the one its host costs were calibrated on)."""
    files = sorted((data / "runs").glob("*.jsonl"))
    lines = [f"Highest rate at >= {PLAN_TARGET:g}% attainment ({profile} profile; simulated: Poisson arrivals, "
             "lengths drawn from the setup's measured requests, 400 requests, mean of 2 seeds)",
             "and, last, simulated as the runs were made: Poisson runs of the measured runs' rates and lengths, "
             "pooled by rate as the measured answer is (mean of 2 seeds)",
             f"{'setup':18s} {'GPUs':>4s} | {'measured rps':>12s} {'per GPU':>8s} | {'simulated rps':>13s} {'per GPU':>8s}"
             f" | {'as the runs':>13s} {'per GPU':>8s}"]
    per_gpu: dict[str, tuple[float, float, float]] = {}
    for setup in SETUPS:
        runs = [read_run(f) for f in files if f.name.startswith(setup.split("-")[0] + "-")]
        if not runs:
            continue
        gpus = GPUS_PER_SETUP[setup]
        rates, att = measured_curve(runs)
        meas = crossing_rate(rates, att, PLAN_TARGET)
        sim_rates = SWEEP_RATES[setup]
        host = (hosts or {}).get(setup, NO_HOST)
        build = (builds or {}).get(setup)
        sim = crossing_rate(list(sim_rates), simulated_curve(setup, profile, data, pooled_lengths(runs), sim_rates,
                                                             host=host, build=build), PLAN_TARGET)
        mirror_rates, mirror = mirrored_curve(setup, profile, data, runs, host=host, build=build)
        mirrored = crossing_rate(mirror_rates, mirror, PLAN_TARGET)
        m_rate, m_gpu, m_key = _rate_cells(meas, rates[0], gpus)
        s_rate, s_gpu, s_key = _rate_cells(sim, sim_rates[0], gpus)
        r_rate, r_gpu, r_key = _rate_cells(mirrored, mirror_rates[0], gpus)
        per_gpu[setup] = (m_key, s_key, r_key)
        tag = (f" (host {host[0] * 1e3:.2f} ms + {host[1] * 1e3:.3f} ms/seq, request {host[2] * 1e3:.1f} ms)"
               if host != NO_HOST else "")
        lines.append(f"{setup:18s} {gpus:4d} | {m_rate:>12s} {m_gpu:>8s} | {s_rate:>13s} {s_gpu:>8s} | "
                     f"{r_rate:>13s} {r_gpu:>8s}{_error(mirrored, meas)}{tag}")
    if len(per_gpu) == 2:
        order = [sorted(per_gpu, key=lambda k: -per_gpu[k][i]) for i in (0, 1, 2)]
        lines.append(f"per-GPU ordering, measured: {' > '.join(order[0])}; simulated: {' > '.join(order[1])} "
                     f"({'the same' if order[0] == order[1] else 'DIFFERENT'}); as the runs: {' > '.join(order[2])} "
                     f"({'the same' if order[0] == order[2] else 'DIFFERENT'})")
    return "\n".join(lines)


def _error(sim: float | None, meas: float | None) -> str:
    return f" ({(sim - meas) / meas * 100:+.0f}%)" if sim is not None and meas is not None else ""


def replayed_plan(rows: list[dict[str, Any]]) -> str:
    """The planner's answer read off the replays of the runs given, as the measured one is read off the runs:
    attainment pooled by rate (weighted by requests), the crossing of 90% interpolated."""
    by: dict[float, list[tuple[int, float, float]]] = {}
    for r in rows:
        by.setdefault(round(r["rate_rps"], 1), []).append((r["num_requests"], r["measured"]["attainment"],
                                                           r["simulated"]["attainment"]))
    rates = sorted(by)

    def pooled(i: int) -> list[float]:
        return [sum(x[0] * x[i] for x in by[k]) / sum(x[0] for x in by[k]) for k in rates]
    meas, sim = (crossing_rate(rates, pooled(i), PLAN_TARGET) for i in (1, 2))

    def cell(x: float | None) -> str:
        return f"{x:.2f}" if x is not None else f"< {rates[0]:g}"
    err = _error(sim, meas)
    return (f"read off the replays of these runs instead (their own arrivals and lengths, pooled by rate): "
            f"highest rate at >= {PLAN_TARGET:g}%: measured {cell(meas)}, simulated {cell(sim)}{err}")


def gap_table(rows: list[dict[str, Any]]) -> str:
    """Per run, measured less simulated TPOT (median, ms) by answer length: level across the columns, the
    simulator misses a cost every step pays; falling, one paid once a request."""
    bins = [b["tokens_after_first"] for r in rows for b in r["tpot_gap_by_output_len"]]
    cols = sorted({tuple(b) for b in bins}, key=lambda b: b[0])
    names = [f"{lo}-{hi - 1}" if hi else f">={lo}" for lo, hi in cols]
    lines = ["TPOT measured - simulated, median ms, by tokens after the first (requests in the bin)",
             f"{'run':28s} " + " ".join(f"{n:>14s}" for n in names)]
    for r in rows:
        by = {tuple(b["tokens_after_first"]): b for b in r["tpot_gap_by_output_len"]}
        cells = [f"{by[c]['gap_ms']:+8.1f} ({by[c]['num_requests']:3d})" if c in by else f"{'-':>14s}" for c in cols]
        lines.append(f"{r['run']:28s} " + " ".join(cells))
    return "\n".join(lines)


def _published_builder(setup: str, profile: str, data: Path, overhead_s: float, prefill_host: bool = False
                       ) -> ScaledBuilder:
    """The setup's fleet at a prefill scale and a KV blocks scale, with the host costs asked for."""
    return lambda prefill, kv: lambda host: setup_fleet(setup, profile, data, overhead_s, host, prefill_host, prefill,
                                                        kv)


def _consistency(args: argparse.Namespace, runs: list[Run], calibration_runs: list[Run], base: CostProfile
                 ) -> dict[str, dict[str, Any]]:
    """Whether the runs agree with each other (co-located setups: `run_consistency`), printed; per run, its
    decode step against the median run's at the same batch."""
    if args.setup == "distserve-c21d11":
        return {}
    every = list({r.name: r for r in (*calibration_runs, *runs)}.values())
    if len(every) < 2:
        return {}
    speeds = run_speeds(every, base, "vllm-v0" if args.setup == "vllm" else args.scheduler or "chunked")
    print("\n".join(describe(speeds)))
    print()
    return {s.name: {"offset_pct": None if s.offset is None else s.offset * 100,
                     "offset_sd_pct": None if s.offset_sd is None else s.offset_sd * 100, "differs": s.flagged}
            for s in speeds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", required=True, choices=(*SETUPS, "custom"),
                   help="a published setup, or custom: the engine from the flags below")
    p.add_argument("--profile", required=True, metavar="roofline|fitted|FILE",
                   help="fitted (DistServe's step-time fits; published setups), roofline (from the specs), or a "
                        "profile file or name as --simulate --profile takes")
    p.add_argument("runs", nargs="+", metavar="RUN.jsonl")
    p.add_argument("--json", required=True, metavar="OUT.json", help="where the per-run figures go")
    p.add_argument("--data", default=str(DATA), metavar="DIR",
                   help="the folder with DistServe's profiler files and opt-13b-config.json (default: %(default)s)")
    p.add_argument("--host-overhead-ms", type=float, default=0.0, metavar="MS",
                   help="a diagnosis: every simulated step MS longer (host work outside the profile's forward "
                        "pass); 0, the default, is the profile as it is, and the only setting the targets are for")
    p.add_argument("--calibrate-on", nargs="+", default=None, metavar="RUN.jsonl",
                   help="first fit the profile's host costs (a fixed cost a step, a cost per sequence) on these "
                        "runs, then replay the positional runs with them")
    p.add_argument("--fit-prefill", action="store_true",
                   help="with --calibrate-on: fit the profile's prefill price (a scale on its per-token terms) "
                        "beside the host costs")
    p.add_argument("--fit-kv", action="store_true",
                   help="with --calibrate-on: fit the served engine's KV blocks too (a scale on the setup's)")
    p.add_argument("--gaps", action="store_true",
                   help="also each run's TPOT gap (measured - simulated) by answer length: whether what the "
                        "simulator misses is paid every step or once a request")
    p.add_argument("--plan", action="store_true",
                   help="also the planner's answer (highest rate at >= 90%% attainment, per GPU) for both setups, "
                        "from simulation alone, beside the measured one (reads --data's runs/)")
    add_custom_arguments(p)
    args = p.parse_args(argv)
    if not 0 <= args.host_overhead_ms < float("inf"):
        print(f"error: --host-overhead-ms must be a number >= 0 (got {args.host_overhead_ms})", file=sys.stderr)
        return 2
    if args.setup != "custom" and custom_flags_given(args):
        print(f"error: {custom_flags_given(args)[0]} is for --setup custom (--setup {args.setup} runs the engine "
              "its measured server ran)", file=sys.stderr)
        return 2
    data = Path(args.data)
    needed = ["opt-13b-config.json", "profiler-a100-80g.vllm.json", "profiler-a100-80g.distserve.json"]
    missing = [n for n in needed if not (data / n).is_file()]
    if missing and args.setup != "custom":
        print(f"error: --data {data}: lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.plan and args.setup == "custom":
        print("error: --plan is for the published setups (it reads --data's runs of both)", file=sys.stderr)
        return 2
    try:
        runs = [read_run(f) for f in args.runs]  # a bad run file is named before any profile is built
        calibration_runs = [read_run(f) for f in args.calibrate_on or ()]
        if args.setup == "custom":
            base, scaled = custom_builder(args)
        else:
            system = "vllm" if args.setup == "vllm" else "distserve"
            base = cost_profile(args.profile, system, 1, data)
            scaled = _published_builder(args.setup, args.profile, data, args.host_overhead_ms / 1e3)
        build = scaled(1.0, 1.0)
        consistency = _consistency(args, runs, calibration_runs, base)
        host, prefill_scale, kv_scale = NO_HOST, 1.0, 1.0
        if calibration_runs:
            cal = calibrate_runs(calibration_runs, base, build, fit_all=True, scaled=scaled,
                                 fit_prefill=args.fit_prefill, fit_kv=args.fit_kv)
            if args.setup == "distserve-c21d11" and not args.host_overhead_ms:
                # the host costs on the prefill instance too, fitted the same way: the lower loss is kept
                both = _published_builder(args.setup, args.profile, data, 0.0, prefill_host=True)
                cal_both = calibrate_runs(calibration_runs, base, both(1.0, 1.0), fit_all=True, scaled=both,
                                          fit_prefill=args.fit_prefill, fit_kv=args.fit_kv)
                print(f"host costs on the decode instance: loss a request {cal.fit.loss:.4f}; on both instances: "
                      f"{cal_both.fit.loss:.4f}; kept: {'both' if cal_both.fit.loss < cal.fit.loss else 'decode'}")
                if cal_both.fit.loss < cal.fit.loss:
                    cal, scaled = cal_both, both
            prefill_scale, kv_scale = cal.fit.prefill_scale, cal.fit.kv_scale
            build = scaled(prefill_scale, kv_scale)
            host = (cal.fit.step_s, cal.fit.per_seq_s, cal.fit.request_overhead_s)
            print(f"calibration of the {args.profile} profile's host costs on {len(args.calibrate_on)} runs")
            print_calibration(cal)
            print()
        label = args.profile if host == NO_HOST else f"{args.profile}+calibrated"
        rows = []
        for run in runs:
            row = compare(run, args.setup, label, data, args.host_overhead_ms / 1e3, host, build)
            row["host_costs_ms"] = [host[0] * 1e3, host[1] * 1e3]
            row["request_overhead_ms"] = host[2] * 1e3
            row["prefill_scale"] = prefill_scale
            row["kv_blocks_scale"] = kv_scale
            row["targets_met"] = targets_met(row)
            if run.name in consistency:
                row["decode_speed_vs_other_runs"] = consistency[run.name]
            rows.append(row)
    except (SpecError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    extra = f", every step {args.host_overhead_ms:g} ms longer (diagnosis)" if args.host_overhead_ms else ""
    print(f"{args.setup}, {label} profile{extra} ({dt.date.today().isoformat()}): measured vs simulated")
    print(table(rows))
    for r in rows:
        if r["num_failed_simulated"]:
            print(f"note: {r['run']}: {r['num_failed_simulated']} requests the simulated engine refused (longer than "
                  "the model's context or a step's budget); counted as not attained")
    met = sum(all(r["targets_met"].values()) for r in rows)
    print(f"{met} of {len(rows)} runs meet every target")
    if args.setup != "custom" and not args.host_overhead_ms:  # the headline: fitted profiles, as they are
        key = "vllm" if args.setup == "vllm" else "distserve"
        differ = {"vllm_runs_differ": sum(c["differs"] for c in consistency.values())} if consistency else {}
        if args.profile == "fitted" and host == NO_HOST:
            write_result("validate_published", {f"{key}_within_3": sum(r["targets_met"]["attainment"] for r in rows),
                                                f"{key}_runs": len(rows), **differ}, part=True)
        elif args.profile == "fitted":
            write_result("validate_published", {
                f"{key}_calibrated_within_3": sum(r["targets_met"]["attainment"] for r in rows),
                f"{key}_calibrated_every_target": met}, part=True)
    if args.gaps:
        print()
        print(gap_table(rows))
    if args.plan:
        try:
            print()
            print(plan_section(data, args.profile, {args.setup: host} if host != NO_HOST else None,
                               {args.setup: build} if host != NO_HOST else None))
            print(replayed_plan(rows))
        except (SpecError, ConfigError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
