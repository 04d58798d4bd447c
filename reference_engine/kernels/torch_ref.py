"""Plain-torch equivalents of the Triton kernels: the CPU path of the engine and the oracle in tests.

Same signatures as the dispatchers in `reference_engine.kernels`. Attention is computed in fp32 whatever
the cache dtype, so the oracle is at least as precise as the kernels it checks.

KV cache layout (shared with the executor): per layer `k_cache`, `v_cache` of shape
[num_blocks, block_size, num_kv_heads, head_dim]; position p of a sequence lives at slot
`block_table[p // block_size] * block_size + p % block_size` of the flattened view
`cache.view(-1, num_kv_heads, head_dim)`.
"""

from __future__ import annotations

import torch


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = padding: skip
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = v[keep].to(v_cache.dtype)


def _slots(block_table: torch.Tensor, num_positions: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(num_positions, device=block_table.device)
    return block_table[pos // block_size].long() * block_size + pos % block_size


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None):
    """q [m, n_heads, d], k/v [n, n_kv_heads, d], mask [m, n] (True = attend) → [m, n_heads, d] fp32."""
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    group = n_heads // n_kv_heads
    # GQA: query head h reads KV head h // group, i.e. consecutive query heads share a KV head.
    qf = q.float().reshape(q.shape[0], n_kv_heads, group, q.shape[2]).permute(1, 2, 0, 3)  # [kvh, g, m, d]
    kf = k.float().permute(1, 0, 2).unsqueeze(1)  # [kvh, 1, n, d]
    vf = v.float().permute(1, 0, 2).unsqueeze(1)
    scores = (qf @ kf.transpose(-1, -2)) * scale  # [kvh, g, m, n]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vf  # [kvh, g, m, d]
    return out.permute(2, 0, 1, 3).reshape(q.shape[0], n_heads, q.shape[2])


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, n_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor,  # [num_seqs] int32; 0 marks a padding row (output zeros)
    scale: float,
    *,
    num_splits: int | None = None,  # split-K is a Triton launch detail; accepted for the same signature
    max_context_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    del num_splits, max_context_len
    num_seqs, n_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // num_kv_heads
    # One padded gather for the whole batch: the CPU engine calls this every decode step.
    max_len = int(context_lens.max())
    pos = torch.arange(max_len, device=q.device)
    block_idx = (pos // block_size).clamp(max=block_tables.shape[1] - 1)
    slots = block_tables[:, block_idx].long() * block_size + pos % block_size  # [num_seqs, max_len]
    valid = pos[None, :] < context_lens[:, None].long()
    slots = torch.where(valid, slots, 0)
    # Padding positions read slot 0, which may hold anything (even NaN): zero them so 0 × NaN cannot leak.
    pad = ~valid[:, :, None, None]
    k = k_cache.view(-1, num_kv_heads, head_dim)[slots].float().masked_fill(pad, 0.0)  # [s, len, kvh, d]
    v = v_cache.view(-1, num_kv_heads, head_dim)[slots].float().masked_fill(pad, 0.0)
    qf = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", qf, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    res = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v).reshape(
        num_seqs, n_heads, head_dim
    )
    # A padding row (context 0, e.g. a CUDA-graph batch filled up to its size) has softmax 0/0: make it 0.
    res = res.masked_fill((context_lens == 0)[:, None, None], 0.0)
    if out is None:
        return res.to(q.dtype)
    out.copy_(res)
    return out


def extend_attention(
    q: torch.Tensor,  # [total_new_tokens, n_heads, head_dim], sequences packed back to back
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32: sequence i's new tokens are q[cu[i]:cu[i+1]]
    prefix_lens: torch.Tensor,  # [num_seqs] int32: positions already in the cache before the new tokens
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    max_seqlen_q: int | None = None,  # Triton launch detail; accepted for the same signature
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its prefix and themselves.

    The new tokens' K/V must already be in the cache (`write_kv` first): everything is read through the
    block table, so a chunked prefill or a prefix-cache hit is the same call with a non-zero prefix.
    """
    del max_seqlen_q
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    if out is None:
        out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    prefixes = prefix_lens.tolist()
    for i in range(len(prefixes)):
        start, end, prefix = int(cu[i]), int(cu[i + 1]), int(prefixes[i])
        num_new = end - start
        if num_new == 0:
            continue
        total = prefix + num_new
        slots = _slots(block_tables[i], total, block_size)
        q_pos = prefix + torch.arange(num_new, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]  # [num_new, total]
        out[start:end] = _attend(q[start:end], k_flat[slots], v_flat[slots], scale, mask).to(out.dtype)
    return out


# Fused elementwise ops (`fused.py`): the same torch ops, in the same order, as `reference_engine.model`,
# so the kernels backend on a CPU gives bit-identical outputs to the model's own code.


def rms_norm(
    x: torch.Tensor,  # [..., dim]
    weight: torch.Tensor,  # [dim]
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if residual is not None:
        x = x + residual
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight
    return normed, None if residual is None else x


def apply_rotary_(
    q: torch.Tensor,  # [T, n_heads, head_dim], rotated in place
    k: torch.Tensor,  # [T, n_kv_heads, head_dim], rotated in place
    positions: torch.Tensor,  # [T] int
    cos_table: torch.Tensor,  # [max_seq_len, head_dim // 2] fp32
    sin_table: torch.Tensor,
) -> None:
    cos = cos_table[positions].to(q.dtype).unsqueeze(1)  # [T, 1, head_dim // 2]
    sin = sin_table[positions].to(q.dtype).unsqueeze(1)
    for x in (q, k):
        x1, x2 = x.chunk(2, dim=-1)  # rotate-half pairing (i, i + head_dim / 2)
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
