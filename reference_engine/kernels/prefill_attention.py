"""Triton prefill / extend attention: each sequence's new tokens attend causally over its cached prefix and
themselves, everything read through the block table.

Call `write_kv` for the new tokens first: the kernel reads prefix and new keys alike from the cache, so a
fresh prefill (prefix 0), a chunk of a chunked prefill and a prefix-cache hit are one code path. A query
at position p sees keys 0..p only, so a chunk never reads KV past `prefix + num_new` (not written yet).
Varlen layout: sequences' new tokens are packed back to back in q, delimited by `cu_seqlens_q`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels.paged_tiles import load_kv_tile, paged_slots

_LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_seqlens_ptr,
    prefix_lens_ptr,
    block_tables_ptr,
    qk_scale,  # softmax scale × log2(e): the kernel works in base 2
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bts,
    stride_btb,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    num_new = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= num_new:  # the grid is sized for the longest sequence
        return
    prefix = tl.load(prefix_lens_ptr + seq)
    kv_head = head // GROUP
    seq64 = seq.to(tl.int64)

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM_PAD)
    m_mask = offs_m < num_new
    d_mask = d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :] * stride_qd,
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = prefix + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    # The last query of this tile sees up to its own position; nothing later is read.
    kv_end = prefix + tl.minimum((m_block + 1) * BLOCK_M, num_new)
    # Position 0 is in the first tile and visible to every query, so m_i is finite after it.
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < kv_end
        block, offset = paged_slots(block_tables_ptr, seq64, pos, n_mask, stride_bts, stride_btb, BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = load_kv_tile(
            k_cache_ptr, block, offset, kv_head, d, kv_mask, stride_kb, stride_ko, stride_kh, stride_kd
        )
        qk = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale  # [M, N]
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_kv_tile(
            v_cache_ptr, block, offset, kv_head, d, kv_mask, stride_vb, stride_vo, stride_vh, stride_vd
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :] * stride_od,
        o.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def extend_attention(
    q: torch.Tensor,  # [total_new_tokens, n_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    prefix_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    max_seqlen_q: int | None = None,  # longest new-token run; None = read it from the device (a sync)
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    total_tokens, n_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if n_heads % num_kv_heads != 0:
        raise ValueError(f"n_heads={n_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if out is None:
        out = torch.empty_like(q)
    num_seqs = prefix_lens.shape[0]
    if total_tokens == 0 or num_seqs == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    # Small tiles for short runs: decode-like chunks would otherwise waste most of a 64-row tile.
    block_m = 64 if max_seqlen_q > 32 else 16
    block_n = 64
    grid = (triton.cdiv(max_seqlen_q, block_m), n_heads, num_seqs)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q,
        prefix_lens,
        block_tables,
        scale * _LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *out.stride(),
        *block_tables.stride(),
        BLOCK_SIZE=block_size,
        GROUP=n_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    return out
