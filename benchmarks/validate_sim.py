"""Calibrated simulation vs measurement, on the CPU reference engine (or llama.cpp's server) over HTTP.

Starts the engine `slobench demo` starts, calibrates it as `slobench calibrate` does (probes, then unless
`--no-refine` each workload refined on its own shape with other requests, `--refine-seed` 1), finds each
workload's knee in simulation, and at five rates sends the same requests twice: measured over HTTP and
simulated with the calibrated profile, its request overhead and noise, and the engine's limits. Prints
attainment and TTFT/TPOT p50/p90 of each against the targets (3 points, 10%). 200 requests a point: with
50, one request is 2 attainment points. `--repeat` measures each point twice (the server against itself);
the engine's step log and windows.json feed benchmarks/speed_drift.py. Figures: docs/measurements/validate_sim.md.

    python benchmarks/validate_sim.py [--repeat] [--no-refine] [--profile cal.json] [--server llamacpp]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from result_json import write_result  # this folder is on sys.path

from reference_engine.executor.modeled_executor import CostProfile
from reference_engine.step_log import machine_speed, read_step_log
from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.cli import main as cli
from slobench.cli.engine import demo_engine_args
from slobench.run.rundir import load_run

# a second shape beside the bundled `tiny`: prompts 4x longer, short answers (prefill-bound, TTFT-bound)
PREFILL_HEAVY = """\
name = "prefill-heavy"
description = "Longer prompts, short answers (128-512 prompt, 4-24 output) for the tiny CPU engine"
api = "completions"
prompt = "tokens"
num_requests = 64
token_ids = [32, 256]

[arrival]
process = "poisson"
rate_rps = 1.0

[input]
dist = "uniform"
min = 128
max = 512

[output]
dist = "uniform"
min = 4
max = 24
"""
# the refinement's workload: the span of both validated shapes, neither of them (see the module's doc)
REFINE_MIX = """\
name = "refine-mix"
description = "Prompts 32-512, outputs 4-64: what validate_sim refines on, apart from what it validates"
api = "completions"
prompt = "tokens"
num_requests = 100
token_ids = [32, 256]

[arrival]
process = "poisson"
rate_rps = 2.0

[input]
dist = "uniform"
min = 32
max = 512

