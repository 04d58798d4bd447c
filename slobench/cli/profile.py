"""CLI verbs that make cost profiles: `profile` (a roofline from specs) and `calibrate` (a fit from probes
of a live endpoint)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parsers(sub: Any, *, epilog: str) -> None:
    from slobench.profiles import GPUS, MODELS

    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "profile", epilog=epilog, formatter_class=fmt,
        help="write a roofline cost profile for a model on a GPU (for --simulate --profile)",
        description="A cost profile from a GPU's datasheet peaks and a model's shapes, with efficiencies fitted "
                    "to measured operator times (see README, 'Roofline profiles'). The same profile is "
                    "available without a file as --profile roofline:GPU/MODEL[/tpN].",
    )
    p.add_argument("--gpu", required=True, help=f"one of {', '.join(GPUS)}")
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (GPUs per instance, default 1)")
    p.add_argument("-o", "--output", default=None, help="write the profile JSON here (default: print it)")

    c = sub.add_parser(
        "calibrate", epilog=epilog, formatter_class=fmt,
        help="fit a cost profile from designed probes of a live endpoint",
        description="Single requests over a grid of prompt lengths (prefill), and steady batches of decode at "
                    "several concurrencies and contexts, in interleaved rounds; fits step = a + b*prefill + "
                    "c*decode + d*context + f*attention_pairs (and a fixed cost per request, kept apart), prints "
                    "the fit and its error on the probes held out of it (every third of each grid), and writes "
                    "the profile. About 2 minutes against the CPU reference engine.",
    )
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


def calibrate(args: argparse.Namespace) -> int:
    import asyncio

    from slobench.profiles.calibrate import calibrate_main

    return asyncio.run(calibrate_main(args))


def profile(args: argparse.Namespace) -> int:
    from slobench.profiles import roofline

    prof = roofline(args.model, args.gpu, args.tp)
    text = prof.to_json() + "\n"
    if args.output is None:
        print(text, end="")
        return 0
    out = Path(args.output)
    try:
        out.write_text(text)
    except OSError as e:
        from slobench.errors import UsageError

        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from e
    roof = json.loads(text)["provenance"]
    print(f"{prof.name}: {roof['weights_gb_per_gpu']} GB of weights a GPU, dense layers weights-bound below "
          f"~{roof['ridge_tokens_per_step']:.0f} tokens a step; decode step at batch 1, 1k context: "
          f"{prof.step_s(0, 1, 1024) * 1e3:.2f} ms; a 2k-token prefill: "
          f"{prof.step_s(2048, 0, 2048, 2048 * 2049 // 2) * 1e3:.1f} ms; KV room for {roof['kv_capacity_tokens']:,} "
          f"tokens at 90% of memory (simulate with --kv-blocks {roof['kv_capacity_tokens'] // 16})")
    print(f"written: {out}")
    return 0
