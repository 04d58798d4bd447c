"""Triton helpers shared by the paged attention kernels: where a tile of context positions lives in the
KV cache, and loading one head's K or V tile from there.

Called from inside `@triton.jit` kernels, which inline them; strides and constexprs are passed
explicitly because a jit function sees only its arguments.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_slots(block_tables_ptr, seq64, pos, n_mask, stride_bts, stride_btb, BLOCK_SIZE: tl.constexpr):
    """(cache block, offset in the block) of each context position in `pos` for sequence `seq64`.

    Masked-off positions read block 0: their K/V loads are masked too, so the block is never used.
    """
    block = tl.load(
        block_tables_ptr + seq64 * stride_bts + (pos // BLOCK_SIZE) * stride_btb, mask=n_mask, other=0
    ).to(tl.int64)  # int64 offsets: a large cache holds more than 2**31 elements
    offset = pos % BLOCK_SIZE
    return block, offset


@triton.jit
def load_kv_tile(cache_ptr, block, offset, kv_head, d, kv_mask, stride_b, stride_o, stride_h, stride_d):
    """[positions, head_dim] tile of one KV head from a [num_blocks, block_size, num_kv_heads, head_dim]
    cache; zeros where `kv_mask` is off."""
    return tl.load(
        cache_ptr
        + block[:, None] * stride_b
        + offset[:, None] * stride_o
        + kv_head * stride_h
        + d[None, :] * stride_d,
        mask=kv_mask,
        other=0.0,
    )
