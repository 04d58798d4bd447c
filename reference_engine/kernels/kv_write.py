"""Triton KV-cache write by slot mapping: token t's K/V go to slot `slot_mapping[t]`, -1 skips it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_token_heads(src_ptr, dst_ptr, t64, block, offset, h, d, mask, stride_t, stride_h, stride_d,
                      stride_cb, stride_co, stride_ch, stride_cd):
    """Token t64's [heads, head_dim] row of K (or V) into its cache slot (block, offset)."""
    x = tl.load(src_ptr + t64 * stride_t + h[:, None] * stride_h + d[None, :] * stride_d, mask=mask)
    dst = dst_ptr + block * stride_cb + offset * stride_co + h[:, None] * stride_ch + d[None, :] * stride_cd
    tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kco,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vco,
    stride_vch,
    stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token (e.g. a CUDA-graph batch padded up to its captured size)
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    # int64 offsets: a large cache holds more than 2**31 elements.
    t64 = t.to(tl.int64)
    _copy_token_heads(k_ptr, k_cache_ptr, t64, block, offset, h, d, mask, stride_kt, stride_kh, stride_kd,
                      stride_kcb, stride_kco, stride_kch, stride_kcd)
    _copy_token_heads(v_ptr, v_cache_ptr, t64, block, offset, h, d, mask, stride_vt, stride_vh, stride_vd,
                      stride_vcb, stride_vco, stride_vch, stride_vcd)


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
    )
