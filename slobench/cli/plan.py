"""The `slobench plan` verb: a fleet plan for a day of traffic (slobench.fleet.plan), written as plan.json and
plan.html, with a terminal table comparing it to static fleets and an interpolation planner."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from reference_engine.config import SCHEDULERS
from reference_engine.executor.modeled_executor import CostProfile
from reference_engine.serve_args import served_kv_blocks, served_max_num_seqs
from slobench.analysis.slo import SLO
from slobench.errors import SpecError, UsageError
from slobench.fleet.disagg import KVLink, kv_bytes_per_token
from slobench.fleet.plan import PlanOptions, Setup, plan_day
from slobench.fleet.plan_day import DayRecipe
from slobench.fleet.plan_pool import PlanPool, windows_for
from slobench.fleet.plan_progress import PlanProgress
from slobench.fleet.routing import ROUTERS
from slobench.fleet.simulate import ModeledEngine
from slobench.load_setup import calibrated_flags
from slobench.report.plan_page import write_plan_page
from slobench.run.outdir import new_out_dir
from slobench.workload import load_workload
from slobench.workload.bundled import trace_path

# Bundled days compressed in time: one workload second stands for this many seconds of the day.
DAY_COMPRESSION = {"day": 60.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|m|min|h)?\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
BASELINES = ("static-colocated", "static-disagg", "dynamo")
PLAN_MAX_NUM_SEQS = 128  # `plan --max-num-seqs` when the profile names no served limit


def parse_span_s(text: str, flag: str, *, allow_zero: bool = False) -> float:
    """`15m`, `1h`, `90s`, `90` (seconds)."""
    m = _DURATION.match(str(text))
    if m is None:
        raise UsageError(f"{flag}: expected a duration like 15m, 1h or 90s (got {text!r})")
    v = float(m.group(1)) * _UNIT_S[(m.group(2) or "s").lower()]
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise UsageError(f"{flag}: must be {'>= 0' if allow_zero else '> 0'} (got {text!r})")
    return v


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.epilog = f"{p.epilog}\nplan exits 1 when the plan misses the SLO target in some window."
    day = p.add_argument_group("the day")
    day.add_argument("--workload", default=None, help="a bundled workload (day) or a spec .toml")
    day.add_argument("--trace", action="append", default=None, metavar="FILE",
                     help="a trace (repeat to interleave several, e.g. the Azure 2023 code and conversation traces)")
    day.add_argument("--rate", type=float, default=None, help="spec: rescale every hour to this mean rate (req/s)")
    day.add_argument("--time-scale", type=float, default=None, metavar="K", help="trace: multiply its times by K")
    day.add_argument("--compression", type=float, default=None, metavar="K",
                     help="seconds of the day one workload second stands for (default: 60 for the bundled day, "
                          "1 otherwise)")
    day.add_argument("--window", default="1h", help="the planning window, in day time (default 1h; e.g. 15m)")
    day.add_argument("--max-requests", type=int, default=2000, metavar="N",
                     help="requests a window's evaluation simulates at most: a stretch from its middle (default "
                          "2000). Keep the stretch several requests' durations long, or no queue builds up in it")
    day.add_argument("--lead-in", default=None, metavar="S",
                     help="workload seconds of traffic before each sample, simulated but not counted (default: a "
                          "quarter of the sample)")
    day.add_argument("--seed", type=int, default=0)
    eng = p.add_argument_group("the instances")
    eng.add_argument("--slo", required=True, help="e.g. ttft=500ms,tpot=40ms,target=0.9")
    eng.add_argument("--profile", default="h100-llama-1b",
                     help="cost profile: a bundled name, a JSON path, or roofline:GPU/MODEL[/tpN]")
    eng.add_argument("--kv-blocks", type=int, default=None,
                     help="KV blocks an instance (default: what a roofline profile's GPU memory holds at 90%%, "
                          "else 8192)")
    eng.add_argument("--block-size", type=int, default=16)
    eng.add_argument("--max-num-seqs", type=int, default=None,
                     help=f"most requests in a batch (default: {PLAN_MAX_NUM_SEQS}, or a calibrated profile's served_max_num_seqs)")
    eng.add_argument("--max-batched-tokens", type=int, default=2048)
    eng.add_argument("--max-model-len", type=int, default=16384)
    eng.add_argument("--scheduler", choices=SCHEDULERS, default="chunked",
                     help="chunked (mixed batches, the default) or vllm-v0 (a step is whole prompts or decodes)")
    eng.add_argument("--kv-link", default="50GB/s,20us", help="prefill -> decode KV link (default 50GB/s,20us)")
    eng.add_argument("--model", default="llama-3.2-1b",
                     help="model config for KV bytes a token when the profile is not a roofline one")
    eng.add_argument("--kv-bytes-per-token", type=int, default=None, metavar="N",
                     help="KV bytes a token moves over the link (default: from the roofline profile's model or --model)")
    eng.add_argument("--router", default="least-outstanding")
    eng.add_argument("--jitter", type=float, default=None,
                     help="per-step time noise, relative sd (default: a calibrated profile's fitted noise, else 0)")
    eng.add_argument("--request-overhead", default=None, metavar="DURATION",
                     help="each request's fixed cost outside the steps, added to every time after the send, e.g. "
                          "13ms (default: a calibrated profile's fitted o, else 0)")
    pl = p.add_argument_group("the planner")
    pl.add_argument("--fleets", default="colocated,disagg",
                    help="fleet kinds searched: colocated, disagg, mixed (C beside P and D; slower)")
    pl.add_argument("--max-instances", type=int, default=32)
    pl.add_argument("--switch-cost", default="60s",
                    help="how long an instance changing role (or added) is unavailable, day time (default 60s)")
    pl.add_argument("--hold", type=int, default=2,
                    help="scale down only after this many windows in a row found a cheaper fleet (default 2)")
    pl.add_argument("--min-saving", type=int, default=1, help="instances a scale-down must save (default 1)")
    pl.add_argument("--baselines", default=",".join(BASELINES),
                    help=f"compared strategies: {', '.join(BASELINES)} or none")
    pl.add_argument("--target-scope", choices=("window", "day"), default="window",
                    help="window (default): the SLO target in every window; day: in the day's request-weighted "
                         "attainment (windows traded against each other; static fleets sized the same way)")
    pl.add_argument("--jobs", type=int, default=1, help="evaluate in N local processes (default 1)")
    pl.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    help="evaluate as Ray tasks on the cluster at ADDRESS (no address: a local Ray instance)")
    pl.add_argument("--no-progress", action="store_true",
                    help="no live line (phase, evaluations done, elapsed, estimate left): one line a phase")
    pl.add_argument("--out", default=None, help="folder for plan.json and plan.html (default runs/plan-<time>)")


def dispatch(args: argparse.Namespace) -> int:
    recipe, setup, options = _build(args)
    given = Path(args.out) if args.out else None
    if given is not None and given.exists() and not given.is_dir():
        raise UsageError(f"--out {given}: exists and is not a folder")
    assert isinstance(options, PlanOptions)
    t0 = time.perf_counter()
    windows = windows_for(recipe)
    with PlanProgress(is_live=False if args.no_progress else None) as shown, \
            PlanPool(recipe, setup, jobs=args.jobs, ray=args.ray, on_progress=shown.jobs) as pool:
        result = plan_day(pool, windows, recipe, setup, options, progress=shown.phase)
        result["run"] = {"pool": pool.kind, "wall_s": round(time.perf_counter() - t0, 1)}
    out = given or new_out_dir("plan")  # made once the plan is known, this plan's alone
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(result, indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    write_plan_page(result, out / "plan.html")
    print(plan_table(result))
    print(f"wrote {out / 'plan.json'} and {out / 'plan.html'} ({result['run']['wall_s']} s, {pool.kind})")
    planner = result["strategies"]["planner"]
    if options.target_scope == "day":
        met = planner["attainment"] >= result["slo"].get("target", 0.9) - 1e-12
    else:
        met = planner["windows_met"] == planner["num_windows"]
    return 0 if met else 1


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    if (args.workload is None) == (args.trace is None):
        raise UsageError("plan needs one of --workload or --trace")
    if args.trace is not None and args.rate is not None:
        raise UsageError("--rate applies to --workload; a trace keeps its rate (--time-scale K rescales its times)")
    if args.workload is not None and args.time_scale is not None:
        raise UsageError("--time-scale applies only to --trace")
    if args.time_scale is not None and not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise UsageError(f"--time-scale: must be > 0 (got {args.time_scale})")
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise UsageError(f"--rate: must be > 0 req/s (got {args.rate})")
    if args.ray is not None and args.jobs != 1:
        raise UsageError("--ray and --jobs conflict: Ray runs as many tasks as the cluster has CPUs")
    if args.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1 (got {args.jobs})")
    if args.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError("--ray needs Ray, which is not installed: pip install 'slobench[ray]'") from None
    slo = SLO.from_toml(args.slo) if args.slo.endswith(".toml") else SLO.parse(args.slo)
    wl = None
    if args.workload is not None:
        wl = load_workload(args.workload)
    else:
        for t in args.trace:
            if not trace_path(t).is_file():
                raise UsageError(f"--trace {t}: no such file")
    compression = args.compression
    if compression is None:
        compression = DAY_COMPRESSION.get(args.workload, 1.0) if args.workload is not None else 1.0
    if not (math.isfinite(compression) and compression > 0):
        raise UsageError(f"--compression: must be > 0 (got {compression})")
    window_s = parse_span_s(args.window, "--window")
    switch_s = parse_span_s(args.switch_cost, "--switch-cost", allow_zero=True)
    lead = parse_span_s(args.lead_in, "--lead-in", allow_zero=True) if args.lead_in is not None else None
    kinds = tuple(k.strip() for k in args.fleets.split(",") if k.strip())
    baselines = () if args.baselines.strip() == "none" else tuple(
        b.strip() for b in args.baselines.split(",") if b.strip())
    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise UsageError(f"--baselines: unknown {bad[0]!r}; choose from {', '.join(BASELINES)} or none")
    profile = CostProfile.load(args.profile)
    prov = getattr(profile, "provenance", None) or {}
    kv_blocks = args.kv_blocks
    if kv_blocks is None:  # a calibrated profile's server (the cache its runs showed), else the profile's room
        kv_blocks = served_kv_blocks(args.profile, args.block_size) or _kv_blocks(prov, args.block_size)
    max_num_seqs = args.max_num_seqs
    if max_num_seqs is None:  # a calibrated profile's server, else the planner's default
        max_num_seqs = served_max_num_seqs(args.profile) or PLAN_MAX_NUM_SEQS
    try:
        engine = ModeledEngine(profile, kv_blocks=kv_blocks, block_size=args.block_size,
                               max_num_seqs=max_num_seqs, max_batched_tokens=args.max_batched_tokens,
                               max_model_len=args.max_model_len, seed=args.seed, scheduler=args.scheduler)
        link = KVLink.parse(args.kv_link)
        options = PlanOptions(switch_s=switch_s, min_saving=args.min_saving, hold=args.hold,
                              max_instances=args.max_instances, kinds=kinds,
                              gpus_per_instance=int(prov.get("tp", 1)), baselines=baselines,
                              target_scope=args.target_scope)
        recipe = DayRecipe(workload=wl, traces=tuple(args.trace or ()), rate_rps=args.rate,
                           time_scale=args.time_scale, seed=args.seed, compression=compression, window_s=window_s,
                           lead_s=lead, max_requests=args.max_requests)
    except SpecError as e:
        raise UsageError(f"--{e.field.replace('_', '-')}: {e.why} (got {e.value!r})") from None
    if args.router not in ROUTERS:
        raise UsageError(f"--router: unknown {args.router!r}; choose from {', '.join(ROUTERS)}")
    if args.kv_bytes_per_token is not None and args.kv_bytes_per_token < 0:
        raise UsageError(f"--kv-bytes-per-token: must be >= 0 (got {args.kv_bytes_per_token})")
    kv_bytes = args.kv_bytes_per_token if args.kv_bytes_per_token is not None else _kv_bytes(prov, args.model)
    overhead_s, jitter_sd, _ = calibrated_flags(args.request_overhead, args.jitter, profile, args.profile, "plan",
                                                max_num_seqs=max_num_seqs,
                                                max_num_seqs_given=args.max_num_seqs is not None)
    setup = Setup(engine, slo, link, kv_bytes, args.router, seed=args.seed, jitter_sd=jitter_sd,
                  request_overhead_s=overhead_s)
    return recipe, setup, options


def _kv_blocks(prov: dict[str, Any], block_size: int) -> int:
    """A roofline profile's KV room (`kv_capacity_tokens`: 90% of its GPUs' memory less the weights, as
    `slobench profile` prints it) in blocks; otherwise 8192."""
    if prov.get("kind") != "roofline":
        return 8192
    blocks = int(prov["kv_capacity_tokens"]) // block_size
    if blocks < 1:
        raise UsageError(f"--profile: the model's weights leave no KV room on {prov.get('tp', 1)} x "
                         f"{prov['gpu']['name']} (kv_capacity_tokens {prov['kv_capacity_tokens']}); use more GPUs "
                         "(/tpN) or give --kv-blocks")
    return blocks


def _kv_bytes(prov: dict[str, Any], model: str) -> int:
    """KV bytes a token moves from prefill to decode: the whole model's K and V (every GPU's share)."""
    if prov.get("kind") == "roofline":
        m = prov["model"]
        return int(2 * m["num_layers"] * m["num_kv_heads"] * m["head_dim"] * m.get("bytes_per_param", 2))
    try:
        return kv_bytes_per_token(model)
    except ImportError:
        raise UsageError(f"--model {model}: its KV size needs the engine extra (torch); use a roofline "
                         "--profile instead") from None


def plan_table(result: dict[str, Any]) -> str:
    """Windows (traffic and the planner's fleet), then one line a strategy."""
    target = result["slo"].get("target", 0.9)
    lines = [f"plan for {result['day']['name']}: {result['day']['num_windows']} windows of "
             f"{result['day']['window_s'] / 3600:g} h, SLO {_slo_text(result['slo'])}, profile "
             f"{result['engine']['profile']}"]
    names = list(result["strategies"])
    head = f"{'window':>6} {'req/s':>7} {'in':>6} {'out':>5} {'P:D':>6}  " + "  ".join(f"{n:>18}" for n in names)
    lines += ["", head, "-" * len(head)]
    for w in result["windows"]:
        t = w["traffic"]
        cells = []
        for n in names:
            s = w["strategies"][n]
            mark = "" if s["meets_target"] else "!"
            cells.append(f"{s['label'] + ' ' + format(s['attainment'], '.0%') + mark:>18}")
        lines.append(f"{_clock(w['start_h']):>6} {t['rate_rps']:>7.1f} {t['mean_input_tokens']:>6.0f} "
                     f"{t['mean_output_tokens']:>5.0f} {t['prefill_decode_ratio']:>6.1f}  " + "  ".join(cells))
    scope = result["options"].get("target_scope", "window")
    lines += ["", f"(! = below the {target * 100:g}% target in that window"
              + ("; the target is the day's" if scope == "day" else "") + ")", ""]
    head2 = f"{'strategy':<18} {'GPU-hours':>10} {'attainment':>11} {'goodput/GPU':>12} {'windows met':>12} {'max':>4} {'switched':>9}"
    lines += [head2, "-" * len(head2)]
    for n, s in result["strategies"].items():
        lines.append(f"{n:<18} {s['gpu_hours']:>10.1f} {s['attainment']:>11.2%} {s['goodput_per_gpu_rps']:>10.2f}/s "
                     f"{s['windows_met']:>6}/{s['num_windows']:<5} {s['max_instances']:>4} {s['instances_switched']:>9}")
    vs = result["strategies"]["planner"].get("vs_best_static")
    if vs:
        lines.append(f"\nplanner vs best static ({vs['static']}): {vs['gpu_hours_saved']:+.1f} GPU-hours saved "
                     f"({vs['gpu_hours_saved_share']:+.1%}), attainment {vs['attainment_delta'] * 100:+.2f} points")
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _clock(hours: float) -> str:
    """A window's start as H:MM of the day (past 24 h the hours go on counting)."""
    minutes = round(hours * 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def _slo_text(slo: dict[str, Any]) -> str:
    parts = [f"{k[:-2]}<={v * 1e3:g}ms" for k, v in slo.items() if k.endswith("_s") and v is not None]
    return ",".join(parts) + f" for {slo.get('target', 0.9) * 100:g}%"

