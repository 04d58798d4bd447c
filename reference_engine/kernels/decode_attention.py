"""Triton paged decode attention: one query token per sequence over its KV cache, read through the block table.

Flash-decoding: the context is cut into `num_splits` partitions computed by separate programs, each
leaving an unnormalised partial output and its log-sum-exp; a second kernel combines them. One program
per (sequence, KV head, split) handles all `group` query heads of that KV head, so each K/V tile is
loaded once for the group (GQA), not once per query head.

No host synchronisation: the grid depends only on shapes and on `max_context_len` (a host int, by
default the block table's capacity), so a decode step using it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from reference_engine.kernels.paged_tiles import load_kv_tile, paged_slots

_LOG2E = 1.4426950408889634
_BLOCK_N = 64  # context tokens per inner-loop tile
_MIN_PARTITION = 256  # fewer tokens than this per split is not worth a partial output
_MAX_SPLITS = 64


@triton.jit
def _decode_partition_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,  # softmax scale × log2(e): the kernel works in base 2
    partition_len,
    stride_qs,
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
    stride_bts,
    stride_btb,
    stride_os,
    stride_oh,
    stride_od,
    stride_ps,
    stride_ph,
    stride_pk,
    stride_pd,
    stride_ls,
    stride_lh,
    stride_lk,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq64 = seq.to(tl.int64)
    context_len = tl.load(context_lens_ptr + seq)
    start = split * partition_len
    end = tl.minimum(start + partition_len, context_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(
        q_ptr + seq64 * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    # Every tile the loop visits holds at least one valid position, so m_i is finite after the first.
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < end
        block, offset = paged_slots(block_tables_ptr, seq64, pos, n_mask, stride_bts, stride_btb, BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = load_kv_tile(
            k_cache_ptr, block, offset, kv_head, d, kv_mask, stride_kb, stride_ko, stride_kh, stride_kd
        )
        qk = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale  # [G, N]
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_kv_tile(
            v_cache_ptr, block, offset, kv_head, d, kv_mask, stride_vb, stride_vo, stride_vh, stride_vd
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    safe_l = tl.where(l_i > 0.0, l_i, 1.0)  # an empty partition (past the context) has l = 0
    o = acc / safe_l[:, None]
    o_mask = g_mask[:, None] & d_mask[None, :]
    if IS_SPLIT:
        tl.store(
            part_out_ptr
            + seq64 * stride_ps
            + heads[:, None] * stride_ph
            + split * stride_pk
            + d[None, :] * stride_pd,
            o,
            mask=o_mask,
        )
        lse = tl.where(l_i > 0.0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + seq64 * stride_ls + heads * stride_lh + split * stride_lk, lse, mask=g_mask)
    else:
        tl.store(
            out_ptr + seq64 * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=o_mask,
        )


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_ps,
    stride_ph,
    stride_pk,
    stride_pd,
    stride_ls,
    stride_lh,
    stride_lk,
    stride_os,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = s < num_splits
    d_mask = d < HEAD_DIM
    lse = tl.load(
        part_lse_ptr + seq * stride_ls + head * stride_lh + s * stride_lk, mask=s_mask, other=float("-inf")
    )
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all splits empty only for a zero-length context
    w = tl.exp2(lse - m)  # empty partitions weigh exp2(-inf) = 0
    parts = tl.load(
        part_out_ptr + seq * stride_ps + head * stride_ph + s[:, None] * stride_pk + d[None, :] * stride_pd,
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    total = tl.sum(w, 0)
    o = tl.sum(parts * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + d * stride_od,
        o.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # interpreter: parallelism buys nothing, splitting only costs a reduce


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Enough programs to fill the GPU twice over, but no partition shorter than _MIN_PARTITION tokens."""
    by_length = math.ceil(max_context_len / _MIN_PARTITION)
    by_occupancy = math.ceil(2 * _num_sms(device) / max(1, num_seqs * num_kv_heads))
    return max(1, min(by_length, by_occupancy, _MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, n_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, >= 1
    scale: float,
    *,
    num_splits: int | None = None,  # None = choose from the shapes; 1 = no split-K
    max_context_len: int | None = None,  # upper bound on context_lens; None = the block table's capacity
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs, n_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if n_heads % num_kv_heads != 0:
        raise ValueError(f"n_heads={n_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    group = n_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, q.device)
    num_splits = max(1, min(num_splits, math.ceil(max_context_len / 16)))
    # Partitions are whole tiles so no tile straddles two programs.
    partition_len = triton.cdiv(triton.cdiv(max_context_len, num_splits), _BLOCK_N) * _BLOCK_N
    num_splits = triton.cdiv(max_context_len, partition_len)
    is_split = num_splits > 1
    if is_split:
        part_out = torch.empty(num_seqs, n_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, n_heads, num_splits, dtype=torch.float32, device=q.device)
    else:  # never written: pass any float32 tensor so the strides exist
        part_out = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dimension >= 16
    _decode_partition_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_out,
        part_lse,
        scale * _LOG2E,
        partition_len,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        *part_out.stride(),
        *part_lse.stride(),
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_N=_BLOCK_N,
        IS_SPLIT=is_split,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    if is_split:
        _decode_reduce_kernel[(num_seqs, n_heads)](
            part_out,
            part_lse,
            out,
            num_splits,
            *part_out.stride(),
            *part_lse.stride(),
            *out.stride(),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out
