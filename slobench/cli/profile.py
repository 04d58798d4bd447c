"""CLI verbs that make cost profiles: `profile` (a roofline from specs) and `calibrate` (a fit from probes
of a live endpoint)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from slobench.errors import UsageError
from slobench.profiles import GPUS, MODELS, roofline
from slobench.profiles.calibrate import calibrate_main


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb == "profile":
        _add_profile_arguments(p)
    else:
        _add_calibrate_arguments(p)


def _add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("A cost profile from a GPU's datasheet peaks and a model's shapes, with efficiencies fitted "
                     "to measured operator times (see docs/guide/simulator.md). The same profile is "
                     "available without a file as --profile roofline:GPU/MODEL[/tpN].")
    p.add_argument("--gpu", required=True, help=f"one of {', '.join(GPUS)}")
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
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
    c.add_argument("--url", required=True, help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
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


def calibrate(args: argparse.Namespace) -> int:
    return asyncio.run(calibrate_main(args))


def profile(args: argparse.Namespace) -> int:
    prof = roofline(args.model, args.gpu, args.tp)
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
