"""Attention and KV-cache kernels: Triton on CUDA, plain torch elsewhere.

The dispatchers below pick the Triton kernel when the tensors are on a CUDA device (or when
`SLOBENCH_FORCE_TRITON=1`, which the tests use with `TRITON_INTERPRET=1` on the CPU) and the torch
equivalent in `torch_ref` otherwise. Triton is imported only when a Triton kernel is first used, so this
package imports cleanly without it.

Call order in a step, per layer: `write_kv` for every token of the step, then `extend_attention` for
chunks with more than one new token (or any chunk) and `paged_decode_attention` for one-token chunks.

`rms_norm`, `add_rms_norm`, `apply_rotary_` and `silu_and_mul` fuse the model's elementwise ops (one
launch each instead of 2-14); the model routes through them when its `use_fused_kernels` is set.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from reference_engine.kernels import torch_ref

__all__ = [
    "add_rms_norm",
    "apply_rotary_",
    "extend_attention",
    "paged_decode_attention",
    "rms_norm",
    "silu_and_mul",
    "triton_available",
    "uses_triton",
    "write_kv",
]


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def uses_triton(t: torch.Tensor) -> bool:
    """Whether the dispatchers run Triton kernels for tensors on `t`'s device."""
    if not triton_available():
        return False
    return t.is_cuda or os.environ.get("SLOBENCH_FORCE_TRITON") == "1"


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    if uses_triton(k):
        from reference_engine.kernels.kv_write import write_kv as impl
    else:
        impl = torch_ref.write_kv
    impl(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, n_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32 (int64 accepted)
    context_lens: torch.Tensor,  # [num_seqs] int32, including the token being decoded; 0 = padding row
    scale: float,
    *,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its context (write its K/V with `write_kv` first).

    Triton path: `num_splits` None picks the split-K count from the shapes (1 = no split);
    `max_context_len` must be >= every context length (positions past it are never read) and defaults
    to the block table's capacity, so no host sync is needed and the call can be CUDA-graph captured.
    A padding row (context 0) yields zeros. `out` lets a captured graph reuse one output buffer.
    """
    if uses_triton(q):
        from reference_engine.kernels.decode_attention import paged_decode_attention as impl
    else:
        impl = torch_ref.paged_decode_attention
    return impl(
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale,
        num_splits=num_splits,
        max_context_len=max_context_len,
        out=out,
    )


def extend_attention(
    q: torch.Tensor,  # [total_new_tokens, n_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    prefix_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32 (int64 accepted)
    scale: float,
    *,
    max_seqlen_q: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix and themselves, all read
    through the block table (write the new tokens' K/V with `write_kv` first). Serves fresh prefills
    (prefix 0), chunked prefill and prefix-cache hits alike. `max_seqlen_q` must be >= the longest run
    of new tokens; pass it from the host to avoid a device sync (None reads it from cu_seqlens_q).
    """
    if uses_triton(q):
        from reference_engine.kernels.prefill_attention import extend_attention as impl
    else:
        impl = torch_ref.extend_attention
    return impl(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        prefix_lens,
        block_tables,
        scale,
        max_seqlen_q=max_seqlen_q,
        out=out,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, times `weight`: x [..., dim] -> [..., dim]."""
    if uses_triton(x):
        from reference_engine.kernels.fused import rms_norm as impl
    else:
        impl = torch_ref.rms_norm
    return impl(x, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass: the residual add that ends one sublayer fused
    with the norm that starts the next. Neither input is modified."""
    if uses_triton(x):
        from reference_engine.kernels.fused import rms_norm as impl
    else:
        impl = torch_ref.rms_norm
    normed, new_residual = impl(x, weight, eps, residual)
    assert new_residual is not None
    return normed, new_residual


def apply_rotary_(
    q: torch.Tensor,  # [T, n_heads, head_dim]
    k: torch.Tensor,  # [T, n_kv_heads, head_dim]
    positions: torch.Tensor,  # [T] int
    cos_table: torch.Tensor,  # [max_seq_len, head_dim // 2] fp32, indexed by position
    sin_table: torch.Tensor,
) -> None:
    """Rotary embedding (HF rotate-half pairing) of q and k, in place, in one launch."""
    if uses_triton(q):
        from reference_engine.kernels.fused import apply_rotary_ as impl
    else:
        impl = torch_ref.apply_rotary_
    impl(q, k, positions, cos_table, sin_table)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up from the fused gate/up matmul's output [..., 2 * ffn_dim] (gate first)."""
    if uses_triton(gate_up):
        from reference_engine.kernels.fused import silu_and_mul as impl
    else:
        impl = torch_ref.silu_and_mul
    return impl(gate_up)
