"""The engine's flags and `slobench serve`'s, importable without the server stack (FastAPI, uvicorn): the
harness builds its command line from them whether or not the `serve` extra is installed.

One helper, `add_engine_spec_arguments`, writes the flags of an `EngineSpec` for `serve` and for
`run/sweep/capacity --engine` and `--simulate`; `engine_spec_from_args` reads them back."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from reference_engine.config import EXECUTORS, SCHEDULERS, VLLM_V1, EngineSpec, vllm_v1_defaults_of
from reference_engine.executor.modeled_executor import CostProfile

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5  # uvicorn's and vLLM's default, said explicitly
DEFAULT_BODY_TIMEOUT_S = 30.0
# A request body's limit. A 128k-token prompt as JSON token ids is ~1 MiB (and as text ~0.5 MiB); 8 MiB holds
# a 1M-token one with room to spare, yet keeps 16 concurrent uploads' buffers near 128 MiB.
DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_BATCHED_TOKENS = 2048


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """`serve`'s flags: the engine's (`add_engine_spec_arguments`), then the server's."""
    add_engine_spec_arguments(parser)
    a = parser.add_argument
    a("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, local only)")
    a("--port", type=int, default=8000, help="port; 0 picks a free one (default: 8000)")
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    a("--served-model-name", default=None, help="model name in the API (default: --model)")
    a("--log-level", default="warning")
    a("--step-log", default=None, metavar="PATH",
      help="write one JSON line per engine step to PATH: its start, duration, prompt tokens, decoding sequences, "
           "context and first tokens (what a cost profile models; reference_engine.step_log)")
    a("--header-timeout", type=_positive_float, default=DEFAULT_HEADER_TIMEOUT_S, metavar="S",
      help=f"close a connection whose request head is not complete within S seconds "
           f"(default: {DEFAULT_HEADER_TIMEOUT_S:g})")
    a("--body-timeout", type=_positive_float, default=DEFAULT_BODY_TIMEOUT_S, metavar="S",
      help=f"answer 408 when a request body takes longer than S seconds (default: {DEFAULT_BODY_TIMEOUT_S:g})")
    a("--max-body-size", type=byte_size, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
      help="answer 413 to a request body larger than BYTES (a number, or with KiB/MiB/GiB; default: 8MiB), "
           "decided from Content-Length before anything is read, or once a chunked body passes it")
    a("--keep-alive", type=int, default=DEFAULT_KEEP_ALIVE_S, metavar="S",
      help=f"close an idle keep-alive connection after S seconds (default: {DEFAULT_KEEP_ALIVE_S})")
    a("--faults", default=None, metavar="KIND=P,...",
      help="inject faults into generation requests, each with its probability: error (HTTP 500), reset (TCP "
           "reset mid-stream), stall (the stream pauses --fault-stall-s), slow-headers (headers held back "
           "--fault-delay-s); e.g. error=0.02,reset=0.01,stall=0.005,slow-headers=0.01")
    a("--fault-seed", type=int, default=None, help="seed of the fault draws (default: --seed)")
    a("--fault-stall-s", type=_positive_float, default=60.0, metavar="S", help="a stall's length (default: 60)")
    a("--fault-delay-s", type=_positive_float, default=5.0, metavar="S",
      help="how long slow-headers holds a response back (default: 5)")


def add_engine_spec_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                              in_process: bool = False) -> None:
    """The flags of one `EngineSpec`. With `in_process` (`run/sweep/capacity`), `--engine` names the executor
    (it replaces --url, so it has no default), the device is `--engine-device`, `--model` and `--seed` are
    the verb's own, and the torch executor's finer knobs stay `serve`'s."""
    a = parser.add_argument
    x = "--engine" if in_process else "--executor"
    if in_process:
        a("--engine", choices=EXECUTORS, default=None,
          help="load the bundled reference engine in this process instead of --url (modeled: step times from "
               "--profile, no model; torch: the real tiny model)")
    else:
        a("--model", default="tiny", help="model config name (torch) / served model name (default: tiny)")
        a("--executor", choices=("torch", "modeled"), default="modeled",
          help="torch: a real model; modeled: no model, step times from a cost profile (default: modeled)")
    a("--profile", default="cpu-tiny", help=f"cost profile name or JSON path for {x} modeled (default: cpu-tiny)")
    a("--kv-blocks", type=int, default=None,
      help="KV cache size in blocks (default: 2048 modeled, 1024 torch on CPU, from free memory on CUDA)")
    a("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    a("--max-num-seqs", type=int, default=None,
      help=f"most requests in a batch (default: {DEFAULT_MAX_NUM_SEQS}; with {x} modeled, a calibrated profile's "
           "served_max_num_seqs when it has one: the most the calibrated server decoded at once)")
    a("--max-batched-tokens", type=int, default=None,
      help=f"token budget per step (default: {DEFAULT_MAX_BATCHED_TOKENS}; with --scheduler vllm-v1, vLLM V1's: "
           "8192 on a GPU of 70 GiB or more other than an A100, else 2048, the GPU read from a roofline profile)")
    a("--max-model-len", type=int, default=None, help="context length limit (default: 4096, capped by the model)")
    a("--no-prefix-caching", action="store_true", help="disable prefix caching")
    a("--scheduler", choices=SCHEDULERS, default="chunked",
      help="how a step's batch is made: chunked (prompts cut into chunks and mixed with decodes under one token "
           "budget, vLLM v1) or vllm-v0 (a step is whole prompts or decodes, never both, prompts first) or "
           "vllm-v1 (today's vLLM: chunked's steps, with vLLM V1's defaults for the sizes not given: the token "
           "budget and max-num-seqs by GPU, and with a roofline profile the KV blocks from the GPU's memory "
           "x 0.9 less weights and activation peak) (default: chunked)")
    if in_process:
        a("--engine-device", default=None, help="torch device for --engine torch: cpu, cuda, cuda:N, auto (default: cpu)")
        return
    a("--dtype", default="auto",
      help="torch dtype for --executor torch: auto (bf16 on CUDA, float32 on CPU), float32, bfloat16, float16")
    a("--device", default="cpu", help="torch device for --executor torch: cpu, cuda, cuda:N, auto (default: cpu)")
    a("--weights", default=None, metavar="PATH",
      help="Hugging Face Llama checkpoint folder (config.json + *.safetensors) for --executor torch; "
           "its config sets the model's shape (default: seeded dummy weights of --model)")
    a("--attention-backend", choices=("sdpa", "kernels"), default=None,
      help="torch executor attention: kernels (Triton on CUDA, the default there) or sdpa (the CPU default)")
    a("--enforce-eager", action="store_true", help="never replay CUDA graphs for decode steps")
    a("--gpu-memory-utilization", type=float, default=0.9,
      help="share of GPU memory for weights, activations and the KV cache when --kv-blocks is not given "
           "(default: 0.9)")
    a("--seed", type=int, default=0)