[output]
dist = "uniform"
min = 4
max = 64
"""
SLOS = {"tiny": "ttft=300ms,tpot=40ms,target=0.9", "prefill-heavy": "ttft=600ms,tpot=60ms,target=0.9"}
# llama.cpp (llama-cpp-python's server, the conformance suite's tiny GGUF model, one thread) serves one request
# at a time: a request decodes alone (TPOT ~1.2 ms whatever the load) and the knee is its TTFT, the queue
LLAMACPP_SLOS = {"tiny": "ttft=60ms,tpot=5ms,target=0.9", "prefill-heavy": "ttft=120ms,tpot=5ms,target=0.9"}
# the server validated: the bundled engine (default) or llama.cpp (`--server llamacpp`), its model name and the
# limits the simulation shares with it (llama.cpp: one sequence, its 2,048-token context, 512-token batches)
SERVER: dict[str, Any] = {"name": "engine", "model": "tiny", "limits": None, "slos": SLOS}
LLAMACPP_LIMITS = {"--kv-blocks": "128", "--max-num-seqs": "1", "--max-batched-tokens": "512"}
RATE_FACTORS = (0.3, 0.6, 0.9, 1.3, 2.0)  # of the simulated knee: light to well past it


def quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli(argv)


def engine_flags(extras: tuple[str, ...] = ()) -> list[str]:
    """The simulated engine's limits, those of the served one (`demo_engine_args("torch")`), and `extras`
    (`--jitter 0`, `--request-overhead 0`: without them `--simulate` applies the calibrated profile's)."""
    flags = list(extras)
    if SERVER["limits"] is not None:
        for k, v in SERVER["limits"].items():
            flags += [k, v]
        return flags
    args = demo_engine_args("torch")
    for k in ("--kv-blocks", "--max-num-seqs"):
        flags += [k, args[args.index(k) + 1]]
    return flags


def engine_limits() -> Any:
    from slobench.profiles.refine import EngineLimits

    flags = engine_flags()
    budget = int(flags[flags.index("--max-batched-tokens") + 1]) if "--max-batched-tokens" in flags else 2048
    return EngineLimits(kv_blocks=int(flags[flags.index("--kv-blocks") + 1]),
                        max_num_seqs=int(flags[flags.index("--max-num-seqs") + 1]), max_batched_tokens=budget)


def probe_fit(url: str, out: Path) -> tuple[Any, CostProfile]:
    """calibrate's first stage, the designed probes: the fit, and the profile with its provenance (written
    to `out`/calibrated.json, what `--no-refine` validates)."""
    from slobench.profiles.calibrate import ProbePlan, calibrate, print_table, with_provenance

    t0 = time.monotonic()
    plan = ProbePlan()
    cal = asyncio.run(calibrate(url, SERVER["model"], plan))
    print_table(cal)
    for note in cal.notes:
        print(f"note: {note}")
    profile = with_provenance(cal, url, SERVER["model"], plan)
    (out / "calibrated.json").write_text(profile.to_json() + "\n")
    print(f"probes fitted in {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    return cal, profile


def refined(url: str, args: argparse.Namespace, cal: Any, profile: CostProfile, workload: str, path: Path) -> Path:
    """calibrate's second stage on `workload` (seed --refine-seed): the refined profile, written to `path`. The
    wall-clock window of its served load is kept (`REFERENCE`): the machine's speed then is the profile's."""
    from slobench.profiles.refine import (
        RefinePlan,
        live_setup,
        print_refinement,
        refine_live,
        with_refinement,
    )

    t0 = time.monotonic()
    rates = tuple(float(x) for x in args.refine_rates.split(",")) if args.refine_rates else None
    rplan = RefinePlan(workload, rates, args.refine_requests, args.refine_seed, engine_limits(),
                       by_prompt_length=args.ttft_by_prompt_length, fit_overhead=not args.hold_overhead,
                       fit_inside=args.fit_inside)
    print(f"refining on served load: {rplan.workload}, seed {rplan.seed}, {rplan.num_requests} requests a rate, "
          f"o {'fitted' if rplan.fit_overhead else 'held'}{', TTFT by prompt length' if rplan.by_prompt_length else ''}"
          f"{', r inside fitted' if rplan.fit_inside else ''} "
          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    w0 = time.time()
    ref = asyncio.run(refine_live(live_setup(url, SERVER["model"], rplan), cal.profile, cal.request_overhead_s, rplan,
                                  write=lambda line: print(line, flush=True)))
    REFERENCE[path] = (w0, time.time())
    print_refinement(ref)
    path.write_text(with_refinement(profile, ref).to_json() + "\n")
    print(f"refined in {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.1f}) -> {path}", flush=True)
    return path


# the machine's speed (reference_engine.step_log): the wall-clock windows of each profile's refinement, whose
# steps set the speed the profile describes; each measured run's steps are scored against a model fitted on them
REFERENCE: dict[Path, tuple[float, float]] = {}


def run_speed(step_log: Path | None, window: tuple[float, float], reference: tuple[float, float] | None) -> float | None:
    """How much slower (>1) the engine's steps ran in `window` than in `reference` (reference_engine.step_log's
    machine_speed: a step-time model fitted on the reference's steps scores both). None without a step log
    (llama.cpp) or a reference window (`--profile` given)."""
    if step_log is None or reference is None:
        return None
    rows = read_step_log(step_log)
    return machine_speed(rows.between(*reference), rows.between(*window))


def at_speed(prof_path: Path, speed: float, out: Path) -> Path:
    """The profile with every step coefficient and its request overhead `o` times `speed`, written to `out`."""
    prof = CostProfile.load(prof_path)
    prov = dict(prof.provenance or {})
    if "request_overhead_s" in prov:
        prov["request_overhead_s"] = float(prov["request_overhead_s"]) * speed
    prov["machine_speed"] = speed
    out.write_text(dataclasses.replace(prof.scaled(speed), provenance=prov).to_json() + "\n")
    return out


def fitted_on(prof: CostProfile) -> str:
    """What the profile was fitted on, from its provenance: printed beside the table, so that nobody reads
    an in-sample row as a held-out one."""
    prov = prof.provenance or {}
    ref = prov.get("refinement")
    if not ref:
        return f"probes of the idle server only ({prov.get('date', 'date unknown')})"
    rates = ", ".join(f"{r:.3g}{' (held out)' if r == ref['held_out_rate_rps'] else ''}" for r in ref["rates_rps"])
    return (f"probes of the idle server, then served load of {ref['workload']} (seed {ref['seed']}, "
            f"{ref['num_requests']} requests a rate) at {rates} req/s; factors "
            + ", ".join(f"{k} x{v:.3g}" for k, v in ref["factors"].items())
            + f"; step-time noise sd {ref.get('step_jitter_sd', 0.0):.2f}")


PERCENTILES = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
TARGET_POINTS, TARGET_REL = 3.0, 0.10  # the targets: attainment within 3 points, each percentile within 10%


def judge(records: list[Any], slo: SLO) -> dict[str, Any]:
    """Attainment and TTFT/TPOT p50/p90 of a run's records, as the summary computes them."""
    s = summarize(records, slo, intervals=False)  # the values alone: no bootstrap
    assert s.attainment is not None  # an SLO was given
    return {"attainment": s.attainment.value, "ttft_p50": s.ttft.p50, "ttft_p90": s.ttft.p90,
            "tpot_p50": s.tpot.p50, "tpot_p90": s.tpot.p90, "num_ok": s.num_ok}


def load_and_judge(run_dir: Path, slo: SLO) -> dict[str, Any]:
    records = load_run(run_dir).records
    cached = sum(r.cached_tokens or 0 for r in records)
    if cached:  # the simulation starts with a cold cache: this run's prompts were served from an earlier one's
        prompt = sum(r.prompt_tokens or r.input_tokens or 0 for r in records)
        print(f"warning: {run_dir}: the server served {cached / max(prompt, 1):.0%} of the prompt tokens from its prefix "
              "cache, warm from an earlier run of the same requests (too few requests a point to cycle it); "
              "the simulation starts cold, so this row compares unlike things", flush=True)
    return judge(records, slo)


def within_target(m: dict[str, Any], s: dict[str, Any]) -> dict[str, bool]:
    """Which of attainment and the four percentiles of `s` are within the targets of `m`'s."""
    ok = {"attainment": abs(s["attainment"] - m["attainment"]) * 100 <= TARGET_POINTS}
    for key in PERCENTILES:
        mv, sv = m[key], s[key]
        ok[key] = mv is not None and sv is not None and abs(sv - mv) <= TARGET_REL * mv
    return ok


def run_args(workload: str, rate: float, n: int, seed: int, slo: str, out: Path) -> list[str]:
    return ["run", "--workload", workload, "--rate", f"{rate:.4g}", "--num-requests", str(n), "--seed", str(seed),
            "--slo", slo, "--out", str(out), "--overwrite", "--no-progress", "--scrape-interval", "0"]


def knee(workload: str, profile: Path, n: int, seed: int, slo: str, out: Path, extras: tuple[str, ...]) -> float:
    """The highest rate, on a x1.2 grid, up to which the simulation meets the SLO's target."""
    target = SLO.parse(slo).target
    rate, best = 0.25, 0.25
    while rate < 200:
        d = out / f"knee-{rate:.4g}"
        quiet(run_args(workload, rate, n, seed, slo, d)
              + ["--simulate", "--profile", str(profile), *engine_flags(extras)])
        att = json.loads((d / "summary.json").read_text())["attainment"]["value"]
        if att < target:
            break
        best = rate
        rate *= 1.2
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tiny,prefill-heavy")
    ap.add_argument("--rates", default=None, help="comma-separated req/s for every workload (default: from the knee)")
    ap.add_argument("--num-requests", type=int, default=200, help="requests a point (default 200; see the doc)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, help="a calibrated profile JSON (default: calibrate now)")
    ap.add_argument("--no-overhead", action="store_true", help="do not add calibrate's request overhead to TTFT")
    ap.add_argument("--no-jitter", action="store_true", help="simulate without calibrate's step-time noise")
    ap.add_argument("--no-refine", action="store_true", help="calibrate with the probes only")
    ap.add_argument("--refine-workload", default="each",
                    help="what the refinement runs: each (default: every validated workload refined on its own shape, "
                         "other requests (--refine-seed), its own knee's rates), mix (refine-mix, written here, "
                         "validated nowhere, one profile for all), or a workload name or TOML for all")
    ap.add_argument("--refine-rates", default=None, help="req/s, at least 3 (default: 0.5/0.8/1.1 x its knee)")
    ap.add_argument("--refine-requests", type=int, default=200)
    ap.add_argument("--refine-seed", type=int, default=1, help="default 1: other requests than the validated ones")
    ap.add_argument("--hold-overhead", action="store_true", help="the refinement keeps the probes' o (fit_overhead=False)")
    ap.add_argument("--ttft-by-prompt-length", action="store_true",
                    help="the refinement also fits the TTFT of each half of the prompts (by_prompt_length=True)")
    ap.add_argument("--fit-inside", action="store_true",
                    help="the refinement also fits a request cost inside the server (RefinePlan.fit_inside)")
    ap.add_argument("--repeat", action="store_true",
                    help="measure each point a second time, right after the first: how often the server agrees "
                         "with itself within the targets is the most any simulation can score here")
    ap.add_argument("--server", choices=("engine", "llamacpp"), default="engine",
                    help="engine: the bundled CPU engine (default); llamacpp: llama-cpp-python's server on the "
                         "conformance suite's tiny GGUF model (needs .ci/conformance-deps.sh)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.server == "llamacpp":
        SERVER.update(name="llamacpp", model="tiny-gguf", limits=LLAMACPP_LIMITS, slos=LLAMACPP_SLOS)
    out = Path(args.out or f"runs/validate-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefill-heavy.toml").write_text(PREFILL_HEAVY)
    (out / "refine-mix.toml").write_text(REFINE_MIX)
    workloads = {w: (str(out / "prefill-heavy.toml") if w == "prefill-heavy" else w) for w in args.workloads.split(",")}
    refine_on = {"mix": str(out / "refine-mix.toml")}.get(args.refine_workload, args.refine_workload)
    from slobench.testing.process import EngineServerProcess

    t_start = time.monotonic()
    loads = [os.getloadavg()[0]]
    served = ("llama-cpp-python's server, tiny GGUF, 1 thread" if args.server == "llamacpp" else
              f"engine: {' '.join(demo_engine_args('torch'))}, 1 torch thread")
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()}; {served}", flush=True)
    rows = []
    again: list[tuple[str, float, dict[str, Any], dict[str, Any]]] = []  # (name, rate, measured, measured again)
    # the engine logs its steps (reference_engine.step_log): the machine's speed during each run, beside the profile's
    step_log = None if args.server == "llamacpp" else out / "steps.jsonl"
    server = (llamacpp_server(out) if args.server == "llamacpp" else
              EngineServerProcess(*demo_engine_args("torch"), "--step-log", str(step_log), torch_threads=1))
    at_speed_rows: list[tuple[str, float, dict[str, Any], dict[str, Any]]] = []
    speeds: list[tuple[str, float, float | None, float | None]] = []  # (name, rate, speed, speed again)
    windows: dict[str, tuple[float, float]] = {}  # each measured run's wall-clock window (windows.json)
    with server as srv:
        if args.profile:
            paths = dict.fromkeys(workloads, Path(args.profile))
        else:
            cal, base = probe_fit(srv.base_url, out)
            if args.no_refine:
                paths = dict.fromkeys(workloads, out / "calibrated.json")
            elif refine_on == "each":
                paths = {n: refined(srv.base_url, args, cal, base, wl, out / f"calibrated-{n}.json")
                         for n, wl in workloads.items()}
            else:
                one = refined(srv.base_url, args, cal, base, refine_on, out / "calibrated-refined.json")
                paths = dict.fromkeys(workloads, one)
        # `--simulate` applies the calibrated profile's o and noise itself (slobench.fleet.simulate); these say so
        extras = (("--request-overhead", "0") if args.no_overhead else ()) + (("--jitter", "0") if args.no_jitter else ())
        fitted: dict[str, str] = {}
        in_sample = []
        for name, wl in workloads.items():
            prof_path = paths[name]
            prof = CostProfile.load(prof_path)
            overhead_s = 0.0 if args.no_overhead else float((prof.provenance or {}).get("request_overhead_s", 0.0))
            jitter_sd = 0.0 if args.no_jitter else float((prof.provenance or {}).get("step_jitter_sd", 0.0))
            ref = (prof.provenance or {}).get("refinement") or {}
            if Path(str(ref.get("workload"))).stem == name and ref.get("seed") == args.seed:
                in_sample.append(name)
                print(f"warning: {name} with seed {args.seed} is what the refinement ran: its rows share requests "
                      "with the fit (in sample)", flush=True)
            fitted[name] = (f"{fitted_on(prof)}; o {overhead_s * 1e3:.1f} ms added to simulated TTFT, step-time noise "
                            f"sd {jitter_sd:.2f}")
            print(f"{name}: fitted on {fitted[name]}", flush=True)
            slo_text = SERVER["slos"].get(name, SERVER["slos"]["tiny"])
            slo = SLO.parse(slo_text)
            if args.rates:
                rates = [float(x) for x in args.rates.split(",")]
            else:
                k = knee(wl, prof_path, args.num_requests, args.seed, slo_text, out / name, extras)
                rates = [k * f for f in RATE_FACTORS]
                print(f"{name}: simulated knee {k:.2f} req/s ({slo_text}); rates {', '.join(f'{r:.2f}' for r in rates)}; "
                      f"~{sum(args.num_requests / r for r in rates):.0f} s of arrivals", flush=True)
            for rate in rates:
                common = run_args(wl, rate, args.num_requests, args.seed, slo_text, out / name / f"measured-{rate:.4g}")
                t0, w0 = time.monotonic(), time.time()
                quiet([*common, "--url", srv.base_url, "--model", SERVER["model"]])
                speed = run_speed(step_log, (w0, time.time()), REFERENCE.get(prof_path))
                windows[f"{name}/measured-{rate:.4g}"] = (w0, time.time())
                loads.append(os.getloadavg()[0])
                sim_dir = out / name / f"simulated-{rate:.4g}"
                quiet([*run_args(wl, rate, args.num_requests, args.seed, slo_text, sim_dir), "--simulate", "--profile",
                       str(prof_path), *engine_flags(extras)])
                m = load_and_judge(out / name / f"measured-{rate:.4g}", slo)
                s = load_and_judge(sim_dir, slo)
                rows.append((name, rate, m, s))
                if speed is not None:  # the same simulation, on a machine as fast as this run's
                    sp_dir = out / name / f"simulated-at-speed-{rate:.4g}"
                    sp_prof = at_speed(prof_path, speed, out / name / f"profile-at-speed-{rate:.4g}.json")
                    quiet([*run_args(wl, rate, args.num_requests, args.seed, slo_text, sp_dir), "--simulate",
                           "--profile", str(sp_prof), *engine_flags(extras)])
                    at_speed_rows.append((name, rate, m, load_and_judge(sp_dir, slo)))
                speed2 = None
                if args.repeat:
                    d2 = out / name / f"measured-again-{rate:.4g}"
                    w0 = time.time()
                    quiet([*run_args(wl, rate, args.num_requests, args.seed, slo_text, d2), "--url", srv.base_url,
                           "--model", SERVER["model"]])
                    speed2 = run_speed(step_log, (w0, time.time()), REFERENCE.get(prof_path))
                    windows[f"{name}/measured-again-{rate:.4g}"] = (w0, time.time())
                    loads.append(os.getloadavg()[0])
                    again.append((name, rate, m, load_and_judge(d2, slo)))
                (out / "windows.json").write_text(json.dumps(  # for offline reading of steps.jsonl
                    {"refinements": {p.name: w for p, w in REFERENCE.items()}, "runs": windows}, indent=1) + "\n")
                speeds.append((name, rate, speed, speed2))
                print(f"  {name} {rate:.2f} req/s measured in {time.monotonic() - t0:.0f} s (load {loads[-1]:.1f}"
                      + (f", steps x{speed:.3f} the refinement's" if speed is not None else "")
                      + (f", again x{speed2:.3f}" if speed2 is not None else "")
                      + f"): attainment {m['attainment']:.0%} vs simulated {s['attainment']:.0%}", flush=True)
    hits = {"calibrated": print_rows(rows)}
    if again:
        print("\nThe same requests measured a second time, right after the first (the server against itself):")
        hits["self"] = print_rows(again, "meas / again")
        print("\nThe simulation against the second measurement:")
        print_rows([(n, r, a, s[3]) for (n, r, _, a), s in zip(again, rows, strict=True)], "again / sim")
    if at_speed_rows:
        print("\nThe engine's steps during each measured run, against the refinement's (both scored on the profile, "
              "reference_engine.step_log):")
        for name, rate, sp, sp2 in speeds:
            print(f"  {name} {rate:.2f} req/s: x{sp:.3f}" + (f", again x{sp2:.3f}" if sp2 is not None else "")
                  if sp is not None else f"  {name} {rate:.2f} req/s: n/a")
        print("\nThe simulation with the profile scaled to the machine's speed during each run (one number a run, "
              "from the run's own steps: a diagnosis of the misses above, not a prediction):")
        hits["told_speed"] = print_rows(at_speed_rows, "meas / sim@speed")
        print(f"(second by second, and a forecast from the run before: python benchmarks/speed_drift.py {out})")
    for name, text in fitted.items():
        print(f"\n{name}: fitted on {text}")
    print(f"validated: {', '.join(workloads)} with seed {args.seed}, {args.num_requests} requests a point"
          + (f" (in sample: {', '.join(in_sample)})" if in_sample else " (none of them in the fit)"))
    print(f"wall {time.monotonic() - t_start:.0f} s; 1-minute load average during the measured runs "
          f"{min(loads):.1f}-{max(loads):.1f} (2 cores); run directories under {out}")
    if args.server == "engine":  # the headline is the bundled engine's; one validation: each range is one value
        write_result("validate_sim", {"comparisons": len(rows) * (1 + len(PERCENTILES)),
                                      **{f"{k}_{end}": n for k, n in hits.items() for end in ("min", "max")}})


@contextlib.contextmanager
def llamacpp_server(out: Path) -> Any:
    """llama-cpp-python's server on 127.0.0.1 with the conformance suite's tiny GGUF model, as a user would
    serve it (`--interrupt_requests False`: a new request does not cut the one in progress off)."""
    import socket
    import subprocess
    import sys
    import types

    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "conformance"))
    from tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(out / "tiny.gguf")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias",
                             "tiny-gguf", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                             "--n_threads", "1", "--interrupt_requests", "False"],
                            stdout=subprocess.DEVNULL, stderr=open(out / "llamacpp.log", "w"))  # noqa: SIM115
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp server did not start: see {out / 'llamacpp.log'}")
            time.sleep(0.2)
        yield types.SimpleNamespace(base_url=base)
    finally:
        proc.terminate()
        proc.wait(10)


