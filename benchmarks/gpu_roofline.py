"""Decode step time of the reference engine's model on a GPU against the memory-bandwidth roofline, and
offline throughput of the whole engine.

A decode step re-reads every weight and every running sequence's KV cache, so its floor is
(weight bytes + batch × context × KV bytes per token) ÷ copy bandwidth, the bandwidth measured here by a
large device-to-device copy. For each (batch, context) cell the script times one decode step of the
`llama-3.2-1b` shape (bf16, dummy weights): the engine's own `Transformer` with the Triton kernels
(`write_kv`, `paged_decode_attention`), logits and greedy argmax, captured in a CUDA graph, and prints
the time beside that floor as a fraction. Then it runs a fixed offline workload (256 requests, input
and output lengths uniform in 100–1024, seeded) through `LLMEngine` + `TorchExecutor` and prints output
tokens/s.

Targets on an H200 (issue 7): decode ≥ 60% of the roofline for batch ≥ 32; offline ≥ 20,000 tokens/s.
Whole script: under 6 minutes. Without CUDA it prints "no CUDA device: skipped" and exits 0.

    python benchmarks/gpu_roofline.py [--json results.json] [--batch-sizes 1,8,32] [--skip-offline]
"""

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
        "--kv-headroom-gib", type=float, default=6.0, help="GPU memory left free beside the KV cache"
    )
    p.add_argument("--no-cuda-graphs", action="store_true", help="time eager decode steps instead")
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
    step_ms: float | None  # None: skipped (KV does not fit)
    roofline_ms: float
    fraction: float | None
    bandwidth_gbps: float | None
    tokens_per_s: float | None
    mode: str  # "graph", "eager", or why it was skipped