def engine_spec_from_args(args: argparse.Namespace, *, in_process: bool = False) -> EngineSpec:
    """The `EngineSpec` of flags written by `add_engine_spec_arguments` (with the same `in_process`). In
    process, `--model` may be unset (a URL's model is discovered) and means tiny; the engine's seed stays 0."""
    modeled = (args.engine or "modeled") == "modeled" if in_process else args.executor == "modeled"
    scheduler = getattr(args, "scheduler", "chunked")
    batched, seqs = DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    if scheduler == VLLM_V1 and (args.max_batched_tokens is None or args.max_num_seqs is None):
        batched, seqs = vllm_v1_defaults_of(CostProfile.load(args.profile).provenance if modeled else None)
    max_num_seqs = args.max_num_seqs
    if max_num_seqs is None:
        max_num_seqs = (served_max_num_seqs(args.profile) if modeled else None) or seqs
    kv_blocks = args.kv_blocks
    if kv_blocks is None and modeled:  # a calibrated profile's server: the cache its runs showed
        kv_blocks = served_kv_blocks(args.profile, args.block_size)
    shape = {"profile": args.profile, "kv_blocks": kv_blocks, "block_size": args.block_size,
             "max_num_seqs": max_num_seqs,
             "max_batched_tokens": batched if args.max_batched_tokens is None else args.max_batched_tokens,
             "max_model_len": args.max_model_len, "enable_prefix_caching": not args.no_prefix_caching,
             "scheduler": scheduler}
    if in_process:
        return EngineSpec(model=args.model or "tiny", executor=args.engine or "modeled",
                          device=args.engine_device or "cpu", **shape)
    return EngineSpec(model=args.model, executor=args.executor, dtype=args.dtype, device=args.device, seed=args.seed,
                      weights=args.weights, attention_backend=args.attention_backend,
                      enforce_eager=args.enforce_eager, gpu_memory_utilization=args.gpu_memory_utilization,
                      **shape)


def _provenance(profile: str | None) -> dict[str, Any]:
    """A profile file's provenance; empty for a bundled name, a spec, or a file that cannot be read (its own
    loading reports that)."""
    if not profile or not profile.endswith(".json"):
        return {}
    try:
        with open(profile, encoding="utf-8") as f:
            prov = json.load(f).get("provenance")
    except (OSError, ValueError, AttributeError):
        return {}
    return prov if isinstance(prov, dict) else {}


def _count(value: object) -> int | None:
    """`value` if it is an integer >= 1 (a bool is not), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def served_max_num_seqs(profile: str | None) -> int | None:
    """The most requests the server a calibrated profile (a JSON file) was fitted on decoded at once, from its
    provenance (`slobench calibrate` writes it when that server batched fewer than it was sent); None for
    anything else."""
    return _count(_provenance(profile).get("served_max_num_seqs"))


def served_kv_blocks(profile: str | None, block_size: int | None) -> int | None:
    """The KV blocks of the server a calibrated profile (a JSON file) was fitted on, as its runs showed them
    (`slobench calibrate --from-runs --fit-kv` writes `served_kv_blocks` with the engine's block size), in
    blocks of `block_size` tokens (None: the calibration's); None for anything else."""
    fit = _provenance(profile).get("calibrated_from_runs")
    if not isinstance(fit, dict):
        return None
    engine = fit.get("engine")
    blocks, size = _count(fit.get("served_kv_blocks")), _count(engine.get("block_size") if isinstance(engine, dict) else None)
    if blocks is None or size is None:
        return None
    return max(1, blocks * size // (block_size or size))


_BYTE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 1000**2,
               "gb": 1000**3}


def byte_size(text: str) -> int:
    """A size in bytes from `8388608`, `8MiB`, `512KiB`, `8MB` (argparse type; at least 1 byte)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = _BYTE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8388608, 8MiB, 512KiB)")
    value = int(m.group(1)) * unit
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte (got {text!r})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text!r})")
    return value
