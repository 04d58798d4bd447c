"""`slobench calibrate --from-runs`: the flags and the handler of calibration on measured request logs (the
fit itself: slobench.profiles.from_runs and calibrate_runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reference_engine.config import SCHEDULERS
from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError, UsageError
from slobench.fleet.simulate import ModeledEngine
from slobench.profiles.calibrate_runs import calibrate_runs, calibrated_profile, print_calibration
from slobench.profiles.from_runs import colocated_builder
from slobench.profiles.run_logs import ColumnMap, read_log

# flags of the probing mode (--url) that mean nothing on logs
_URL_ONLY = ("--model", "--prompt-lens", "--batches", "--contexts", "--output-len", "--repeats", "--no-refine",
             "--refine-workload", "--refine-rates", "--refine-requests", "--refine-seed", "--fit-inside")


def runs_arguments(c: argparse.ArgumentParser) -> None:
    g = c.add_argument_group("calibration on request logs (instead of --url); the served engine's limits are "
                             "--kv-blocks, --block-size, --max-num-seqs and --max-batched-tokens above")
    g.add_argument("--from-runs", nargs="+", default=None, metavar="FILE",
                   help="request logs: the shared run format (JSONL: start_s, prompt_len, output_len, ttft_ms, "
                        "tpot_ms), slobench run directories, or CSV/JSONL read through --columns")
    g.add_argument("--columns", default=None, metavar="KEY=COL,...",
                   help="which column holds what: arrival, prompt, output, ttft, and tpot or latency (e.g. "
                        "arrival=ts,prompt=in_tokens,output=out_tokens,ttft=ttft_ms,tpot=tpot_ms; times in ms, "
                        "arrival in s, unless a key says _s, _ms or _us: ttft_s=ttft)")
    g.add_argument("--profile", default=None, metavar="PROFILE",
                   help="the base profile whose host costs are fitted: a bundled name, a file, roofline:GPU/MODEL"
                        "[/tpN] or distserve:FILE@MODEL/tpN")
    g.add_argument("--scheduler", choices=SCHEDULERS, default=None, help="the served engine's scheduler (default chunked)")
    g.add_argument("--max-model-len", type=int, default=None, help="the served engine's context limit (default 4096)")
    g.add_argument("--no-prefix-caching", action="store_true", default=None, help="the served engine had it off")
    g.add_argument("--fit-all", action="store_true", default=None,
                   help="fit on every run (default: on the lower-rate half, the error printed on the rest)")
    g.add_argument("--bootstrap", type=int, default=None, metavar="N",
                   help="bootstrap resamples of the requests for the uncertainty (default 200)")


def _engine(args: argparse.Namespace, base: CostProfile) -> tuple[ModeledEngine, dict[str, Any]]:
    flags = {"kv_blocks": args.kv_blocks, "block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
             "max_batched_tokens": args.max_batched_tokens, "max_model_len": args.max_model_len,
             "scheduler": args.scheduler, "enable_prefix_caching": False if args.no_prefix_caching else None}
    given = {k: v for k, v in flags.items() if v is not None}
    engine = ModeledEngine(base, **given)  # a bad value is a SpecError naming the field
    used = {k: getattr(engine, k) for k in flags}
    return engine, used


def from_runs_main(args: argparse.Namespace) -> int:
    url_only = [f for f in _URL_ONLY if getattr(args, f[2:].replace("-", "_")) not in (None, False)]
    if url_only:
        raise UsageError(f"{url_only[0]} applies only with --url (probing a live endpoint), not --from-runs")
    if args.profile is None:
        raise UsageError("--from-runs needs --profile: the base profile whose host costs are fitted")
    if args.bootstrap is not None and args.bootstrap < 10:
        raise SpecError("--bootstrap", args.bootstrap, "must be an integer >= 10")
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"-o {args.output}: no such folder {str(out.parent)!r}")
    columns = ColumnMap.parse(args.columns) if args.columns is not None else None
    runs = [read_log(f, columns) for f in args.from_runs]
    base = CostProfile.load(args.profile)
    engine, used = _engine(args, base)
    if len(runs) < 2 and not args.fit_all:
        print("note: one run: fitted on it, nothing held out (give runs at several rates for a held-out check)")
    print(f"calibrating the host costs of {base.name} on {len(runs)} run(s), {sum(len(r.start_s) for r in runs)} "
          f"requests, replayed on the simulated engine ({', '.join(f'{k}={v}' for k, v in used.items())})", flush=True)
    cal = calibrate_runs(runs, base, colocated_builder(base, engine), fit_all=bool(args.fit_all) or len(runs) < 2,
                         bootstrap=args.bootstrap or 200)
    print_calibration(cal)
    prof = calibrated_profile(base, cal, args.from_runs, used, columns.text if columns else None)
    try:
        out.write_text(prof.to_json() + "\n")
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from e
    print(f"written: {out} (use it wherever a profile goes: --simulate --profile {out}, plan --profile {out})")
    return 0
