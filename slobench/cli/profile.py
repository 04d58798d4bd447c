"""CLI verbs that make cost profiles: `profile` (a roofline from specs) and `calibrate` (a fit from probes
of a live endpoint)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from reference_engine.config import SCHEDULERS
from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli.common import load_options
from slobench.errors import SpecError, UsageError
from slobench.fleet.published import scaled_kv_blocks
from slobench.fleet.simulate import ModeledEngine
from slobench.load_setup import LoadSetup
from slobench.profiles import GPUS, roofline
from slobench.profiles.calibrate import ProbePlan, print_table, with_provenance
from slobench.profiles.calibrate import calibrate as calibrate_endpoint
from slobench.profiles.calibrate_runs import calibrate_runs, calibrated_profile, print_calibration
from slobench.profiles.from_runs import colocated_builder, scaled_colocated
from slobench.profiles.refine import EngineLimits, RefinePlan, print_refinement, refine_live, with_refinement
from slobench.profiles.run_consistency import describe, run_speeds
from slobench.profiles.run_logs import ColumnMap, read_log
from slobench.profiles.specs import MODEL_NAMES
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.workload import load_workload


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "profile":
        _add_profile_arguments(p)
    else:
        _add_calibrate_arguments(p)


def _add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("A cost profile from a GPU's datasheet peaks and a model's shapes, with efficiencies fitted "
                     "to measured operator times (see docs/guide/simulator.md). The same profile is "
                     "available without a file as --profile roofline:GPU/MODEL[/tpN].")
    p.add_argument("--gpu", required=True,
                   help=f"one of {', '.join(GPUS)}; or any GPU by its datasheet numbers, "
                        "bf16_tflops=362,mem_gbs=864,mem_gib=44.5,link_gbs=32 (dense BF16 TFLOP/s, memory GB/s, "
                        "driver-visible memory GiB, GPU-to-GPU GB/s one way); or a .toml/.json file of those keys "
                        "plus name and source")
    p.add_argument("--model", default=None, help=f"one of {', '.join(MODEL_NAMES)}, or a Hugging Face config.json path")
    p.add_argument("--model-config", default=None, metavar="PATH",
                   help="any model's shapes from its Hugging Face config.json (OPT, Llama, Mistral, Qwen), instead "
                        "of --model")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (GPUs per instance, default 1)")
    p.add_argument("-o", "--output", default=None, help="write the profile JSON here (default: print it)")


def _add_calibrate_arguments(c: argparse.ArgumentParser) -> None:
    c.description = ("Single requests over a grid of prompt lengths (prefill), and steady batches of decode at "
                     "several concurrencies and contexts, in interleaved rounds; fits step = a + b*prefill + "
                     "c*decode + d*context + f*attention_pairs (and a fixed cost per request, kept apart), prints "
                     "the fit and its error on the probes held out of it (every third of each grid), and writes "
                     "the profile. About 1.5-2 minutes against the CPU reference engine.\n\n"
                     "Then (unless --no-refine) a second stage on served load: short open-loop Poisson runs of "
                     "--refine-workload at --refine-rates, sent as `slobench run` sends them, and the same requests "
                     "simulated with the fitted profile; factors on a, b, c and the request overhead o are "
                     "fitted so that simulated TTFT/TPOT p50/p90 match the measured ones. The middle rate is held "
                     "out of that fit and both profiles are scored on it. The simulation needs the served engine's "
                     "limits, which a black-box endpoint does not reveal: give them with --kv-blocks, "
                     "--max-num-seqs and --max-batched-tokens (default: --simulate's). The probe-fitted profile is "
                     "written first, and stays if the refinement fails. About 1-2 more minutes against the CPU "
                     "reference engine.")
    c.description += ("\n\nOr, with --from-runs instead of --url: fit the host costs of a base profile (--profile) on "
                      "measured request logs, replayed through the simulator with the server's engine flags (see "
                      "docs/guide/simulator.md, \"Calibrating from your own logs\").")
    c.add_argument("--url", default=None, help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
    c.add_argument("--model", default=None, help="model name (default: the first the server lists)")
    c.add_argument("-o", "--output", required=True, help="write the fitted profile JSON here")
    c.add_argument("--prompt-lens", default=None, metavar="N,N,...",
                   help="prefill probe prompt lengths (default 16,64,128,256,384,512,768,1024)")
    c.add_argument("--batches", default=None, metavar="N,N,...", help="decode probe concurrencies (default 1,4,8,16,32)")
    c.add_argument("--contexts", default=None, metavar="N,N,...", help="decode probe prompt lengths (default 32,96,192)")
    c.add_argument("--output-len", type=int, default=None, help="tokens each decode probe generates (default 48)")
    c.add_argument("--repeats", type=int, default=None, help="rounds: each probe is sent this many times (default 3)")
    c.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    c.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    r = c.add_argument_group("refinement on served load")
    r.add_argument("--no-refine", action="store_true", help="stop after the probe fit")
    r.add_argument("--refine-workload", default=None, metavar="NAME|TOML",
                   help="the workload of the refinement runs: a bundled name or a TOML path (default tiny); give the "
                        "traffic you will simulate: a refinement on its own shape transfers best")
    r.add_argument("--refine-rates", default=None, metavar="R,R,R,...",
                   help="at least 3 rates, req/s; the middle one is held out of the fit (default: 0.5, 0.8 and "
                        "1.1 times the probe fit's simulated knee, where TTFT p90 passes 3x its light-load value)")
    r.add_argument("--refine-requests", type=int, default=None, metavar="N", help="requests a rate (default 200)")
    r.add_argument("--refine-seed", type=int, default=None, help="seed of the refinement's requests (default 0)")
    r.add_argument("--fit-inside", action="store_true",
                   help="also fit r, each request's own cost inside the server (charged to the step of its first "
                        "token, so it delays the requests behind it), beside o outside it (which delays none)")
    r.add_argument("--kv-blocks", type=int, default=None, help="the served engine's KV blocks (default 2048)")
    r.add_argument("--block-size", type=int, default=None, help="the served engine's tokens a KV block (default 16)")
    r.add_argument("--max-num-seqs", type=int, default=None, help="the served engine's most sequences a step (default 64)")
    r.add_argument("--max-batched-tokens", "--max-num-batched-tokens", dest="max_batched_tokens", type=int,
                   default=None, help="the served engine's token budget a step (default 2048)")


    runs_arguments(c)


def live_setup(url: str, model: str, plan: RefinePlan, *, timeout_s: float = 600.0,
               api_key_env: str | None = "OPENAI_API_KEY") -> LoadSetup:
    """The `LoadSetup` that `slobench run --url URL --workload W --num-requests N --seed S` would build: the
    refinement's runs are sent exactly as a run's. Made before any request: a bad workload is exit 2 now."""
    args = load_options(url=url, model=model, workload=plan.workload, num_requests=plan.num_requests, seed=plan.seed,
                        timeout=timeout_s, api_key_env=api_key_env, scrape_interval=0.0, no_progress=True)
    try:
        return LoadSetup(args)
    except UsageError as e:
        raise UsageError(f"--refine-workload {plan.workload}: {e}") from e


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(name, text, "must be comma-separated integers, e.g. 1,4,16") from None


def _rates(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        rates = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SpecError("--refine-rates", text, "must be comma-separated req/s, e.g. 2,3.5,5") from None
    if any(not 0 < r < float("inf") for r in rates):
        raise SpecError("--refine-rates", text, "every rate must be > 0 req/s")
    if len(set(rates)) < 3:
        raise SpecError("--refine-rates", text, "needs at least 3 distinct rates (the middle one is held out)")
    return rates


def refine_plan(args: argparse.Namespace) -> RefinePlan | None:
    """The refinement the flags ask for (None: --no-refine; a flag not given is None and keeps RefinePlan's
    or EngineLimits' default). Every bad value is exit 2, named by its flag, before any probe, and so is a
    refinement flag beside --no-refine, which would ignore it."""
    flags = {"--refine-workload": args.refine_workload, "--refine-rates": args.refine_rates,
             "--refine-requests": args.refine_requests, "--refine-seed": args.refine_seed,
             "--kv-blocks": args.kv_blocks, "--block-size": args.block_size, "--max-num-seqs": args.max_num_seqs,
             "--max-batched-tokens": args.max_batched_tokens,
             "--fit-inside": True if getattr(args, "fit_inside", False) else None}
    if args.no_refine:
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise UsageError(f"{given[0]} applies only to the refinement, which --no-refine skips; drop one of them")
        return None
    least = {"--kv-blocks": 1, "--block-size": 1, "--max-num-seqs": 1, "--max-batched-tokens": 1, "--refine-requests": 10}
    for flag, low in least.items():
        if flags[flag] is not None and flags[flag] < low:
            raise SpecError(flag, flags[flag], f"must be an integer >= {low}")
    plan, lim = RefinePlan(), EngineLimits()

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    limits = EngineLimits(pick(args.kv_blocks, lim.kv_blocks), pick(args.max_num_seqs, lim.max_num_seqs),
                          pick(args.max_batched_tokens, lim.max_batched_tokens), pick(args.block_size, lim.block_size))
    workload = pick(args.refine_workload, plan.workload)
    try:
        load_workload(workload)
    except UsageError as e:
        raise UsageError(f"--refine-workload {workload}: {e}") from e
    return RefinePlan(workload, _rates(args.refine_rates), pick(args.refine_requests, plan.num_requests),
                      pick(args.refine_seed, plan.seed), limits, fit_inside=bool(getattr(args, "fit_inside", False)))


def _write(out: Any, profile: CostProfile, flag: str) -> None:
    try:
        out.write_text(profile.to_json() + "\n")
    except OSError as e:
        raise UsageError(f"{flag}: cannot write: {e.strerror}") from e


async def calibrate_main(args: argparse.Namespace) -> int:
    if args.url is None:
        raise UsageError("give --url URL (probe a live endpoint) or --from-runs FILE... (fit on request logs)")
    given_runs = [f for f in ("--columns", "--profile", "--scheduler", "--max-model-len", "--fit-all", "--fit-prefill",
                              "--fit-kv", "--bootstrap")
                  if getattr(args, f[2:].replace("-", "_")) not in (None, False)]
    if given_runs:
        raise UsageError(f"{given_runs[0]} applies only with --from-runs")
    given = {k: v for k, v in {
        "prompt_lens": _ints(args.prompt_lens, "--prompt-lens"), "batches": _ints(args.batches, "--batches"),
        "contexts": _ints(args.contexts, "--contexts"), "output_len": args.output_len, "repeats": args.repeats,
    }.items() if v is not None}
    plan = ProbePlan(**given)
    refining = refine_plan(args)
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"-o {args.output}: no such folder {str(out.parent)!r}")
    model = args.model or await OpenAITarget(args.url, TargetOptions(api_key_env=args.api_key_env)).discover_model()
    setup = None if refining is None else live_setup(args.url, model, refining, timeout_s=args.timeout,
                                                     api_key_env=args.api_key_env)  # a bad workload: exit 2 now
    n = len(plan.prompt_lens) * plan.repeats + len(plan.batches) * len(plan.contexts)
    print(f"calibrating {model}: {n} probe sends ({len(plan.prompt_lens)} prompt lengths x {plan.repeats}, "
          f"{len(plan.batches)} batches x {len(plan.contexts)} contexts)", flush=True)
    cal = await calibrate_endpoint(args.url, model, plan, timeout_s=args.timeout, api_key_env=args.api_key_env)
    print_table(cal)
    for note in cal.notes:
        print(f"note: {note}")
    profile = with_provenance(cal, args.url, model, plan)
    _write(out, profile, f"-o {args.output}")
    if refining is None or setup is None:
        print(f"written: {out} (use it with --simulate --profile {out})")
        return 0
    k = cal.max_num_seqs
    if k is not None and k < refining.limits.max_num_seqs:
        if args.max_num_seqs is None:
            refining = replace(refining, limits=replace(refining.limits, max_num_seqs=k))
            print(f"note: the refinement simulates the server with --max-num-seqs {k}, as measured", flush=True)
        else:
            print(f"note: --max-num-seqs {args.max_num_seqs} is above the {k} requests the server decoded at once",
                  flush=True)
    print(f"written: {out} (the probe fit); refining it on served load ({refining.workload}, "
          f"{refining.num_requests} requests a rate)", flush=True)
    try:
        ref = await refine_live(setup, cal.profile, cal.request_overhead_s, refining,
                                write=lambda line: print(line, flush=True))
    except BaseException:
        print(f"slobench: calibrate: the refinement did not finish; {out} holds the probe-fitted profile",
              file=sys.stderr)
        raise
    print_refinement(ref)
    _write(out, with_refinement(profile, ref), f"-o {args.output}")
    print(f"written: {out}, refined (use it with --simulate --profile {out}, or plan --profile {out}: both add its "
          f"request overhead {ref.request_overhead_s * 1e3:.1f} ms and step-time noise sd {ref.jitter_sd:.2f} "
          "unless --request-overhead / --jitter say otherwise)")
    return 0


def calibrate(args: argparse.Namespace) -> int:
    if args.from_runs:
        if args.url is not None:
            raise UsageError("give one of --url and --from-runs")
        return from_runs_main(args)
    return asyncio.run(calibrate_main(args))


def profile(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.model_config is None):
        raise UsageError("give one of --model NAME and --model-config PATH")
    prof = roofline(args.model or args.model_config, args.gpu, args.tp)
    text = prof.to_json() + "\n"
    if args.output is None:
        print(text, end="")
        return 0
    out = Path(args.output)
    try:
        out.write_text(text)
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from e
    roof = json.loads(text)["provenance"]
    print(f"{prof.name}: {roof['weights_gb_per_gpu']} GB of weights a GPU, dense layers weights-bound below "
          f"~{roof['ridge_tokens_per_step']:.0f} tokens a step; decode step at batch 1, 1k context: "
          f"{prof.step_s(0, 1, 1024) * 1e3:.2f} ms; a 2k-token prefill: "
          f"{prof.step_s(2048, 0, 2048, 2048 * 2049 // 2) * 1e3:.1f} ms; KV room for {roof['kv_capacity_tokens']:,} "
          f"tokens at 90% of memory (simulate with --kv-blocks {roof['kv_capacity_tokens'] // 16})")
    print(f"written: {out}")
    return 0


# calibrate --from-runs: request logs in, host costs fitted by replaying them

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
    g.add_argument("--fit-prefill", action="store_true", default=None,
                   help="also fit the base profile's prefill price: a scale on its per-token terms (each scale "
                        "tried costs a host fit; about 6 are tried)")
    g.add_argument("--fit-kv", action="store_true", default=None,
                   help="also fit the served engine's KV blocks, as a scale on --kv-blocks (what its memory "
                        "profiling left it; the runs past saturation show it); about 9 scales, each a prefill search with "
                        "--fit-prefill, else a host fit")
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
    if len(runs) > 1:  # runs that disagree with each other cannot all be fitted: say so before the fit
        print("\n".join(describe(run_speeds(runs, base, engine.scheduler))), flush=True)
    print(f"calibrating the host costs of {base.name} on {len(runs)} run(s), {sum(len(r.start_s) for r in runs)} "
          f"requests, replayed on the simulated engine ({', '.join(f'{k}={v}' for k, v in used.items())})", flush=True)
    cal = calibrate_runs(runs, base, colocated_builder(base, engine), fit_all=bool(args.fit_all) or len(runs) < 2,
                         bootstrap=args.bootstrap or 200, scaled=scaled_colocated(base, engine),
                         fit_prefill=bool(args.fit_prefill), fit_kv=bool(args.fit_kv))
    print_calibration(cal)
    prof = calibrated_profile(base, cal, args.from_runs, used, columns.text if columns else None)
    try:
        out.write_text(prof.to_json() + "\n")
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from e
    print(f"written: {out} (use it wherever a profile goes: --simulate --profile {out}, plan --profile {out})")
    if cal.fit.kv_losses:
        blocks = scaled_kv_blocks(engine.kv_blocks, cal.fit.kv_scale)
        print(f"the served engine's KV cache, as the runs show it: {blocks} blocks of {engine.block_size} tokens "
              f"(--simulate and plan with {out} take it unless --kv-blocks is given: --kv-blocks {blocks})")
    return 0
