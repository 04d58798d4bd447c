"""Decode step time of the reference engine's model on a GPU against the memory-bandwidth roofline, and
offline throughput of the whole engine.

For each (batch, context) cell, one decode step of the `llama-3.2-1b` shape (bf16, dummy weights) through
`TorchExecutor.execute` (CUDA graph replay, Triton kernels), beside the floor (weight bytes + batch ×
context × KV bytes a token) ÷ the measured copy bandwidth; then 256 seeded requests through the engine
`slobench serve --executor torch --device cuda` builds. Targets on an H200: decode >= 60% of the roofline
for batch >= 32, offline >= 20,000 tokens/s. Without CUDA it prints "no CUDA device: skipped" and exits 0;
`--cpu-smoke` runs every path once on the CPU. Run by benchmarks/gpu_check.sh; docs/measurements/gpu_roofline.md.

    python benchmarks/gpu_roofline.py [--json results.json] [--batch-sizes 1,8,32] [--skip-offline]"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

MODEL = "llama-3.2-1b"
DECODE_TARGET_FRACTION = 0.60
DECODE_TARGET_MIN_BATCH = 32
OFFLINE_TARGET_TOKENS_PER_S = 20_000.0
GIB = 1 << 30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def ints(text: str) -> list[int]:
        values = [int(x) for x in text.split(",") if x.strip()]
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
        return values

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=ints, default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--context-lens", type=ints, default=[128, 512, 2048, 8192])
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (engine default 16)")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory for weights, activations and KV cache (the executor sizes its cache)",
    )
    p.add_argument(
        "--no-cuda-graphs", action="store_true", help="the executor's --enforce-eager: eager decode steps"
    )
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--offline-requests", type=int, default=256)
    p.add_argument("--offline-seed", type=int, default=0)
    p.add_argument(
        "--offline-time-limit-s", type=float, default=150.0, help="stop the offline run after this"
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--json", dest="json_path", default=None, help="also write the results here")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run every code path once on the CPU with the tiny model (checks the script, measures nothing)",
    )
    return p.parse_args(argv)


# ---- measurements --------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def sync_time(fn: Callable[[], object], iters: int, device: str = "cuda") -> float:
    """Mean seconds per call of `fn`, the device synchronised before and after (the clock reads host time)."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / iters


