"""`validate_published.py --setup custom`: the engine a set of measured runs ran, from the simulator's own flags
(scheduler, limits, KV blocks, prefix caching), priced by a roofline of `--gpu` and `--model-config` at `--tp`
or by any profile file; the fleet builder that the replay and the calibration share."""

from __future__ import annotations

import argparse
from typing import Any

from reference_engine.config import SCHEDULERS
from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError
from slobench.fleet.published import ScaledBuilder
from slobench.fleet.simulate import ModeledEngine
from slobench.profiles.from_runs import scaled_colocated
from slobench.profiles.roofline import kv_capacity_tokens, roofline
from slobench.profiles.specs import model_from_hf_config

MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization, for KV blocks from the GPU's memory
_FLAGS = {"--scheduler": "scheduler", "--max-num-seqs": "max_num_seqs", "--max-batched-tokens": "max_batched_tokens",
          "--block-size": "block_size", "--kv-blocks": "kv_blocks", "--no-prefix-caching": "no_prefix_caching",
          "--max-model-len": "max_model_len", "--gpu": "gpu", "--model-config": "model_config", "--tp": "tp"}


def add_custom_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--setup custom: the served engine, as the simulator's flags describe it")
    g.add_argument("--scheduler", choices=SCHEDULERS, default=None, help="default chunked")
    g.add_argument("--max-num-seqs", type=int, default=None, help="default 64")
    g.add_argument("--max-batched-tokens", type=int, default=None, help="token budget a step (default 2048)")
    g.add_argument("--block-size", type=int, default=None, help="tokens a KV block (default 16)")
    g.add_argument("--kv-blocks", type=int, default=None,
                   help="default: from --gpu's memory x 0.9 less the weights, with --model-config; else 2048")
    g.add_argument("--no-prefix-caching", action="store_true", default=None, help="the server had it off")
    g.add_argument("--max-model-len", type=int, default=None, help="default: the model's positions, else 4096")
    g.add_argument("--gpu", default=None, metavar="SPEC", help="the GPU (a built-in name), for --profile roofline")
    g.add_argument("--model-config", default=None, metavar="PATH", help="the model's Hugging Face config.json")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default 1)")


def custom_flags_given(args: argparse.Namespace) -> list[str]:
    return [flag for flag, name in _FLAGS.items() if getattr(args, name) is not None]


def custom_builder(args: argparse.Namespace) -> tuple[CostProfile, ScaledBuilder]:
    """The base profile and the fleet builder of `--setup custom` at a prefill scale and a KV blocks scale
    (1, 1: the profile and the flags as they are; bad values: SpecError naming the flag)."""
    tp = 1 if args.tp is None else args.tp
    if tp < 1:
        raise SpecError("--tp", tp, "must be an integer >= 1")
    model = model_from_hf_config(args.model_config) if args.model_config else None
    if args.profile == "fitted":
        raise SpecError("--profile", "fitted", "is DistServe's fit of the published setups; with --setup custom give "
                        "roofline or a profile (a file, distserve:FILE@MODEL/tpN)")
    if args.profile == "roofline":
        if model is None or args.gpu is None:
            raise SpecError("--profile", "roofline", "with --setup custom needs --gpu and --model-config")
        base = roofline(model, args.gpu, tp)
    else:
        base = CostProfile.load(args.profile)
    knobs: dict[str, Any] = {"scheduler": args.scheduler, "max_num_seqs": args.max_num_seqs,
                             "max_batched_tokens": args.max_batched_tokens, "block_size": args.block_size,
                             "kv_blocks": args.kv_blocks, "max_model_len": args.max_model_len,
                             "enable_prefix_caching": False if args.no_prefix_caching else None}
    if knobs["kv_blocks"] is None and model is not None and args.gpu is not None:
        knobs["kv_blocks"] = kv_capacity_tokens(model, args.gpu, tp, MEMORY_UTILIZATION) // (args.block_size or 16)
    if knobs["max_model_len"] is None and model is not None and model.max_positions:
        knobs["max_model_len"] = model.max_positions
    engine = ModeledEngine(base, name="custom", **{k: v for k, v in knobs.items() if v is not None})
    return base, scaled_colocated(base, engine)