class DecodeBench:
    """The engine's model and one paged KV cache big enough for the largest cell that fits in memory."""

    def __init__(
        self,
        block_size: int,
        max_tokens_needed: int,
        headroom_bytes: int,
        *,
        model: str = MODEL,
        device: str = "cuda",
    ) -> None:
        import torch

        from reference_engine.executor.torch_executor import kv_bytes_per_token
        from reference_engine.model import build_model

        self.torch, self.device = torch, device
        dtype = self.dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.model = build_model(model, dtype=dtype, device=device, seed=0)
        cfg = self.cfg = self.model.config
        self.block_size = block_size
        # parameters() yields a tied tensor once: the embedding doubles as the LM head, read once a step.
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.kv_bytes_per_token = kv_bytes_per_token(cfg, dtype)
        free_bytes = torch.cuda.mem_get_info()[0] if device == "cuda" else 2 * GIB + headroom_bytes
        per_block = self.kv_bytes_per_token * block_size
        fit_blocks = max(0, (free_bytes - headroom_bytes) // per_block)
        self.num_blocks = int(min(fit_blocks, math.ceil(max_tokens_needed / block_size)))
        shape = (cfg.n_layers, self.num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def blocks_needed(self, batch: int, context_len: int) -> int:
        return batch * math.ceil(context_len / self.block_size)

    def make_step(self, batch: int, context_len: int) -> Callable[[], Any]:
        """A decode step with static inputs: every sequence decodes its token at position context_len - 1."""
        import torch

        from reference_engine import kernels

        bs, dev = self.block_size, self.device
        blocks_per_seq = math.ceil(context_len / bs)
        # Scattered blocks, as a cache looks after some churn.
        perm = torch.randperm(self.num_blocks, device=dev)[: batch * blocks_per_seq]
        block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
        pos = context_len - 1
        slot_mapping = (block_tables[:, pos // bs].long() * bs + pos % bs).contiguous()
        context_lens = torch.full((batch,), context_len, dtype=torch.int32, device=dev)
        positions = torch.full((batch,), pos, dtype=torch.long, device=dev)
        token_ids = torch.randint(0, self.cfg.vocab_size, (batch,), device=dev)
        k_layers, v_layers = self.k_cache, self.v_cache
        model, scale = self.model, self.scale

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = k_layers[layer], v_layers[layer]
            kernels.write_kv(k, v, kc, vc, slot_mapping)
            return kernels.paged_decode_attention(
                q, kc, vc, block_tables, context_lens, scale, max_context_len=context_len
            )

        @torch.inference_mode()
        def step() -> torch.Tensor:
            hidden = model(token_ids, positions, attend)
            return model.logits(hidden).argmax(dim=-1)

        return step

    def time_cell(self, batch: int, context_len: int, use_graphs: bool) -> tuple[float, str]:
        torch = self.torch
        step = self.make_step(batch, context_len)
        step()  # compiles the Triton kernels for this shape, warms cuBLAS
        synchronize(self.device)
        run: Callable[[], object] = step
        mode = "eager"
        graph = None
        if use_graphs and self.device == "cuda":
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                run, mode = graph.replay, "graph"
            except Exception as exc:  # a shape the graph cannot hold: measure eagerly and say so
                print(f"  cuda graph capture failed at batch {batch}, context {context_len}: {exc!r}")
                graph = None
        estimate = sync_time(run, 3, self.device)
        iters = max(5, min(200, int(0.3 / max(estimate, 1e-6))))
        seconds = sync_time(run, iters, self.device)
        del graph
        return seconds, mode


def run_decode_grid(args: argparse.Namespace, bandwidth: float) -> list[DecodeCell]:
    import torch

    cells_wanted = [(b, c) for b in args.batch_sizes for c in args.context_lens]
    max_tokens = max(b * math.ceil(c / args.block_size) * args.block_size for b, c in cells_wanted)
    bench = DecodeBench(
        args.block_size, max_tokens, int(args.kv_headroom_gib * GIB), model=args.model, device=args.device
    )
    print(
        f"model {args.model}: weights {bench.weight_bytes / 1e9:.2f} GB, KV {bench.kv_bytes_per_token / 1024:.0f} KiB/token, "
        f"cache {bench.num_blocks} blocks × {args.block_size} tokens "
        f"({bench.num_blocks * args.block_size * bench.kv_bytes_per_token / GIB:.1f} GiB)"
    )
    cells: list[DecodeCell] = []
    header = f"{'batch':>5} {'context':>7} {'step ms':>9} {'roof ms':>8} {'of roof':>7} {'GB/s':>7} {'tok/s':>9} mode"
    print(header)
    for batch, context_len in cells_wanted:
        roof_s = (bench.weight_bytes + batch * context_len * bench.kv_bytes_per_token) / bandwidth
        if bench.blocks_needed(batch, context_len) > bench.num_blocks:
            cell = DecodeCell(
                batch, context_len, None, roof_s * 1e3, None, None, None, "skipped: KV does not fit"
            )
            print(
                f"{batch:>5} {context_len:>7} {'—':>9} {roof_s * 1e3:>8.3f} {'—':>7} {'—':>7} {'—':>9} {cell.mode}"
            )
            cells.append(cell)
            continue
        step_s, mode = bench.time_cell(batch, context_len, use_graphs=not args.no_cuda_graphs)
        moved = bench.weight_bytes + batch * context_len * bench.kv_bytes_per_token
        cell = DecodeCell(
            batch,
            context_len,
            step_s * 1e3,
            roof_s * 1e3,
            roof_s / step_s,
            moved / step_s / 1e9,
            batch / step_s,
            mode,
        )
        print(
            f"{batch:>5} {context_len:>7} {cell.step_ms:>9.3f} {cell.roofline_ms:>8.3f} {cell.fraction:>7.0%} "
            f"{cell.bandwidth_gbps:>7.0f} {cell.tokens_per_s:>9.0f} {mode}",
            flush=True,
        )
        cells.append(cell)
    del bench
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
    import torch

    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine
    from reference_engine.executor.torch_executor import TorchExecutor, num_blocks_for_memory
    from reference_engine.model import get_config

    cfg = get_config(args.model)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    workload = offline_workload(args.offline_requests, args.offline_seed, min(cfg.vocab_size, 128_000))
    max_len = max(len(p) + n for p, n in workload)
    needed_blocks = sum(math.ceil((len(p) + n) / args.block_size) for p, n in workload)
    free_bytes = (
        torch.cuda.mem_get_info()[0] if args.device == "cuda" else 4 * GIB + int(args.kv_headroom_gib * GIB)
    )
    weight_bytes = 2 * (
        cfg.vocab_size * cfg.dim + cfg.n_layers * (4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.ffn_dim)
    )
    budget = int((free_bytes - weight_bytes - args.kv_headroom_gib * GIB) * 0.9)
    num_blocks = min(needed_blocks, num_blocks_for_memory(budget, cfg, args.block_size, dtype))
    executor = TorchExecutor(args.model, num_blocks, args.block_size, dtype=dtype, device=args.device, seed=0)
    config = EngineConfig(
        block_size=args.block_size,
        num_blocks=num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_len,
    )
    engine = LLMEngine(config, executor)
    engine.generate([workload[0][0][:128], workload[1][0][:64]], max_tokens=8, ignore_eos=True)  # warm-up
    for prompt, num_out in workload:
        engine.add_request(prompt, max_tokens=num_out, ignore_eos=True)
    expected_tokens = sum(n for _, n in workload)
    start_tokens = engine.num_generation_tokens
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
    return {
        "num_requests": len(workload),
        "num_blocks": num_blocks,
        "expected_output_tokens": expected_tokens,
        "output_tokens": generated,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": generated / elapsed_s,
        "is_complete": is_complete,
        "num_steps": engine.num_steps,
    }


# ---- report ---------------------------------------------------------------------------------------------


def summarise(cells: list[DecodeCell], offline: dict[str, Any] | None) -> list[str]:
    lines = []
    judged = [c for c in cells if c.fraction is not None and c.batch >= DECODE_TARGET_MIN_BATCH]
    if judged:
        met = [c for c in judged if c.fraction is not None and c.fraction >= DECODE_TARGET_FRACTION]
        worst = min(judged, key=lambda c: c.fraction or 0.0)
        lines.append(
            f"decode target ≥{DECODE_TARGET_FRACTION:.0%} of roofline for batch ≥{DECODE_TARGET_MIN_BATCH}: "
            f"met in {len(met)}/{len(judged)} cells; worst {worst.fraction:.0%} "
            f"(batch {worst.batch}, context {worst.context_len})"
        )
    if offline is not None:
        verdict = "met" if offline["output_tokens_per_s"] >= OFFLINE_TARGET_TOKENS_PER_S else "NOT met"
        partial = "" if offline["is_complete"] else " (stopped at the time limit: partial)"
        lines.append(
            f"offline target ≥{OFFLINE_TARGET_TOKENS_PER_S:,.0f} output tok/s: {verdict}: "
            f"{offline['output_tokens_per_s']:,.0f} tok/s, {offline['output_tokens']:,} tokens in "
            f"{offline['elapsed_s']:.1f} s{partial}"
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
        args.batch_sizes, args.context_lens = [2], [40]
        args.offline_requests, args.offline_time_limit_s, args.kv_headroom_gib = 2, 20.0, 0.0
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
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_name,
        "torch": torch.__version__,
        "copy_bandwidth_bytes_per_s": bandwidth,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