def measure_copy_bandwidth(nbytes: int = 2 * GIB) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read and written (the roofline's bandwidth)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds = sync_time(lambda: dst.copy_(src), 10)
    return 2 * nbytes / seconds  # the caller empties the allocator's cache once src, dst are gone


@dataclass(frozen=True, slots=True)
class DecodeCell:
    batch: int
    context_len: int
    step_ms: float | None  # TorchExecutor.execute, host work included; None: skipped (KV does not fit)
    graph_ms: float | None  # the captured graph's replay alone (device work); None without a graph
    roofline_ms: float
    fraction: float | None  # roofline / step
    graph_fraction: float | None  # roofline / graph replay
    bandwidth_gbps: float | None
    tokens_per_s: float | None
    mode: str  # "graph", "eager", "padded-eager" (CPU smoke), or why it was skipped


class DecodeBench:
    """One `TorchExecutor` (the engine's real GPU path: bf16, Triton kernels, decode CUDA graphs, KV cache
    sized from free memory after its warm-up) timed on synthetic decode steps of each grid cell."""

    def __init__(self, args: argparse.Namespace, max_tokens_needed: int) -> None:
        import torch

        from reference_engine.executor.torch_executor import TorchExecutor

        self.torch, self.device, self.block_size = torch, args.device, args.block_size
        on_cuda = args.device == "cuda"
        self.executor = TorchExecutor(
            args.model,
            None if on_cuda else math.ceil(max_tokens_needed / args.block_size),
            args.block_size,
            device=args.device,
            seed=0,
            enforce_eager=args.no_cuda_graphs,
            max_num_seqs=max(args.batch_sizes),
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=max(args.context_lens),
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
        ex = self.executor
        if not on_cuda and not args.no_cuda_graphs:
            # CPU smoke: the padded static-buffer path a graph would replay, run eagerly; sizes planned
            # for twice the largest batch, so an odd batch is padded as on the GPU.
            from reference_engine.executor.cuda_graphs import DecodeGraphRunner, GraphPlan

            plan = GraphPlan.for_limits(2 * max(args.batch_sizes), ex.max_model_len, args.block_size)
            ex.decode_graphs = DecodeGraphRunner(ex.model, ex.k_cache, ex.v_cache, plan)
        self.cfg, self.num_blocks = ex.config, ex.num_blocks
        # parameters() yields a tied tensor once: the embedding doubles as the LM head, read once a step.
        self.weight_bytes = sum(p.numel() * p.element_size() for p in ex.model.parameters())
        self.kv_bytes_per_token = ex.kv_bytes_per_token
        self.rng = random.Random(0)

    def blocks_needed(self, batch: int, context_len: int) -> int:
        return batch * math.ceil(context_len / self.block_size)

    def make_batch(self, batch: int, context_len: int) -> Any:
        """Every sequence decodes its token at position context_len - 1, over scattered blocks (a cache
        after some churn)."""
        from reference_engine.executor.base import SeqChunk, StepBatch

        per_seq = math.ceil(context_len / self.block_size)
        blocks = self.rng.sample(range(self.num_blocks), batch * per_seq)
        chunks = [
            SeqChunk(i, [self.rng.randrange(self.cfg.vocab_size)], context_len - 1,
                     blocks[i * per_seq : (i + 1) * per_seq], sample=True)
            for i in range(batch)
        ]
        return StepBatch(chunks)

    def time_cell(self, batch: int, context_len: int) -> tuple[float, float | None, str]:
        ex = self.executor
        step_batch = self.make_batch(batch, context_len)
        runner = ex.decode_graphs
        choice = runner.plan.choose(step_batch.chunks) if runner is not None else None
        mode = "eager"
        if choice is not None and choice.batch_size is not None:
            mode = "graph" if choice.batch_size in runner.graphs else "padded-eager"  # type: ignore[union-attr]
        ex.execute(step_batch)  # first call of an eager shape compiles kernels, warms cuBLAS
        step_s = timed(lambda: ex.execute(step_batch), self.device)
        graph_s = None
        if mode == "graph":
            assert runner is not None and choice is not None and choice.batch_size is not None
            graph = runner.graphs[choice.batch_size]  # its buffers hold this batch since the last execute
            graph_s = timed(graph.replay, self.device)
        return step_s, graph_s, mode


def timed(fn: Callable[[], object], device: str) -> float:
    estimate = sync_time(fn, 3, device)
    iters = max(5, min(200, int(0.3 / max(estimate, 1e-6))))
    return sync_time(fn, iters, device)


def run_decode_grid(args: argparse.Namespace, bandwidth: float) -> list[DecodeCell]:
    import gc

    import torch

    cells_wanted = [(b, c) for b in args.batch_sizes for c in args.context_lens]
    max_tokens = max(b * math.ceil(c / args.block_size) * args.block_size for b, c in cells_wanted)
    t0 = time.perf_counter()
    bench = DecodeBench(args, max_tokens)
    ex = bench.executor
    graphs = ex.decode_graphs
    print(
        f"model {args.model} ({ex.dtype}): weights {bench.weight_bytes / 1e9:.2f} GB, "
        f"KV {bench.kv_bytes_per_token / 1024:.0f} KiB/token, cache {bench.num_blocks} blocks × "
        f"{args.block_size} tokens ({bench.num_blocks * args.block_size * bench.kv_bytes_per_token / GIB:.1f} GiB)"
    )
    if ex.memory_profile is not None:
        m = ex.memory_profile
        print(
            f"KV sized from memory: {args.gpu_memory_utilization:g} × {m.total_bytes / GIB:.1f} GiB − "
            f"{m.used_bytes / GIB:.2f} GiB used after warm-up − {m.activation_peak_bytes / GIB:.2f} GiB activations"
        )
    print(
        f"decode graphs: {sorted(graphs.graphs) if graphs is not None else 'none'} "
        f"({ex.graphs_off_reason}); executor ready in {time.perf_counter() - t0:.1f} s"
    )
    cells: list[DecodeCell] = []
    print(
        f"{'batch':>5} {'context':>7} {'step ms':>9} {'graph ms':>9} {'roof ms':>8} {'of roof':>7} "
        f"{'graph/rf':>8} {'GB/s':>7} {'tok/s':>9} mode"
    )
    for batch, context_len in cells_wanted:
        roof_s = (bench.weight_bytes + batch * context_len * bench.kv_bytes_per_token) / bandwidth
        if bench.blocks_needed(batch, context_len) > bench.num_blocks:
            cell = DecodeCell(batch, context_len, None, None, roof_s * 1e3, None, None, None, None,
                              "skipped: KV does not fit")
            print(f"{batch:>5} {context_len:>7} {'—':>9} {'—':>9} {roof_s * 1e3:>8.3f} {'—':>7} {'—':>8} "
                  f"{'—':>7} {'—':>9} {cell.mode}")
            cells.append(cell)
            continue
        step_s, graph_s, mode = bench.time_cell(batch, context_len)
        moved = bench.weight_bytes + batch * context_len * bench.kv_bytes_per_token
        cell = DecodeCell(
            batch,
            context_len,
            step_s * 1e3,
            None if graph_s is None else graph_s * 1e3,
            roof_s * 1e3,
            roof_s / step_s,
            None if graph_s is None else roof_s / graph_s,
            moved / step_s / 1e9,
            batch / step_s,
            mode,
        )
        graph_ms = "—" if cell.graph_ms is None else f"{cell.graph_ms:.3f}"
        graph_frac = "—" if cell.graph_fraction is None else f"{cell.graph_fraction:.0%}"
        print(
            f"{batch:>5} {context_len:>7} {cell.step_ms:>9.3f} {graph_ms:>9} {cell.roofline_ms:>8.3f} "
            f"{cell.fraction:>7.0%} {graph_frac:>8} {cell.bandwidth_gbps:>7.0f} {cell.tokens_per_s:>9.0f} {mode}",
            flush=True,
        )
        cells.append(cell)
    del bench, ex, graphs
    gc.collect()  # the executor, its KV cache and its graphs' memory pool go before the offline run
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return cells


# ---- offline throughput through the real engine ------------------------------------------------------
# Kept apart: it depends on the engine's and executor's constructors, which the lead may adjust.


def offline_workload(num_requests: int, seed: int, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs; lengths uniform in 100..1024 (the nano-vllm benchmark)."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        num_in, num_out = rng.randint(100, 1024), rng.randint(100, 1024)
        out.append(([rng.randrange(vocab_size) for _ in range(num_in)], num_out))
    return out


def run_offline(args: argparse.Namespace) -> dict[str, Any]:
    """The engine as `slobench serve --executor torch` builds it: KV sized from free memory on CUDA,
    decode steps through CUDA graphs, prefills through the Triton extend kernel."""
    from reference_engine.builder import build_engine
    from reference_engine.config import EngineSpec
    from reference_engine.model import get_config

    cfg = get_config(args.model)
    workload = offline_workload(args.offline_requests, args.offline_seed, min(cfg.vocab_size, 128_000))
    max_len = max(len(p) + n for p, n in workload)
    needed_blocks = sum(math.ceil((len(p) + n) / args.block_size) for p, n in workload)
    t0 = time.perf_counter()
    engine, _ = build_engine(EngineSpec(
        model=args.model,
        executor="torch",
        kv_blocks=None if args.device == "cuda" else needed_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_len,
        device=args.device,
        enforce_eager=args.no_cuda_graphs,
        gpu_memory_utilization=args.gpu_memory_utilization,
    ))
    executor: Any = engine.executor
    build_s = time.perf_counter() - t0
    engine.generate([workload[0][0][:128], workload[1][0][:64]], max_tokens=8, ignore_eos=True)  # warm-up
    graphs = executor.decode_graphs
    replays_before = graphs.num_replays if graphs is not None else 0
    for prompt, num_out in workload:
        engine.add_request(prompt, max_tokens=num_out, ignore_eos=True)
    expected_tokens = sum(n for _, n in workload)
    start_tokens, start_steps = engine.num_generation_tokens, engine.num_steps
    synchronize(args.device)
    t0 = time.perf_counter()
    is_complete = True
    while engine.has_work():
        engine.step()
        if time.perf_counter() - t0 > args.offline_time_limit_s:
            is_complete = False
            break
    synchronize(args.device)
    elapsed_s = time.perf_counter() - t0
    generated = engine.num_generation_tokens - start_tokens
    num_steps = engine.num_steps - start_steps
    num_graph_steps = (graphs.num_replays if graphs is not None else 0) - replays_before
    return {
        "num_requests": len(workload),
        "num_blocks": executor.num_blocks,
        "dtype": str(executor.dtype),
        "engine_build_s": build_s,
        "expected_output_tokens": expected_tokens,
        "output_tokens": generated,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": generated / elapsed_s,
        "is_complete": is_complete,
        "num_steps": num_steps,
        "num_graph_steps": num_graph_steps,
    }


# ---- report ---------------------------------------------------------------------------------------------


def summarise(cells: list[DecodeCell], offline: dict[str, Any] | None) -> list[str]:
    lines = []
    judged = [c for c in cells if c.fraction is not None and c.batch >= DECODE_TARGET_MIN_BATCH]
    for label, key in (("engine step", "fraction"), ("graph replay alone", "graph_fraction")):
        rated = [(c, getattr(c, key)) for c in judged if getattr(c, key) is not None]
        if not rated:
            continue
        met = [c for c, f in rated if f >= DECODE_TARGET_FRACTION]
        worst, worst_f = min(rated, key=lambda cf: cf[1])
        lines.append(
            f"decode target ≥{DECODE_TARGET_FRACTION:.0%} of roofline for batch ≥{DECODE_TARGET_MIN_BATCH} "
            f"({label}): met in {len(met)}/{len(rated)} cells; worst {worst_f:.0%} "
            f"(batch {worst.batch}, context {worst.context_len})"
        )
    if offline is not None:
        verdict = "met" if offline["output_tokens_per_s"] >= OFFLINE_TARGET_TOKENS_PER_S else "NOT met"
        partial = "" if offline["is_complete"] else " (stopped at the time limit: partial)"
        lines.append(
            f"offline target ≥{OFFLINE_TARGET_TOKENS_PER_S:,.0f} output tok/s: {verdict}: "
            f"{offline['output_tokens_per_s']:,.0f} tok/s, {offline['output_tokens']:,} tokens in "
            f"{offline['elapsed_s']:.1f} s{partial}; {offline['num_graph_steps']}/{offline['num_steps']} steps "
            f"replayed a CUDA graph"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    if args.cpu_smoke:
        args.model, args.device = "tiny", "cpu"
        args.batch_sizes, args.context_lens = [3], [40]
        args.offline_requests, args.offline_time_limit_s = 2, 20.0
        bandwidth, device_name = 10e9, "cpu (smoke run: numbers mean nothing)"
    elif not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    else:
        args.model, args.device = MODEL, "cuda"
        props = torch.cuda.get_device_properties(0)
        device_name = f"{props.name}, {props.multi_processor_count} SMs"
        bandwidth = measure_copy_bandwidth()
        torch.cuda.empty_cache()  # hand the copy buffers back: the KV cache is sized from free memory
    t_start = time.perf_counter()
    print(f"device {device_name}, torch {torch.__version__}")
    print(f"copy bandwidth (read + write): {bandwidth / 1e12:.2f} TB/s")
    # TorchExecutor fuses them exactly when attention goes through the kernels, its default on CUDA only.
    fused = "on" if args.device == "cuda" else "off (CPU: sdpa backend, plain torch ops)"
    print(f"fused elementwise kernels (RMSNorm+residual, rotary, SiLU·mul): {fused}")
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_name,
        "torch": torch.__version__,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "fused_kernels": args.device == "cuda",
    }
    cells: list[DecodeCell] = []
    if not args.skip_decode:
        cells = run_decode_grid(args, bandwidth)
        results["decode"] = [asdict(c) for c in cells]
    offline = None
    if not args.skip_offline:
        print(
            f"offline: {args.offline_requests} requests, lengths uniform in 100..1024, seed {args.offline_seed}"
        )
        try:
            offline = run_offline(args)
        except Exception as exc:  # the engine's API is still moving: keep the decode table
            print(f"offline run failed: {exc!r}")
            results["offline_error"] = repr(exc)
        results["offline"] = offline
    summary = summarise(cells, offline)
    results["summary"] = summary
    for line in summary:
        print(line)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if "offline_error" in results else 0  # the decode table is kept and printed either way


if __name__ == "__main__":
    sys.exit(main())