def _err(m: float | None, s: float | None) -> str:
    if m is None or s is None:
        return "n/a"
    return f"{(s - m) / m:+.0%}"


def print_rows(rows: list[tuple[str, float, dict[str, Any], dict[str, Any]]], label: str = "meas / sim") -> int:
    """A markdown table of (workload, rate, reference, compared) and the count within target, returned."""
    print(f"\n| workload | rate req/s | attainment {label} (Δ pts) | TTFT p50 ms {label} (err) | TTFT p90 | "
          "TPOT p50 ms | TPOT p90 |")
    print("|---|---|---|---|---|---|---|")
    hits = total = 0
    for name, rate, m, s in rows:
        ok = within_target(m, s)
        hits += sum(ok.values())
        total += len(ok)
        d_att = (s["attainment"] - m["attainment"]) * 100
        cells = [f"{m['attainment']:.0%} / {s['attainment']:.0%} ({d_att:+.0f}{'' if ok['attainment'] else ' ✗'})"]
        for key in PERCENTILES:
            mv, sv = m[key], s[key]
            fm = "n/a" if mv is None else f"{mv * 1e3:.{1 if mv < 0.01 else 0}f}"
            fs = "n/a" if sv is None else f"{sv * 1e3:.{1 if sv < 0.01 else 0}f}"
            cells.append(f"{fm} / {fs} ({_err(mv, sv)}{'' if ok[key] else ' ✗'})")
        print(f"| {name} | {rate:.2f} | " + " | ".join(cells) + " |")
    print(f"\n{hits} of {total} comparisons within target (attainment ±3 points, percentiles ±10%)")
    return hits


if __name__ == "__main__":
    main()
