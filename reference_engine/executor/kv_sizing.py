"""How many KV blocks fit on the GPU: measured after a warm-up pass, as vLLM's `gpu_memory_utilization`.

The executor loads the weights, runs one dummy step as large as the scheduler may ever send
(`max_num_batched_tokens` tokens, sampling as many rows as `max_num_seqs`) to learn the activations'
peak, then gives the KV cache what is left of `gpu_memory_utilization × total`:

    num_blocks = (utilization × total − used after warm-up − activation peak) ÷ bytes per block

"Used" is read from the driver (total − free), so it counts the weights, the CUDA context, cuBLAS and
Triton workspaces, and any other process on the GPU. The arithmetic is a pure function, tested with given
numbers; only `measure_cuda_memory` touches the device.

With no device (a modeled engine standing for vLLM on a GPU), `estimated_activation_peak_bytes` stands for
the warm-up's measured peak, from the model's shape and the step limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reference_engine.errors import ConfigError
from reference_engine.executor.base import SeqChunk

if TYPE_CHECKING:
    import torch

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    total_bytes: int  # the device's memory
    used_bytes: int  # total − free after the warm-up, the allocator's cache emptied
    activation_peak_bytes: int  # the warm-up step's peak above what was allocated before it

    def __post_init__(self) -> None:
        if self.total_bytes < 1:
            raise ConfigError("total_bytes", self.total_bytes, "must be >= 1")
        for name in ("used_bytes", "activation_peak_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), "must be >= 0")


def num_kv_blocks(profile: MemoryProfile, gpu_memory_utilization: float, bytes_per_block: int,
                  min_blocks: int = 1) -> int:
    """Blocks that fit in the budget; a ConfigError naming every term when fewer than `min_blocks` do."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError("gpu_memory_utilization", gpu_memory_utilization, "must be in (0, 1]")
    if bytes_per_block < 1:
        raise ConfigError("bytes_per_block", bytes_per_block, "must be >= 1")
    budget = (
        int(gpu_memory_utilization * profile.total_bytes) - profile.used_bytes - profile.activation_peak_bytes
    )
    blocks = max(0, budget) // bytes_per_block
    if blocks < max(1, min_blocks):
        raise ConfigError(
            "gpu_memory_utilization", gpu_memory_utilization,
            f"leaves room for {blocks} KV blocks, {max(1, min_blocks)} needed: "
            f"{gpu_memory_utilization:g} × {profile.total_bytes / GIB:.2f} GiB total "
            f"− {profile.used_bytes / GIB:.2f} GiB in use after warm-up "
            f"− {profile.activation_peak_bytes / GIB:.2f} GiB activation peak "
            f"= {budget / GIB:.2f} GiB for blocks of {bytes_per_block / 2**20:.2f} MiB; raise "
            "--gpu-memory-utilization, free GPU memory, lower --max-batched-tokens, or pass --kv-blocks",
        )
    return blocks


def estimated_activation_peak_bytes(*, max_num_batched_tokens: int, max_num_seqs: int, hidden_size: int,
                                    mlp_width: int, mlp_matrices: int, vocab_size: int, dtype_bytes: int) -> int:
    """What vLLM's profiling pass (one forward of `max_num_batched_tokens` tokens, then the sampler on
    `max_num_seqs` rows) adds to the memory in use at its peak, estimated as the larger of its two phases:

    - the forward: per token, the residual and the hidden state (2 x hidden) and the MLP's live set, its
      up-projection and the activation written from it (gated: gate_up 2 x width + width; plain: 2 x width,
      so `mlp_matrices` x width), in the model's dtype: a layer's largest set of live tensors (attention's
      q, k, v are narrower than the MLP's width in every model here);
    - the sampler: `max_num_seqs` rows of logits in float32, twice (the logits and the probabilities or
      log-probabilities computed from them).

    `mlp_width` is one GPU's share of the MLP (intermediate_size / tp). Allocator fragmentation, the CUDA
    context and library workspaces (vLLM's "non-torch memory", a few hundred MiB) are not counted."""
    forward = max_num_batched_tokens * (2 * hidden_size + mlp_matrices * mlp_width) * dtype_bytes
    sampler = min(max_num_seqs, max_num_batched_tokens) * vocab_size * 4 * 2
    return max(forward, sampler)


def warmup_chunks(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                  block_size: int) -> tuple[list[SeqChunk], int]:
    """The dummy step that profiles the activation peak, and how many KV blocks it writes into.

    All `max_num_batched_tokens` tokens as fresh prefills spread over as many sequences as the step may
    sample (each at most `max_model_len` long), every one sampled: the largest dense work and the largest
    logits the real steps can reach. Blocks are numbered back to back from 0."""
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                        ("max_model_len", max_model_len), ("block_size", block_size)):
        if value < 1:
            raise ConfigError(name, value, "must be >= 1")
    num_seqs = max(
        min(max_num_seqs, max_num_batched_tokens), math.ceil(max_num_batched_tokens / max_model_len)
    )
    base, extra = divmod(max_num_batched_tokens, num_seqs)
    chunks: list[SeqChunk] = []
    next_block = 0
    for i in range(num_seqs):
        n = base + (i < extra)
        nb = math.ceil(n / block_size)
        table = list(range(next_block, next_block + nb))
        next_block += nb
        chunks.append(
            SeqChunk(seq_id=i, token_ids=[i % 7 + 1] * n, start_pos=0, block_table=table, sample=True)
        )
    return chunks, next_block


def measure_cuda_memory(run_warmup: Callable[[], object], free_warmup_state: Callable[[], None],
                        device: torch.device | str) -> MemoryProfile:
    """Run the warm-up, note its peak, release what it held (`free_warmup_state`), read the driver."""
    import torch

    dev = torch.device(device)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    run_warmup()
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - before
    free_warmup_state()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    return MemoryProfile(total_bytes=total, used_bytes=total - free, activation_peak_bytes=max(0, peak))
