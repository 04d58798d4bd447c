"""Decode throughput of the reference engine, and the share of each step spent outside the model's forward.

Runs the real LLMEngine on the TorchExecutor: for each batch size, B requests with ~240-token prompts are
prefilled, then `--steps` pure-decode steps are timed. "outside" is everything in `engine.step()` but the
forward: scheduling, block bookkeeping, index tensors, sampling, token emission. Per-step medians.
Target: outside < 25% at batch 32 (tiny, CPU). Figures: docs/measurements/engine_step.md.

    .venv/bin/python benchmarks/engine_step.py            # tiny on CPU, 2 threads, < 2 minutes
    .venv/bin/python benchmarks/engine_step.py --device cuda --model llama-3.2-1b --dtype bfloat16"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.executor.torch_executor import TorchExecutor

BLOCK_SIZE = 16


class Stopwatch:
    """Accumulates the time spent inside the wrapped callables (device synchronised on both ends)."""

    def __init__(self, device: torch.device) -> None:
        self.total_s = 0.0
        self._sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            self.total_s += time.perf_counter() - t0
            return out

        return timed


def flops_per_decode_token(ex: TorchExecutor, context: int) -> float:
    cfg = ex.config
    matmul_params = sum(
        p.numel() for n, p in ex.model.named_parameters() if "norm" not in n and "tok_emb" not in n
    )
    if cfg.tie_embeddings:
        matmul_params += ex.model.output.weight.numel()
    attention = 4 * context * cfg.n_heads * cfg.head_dim * cfg.n_layers  # q.k and p.v
    return 2 * matmul_params + attention


def run_batch(args: argparse.Namespace, batch: int) -> dict[str, float]:
    device = torch.device(args.device)
    prompt_len = args.context - args.steps // 2
    num_blocks = batch * -(-(prompt_len + args.steps + 2) // BLOCK_SIZE) + 8
    ex = TorchExecutor(args.model, num_blocks, BLOCK_SIZE, dtype=getattr(torch, args.dtype), device=device,
                       attention_backend=args.attention_backend)
    cfg = EngineConfig(block_size=BLOCK_SIZE, num_blocks=num_blocks, max_num_seqs=batch,
                       max_num_batched_tokens=2048, max_model_len=4096, enable_prefix_caching=True)
    engine = LLMEngine(cfg, ex)
    gen = torch.Generator().manual_seed(batch)
    for _ in range(batch):  # distinct prompts: no prefix hits, every sequence has its own KV
        prompt = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
        engine.add_request(prompt, max_tokens=args.steps + 64, ignore_eos=True)
    while engine.has_work() and engine.stats().num_generation_tokens < batch:
        engine.step()  # prefill (chunked by the token budget) until every request has its first token
    for _ in range(2):
        engine.step()  # warm-up decode steps

    forward = Stopwatch(device)
    model = ex.model
    model.forward = forward.wrap(model.forward)  # type: ignore[method-assign]
    model.logits = forward.wrap(model.logits)  # type: ignore[method-assign]
    step = Stopwatch(device)
    timed_step = step.wrap(engine.step)
    step_s, forward_s = [], []
    for _ in range(args.steps):
        step.total_s = forward.total_s = 0.0
        timed_step()
        step_s.append(step.total_s)
        forward_s.append(forward.total_s)
    assert engine.stats().num_running == batch, "every timed step must decode the whole batch"
    # Medians: on a shared machine a step that lost the CPU to another process should not set the number.
    step_ms = statistics.median(step_s) * 1e3
    forward_ms = statistics.median(forward_s) * 1e3
    outside = statistics.median(1 - f / s for f, s in zip(forward_s, step_s, strict=True))
    return {
        "step_ms": step_ms,
        "forward_ms": forward_ms,
        "outside_pct": 100 * outside,
        "tok_s": batch / (step_ms * 1e-3),
        "gflop_s": batch * flops_per_decode_token(ex, args.context) / (forward_ms * 1e-3) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=256, help="average context length while timing")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per batch size")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--attention-backend", choices=["sdpa", "kernels"], default=None,
                        help="default: kernels on CUDA, sdpa on the CPU")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"engine step, model={args.model} device={args.device} dtype={args.dtype} threads={args.threads} "
          f"context~{args.context} block_size={BLOCK_SIZE}, real LLMEngine + TorchExecutor, per-step medians")
    header = (
        f"{'batch':>5} {'decode tok/s':>12} {'step ms':>8} {'forward ms':>10} {'outside %':>9} {'GFLOP/s':>8}"
    )
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other processes skew CPU timings)"
    )
    print(header)
    print("-" * len(header))
    for batch in (int(b) for b in args.batches.split(",")):
        r = run_batch(args, batch)
        print(f"{batch:>5} {r['tok_s']:>12.0f} {r['step_ms']:>8.2f} {r['forward_ms']:>10.2f} "
              f"{r['outside_pct']:>9.1f} {r['gflop_s']:>8.1f}")


if __name__ == "__main__":
    main()
