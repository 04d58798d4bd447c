"""Triton kernels that fuse the model's small elementwise ops: RMSNorm (with the residual add), rotary
embedding, SiLU·mul.

Eager torch runs RMSNorm as ~8 kernels, rotary as ~14 (q and k) and SiLU·mul as 2, plus two residual
adds: about 26 launches per layer that each read and write a [T, dim] activation. At decode batch sizes
those launches cost about as much as the weight read itself; here each becomes one launch.

Rounding follows the model's torch code (`reference_engine.model`): statistics in fp32, the normed value
rounded to the activation dtype before the weight multiply, SiLU rounded before the multiply by `up`,
the cos/sin tables rounded to the activation dtype. Rotary then computes in fp32 and rounds once, where
torch rounds after every op: in bf16 the two may differ by an ulp, in fp32 they agree to rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_SILU_BLOCK = 1024  # columns per program: a [T, 8192] FFN activation gets 8 programs per row


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    dim,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # The new residual is rounded to the activation dtype, as the model's `x + h` is, and the norm
        # reads the rounded value: the next layer sees the same stream either way.
        h = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, h, mask=mask)
        x = h.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / dim
    normed = (x * (1.0 / tl.sqrt(mean_sq + eps))).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed.to(tl.float32) * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, dim] with a unit column stride (a view when it already is one)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(
    x: torch.Tensor,  # [..., dim]
    weight: torch.Tensor,  # [dim]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., dim]: add it to x first
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rmsnorm(x + residual) * weight, x + residual), or (rmsnorm(x) * weight, None) without a residual.
    One program per row; the inputs are not modified."""
    dim = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res2 = res_out = None
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        res2 = _rows(residual)
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            x2 if res2 is None else res2,  # unread without a residual: any pointer will do
            weight,
            out,
            out if res_out is None else res_out,
            x2.stride(0),
            x2.stride(0) if res2 is None else res2.stride(0),
            out.stride(0),
            out.stride(0) if res_out is None else res_out.stride(0),
            dim,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(dim),
        )
    return out.view(x.shape), None if res_out is None else res_out.view(x.shape)


@triton.jit
def _rotate_heads(x_ptr, t, stride_t, stride_h, stride_d, cos, sin, NUM_HEADS: tl.constexpr,
                  HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HALF_PAD)
    mask = (h[:, None] < NUM_HEADS) & (d[None, :] < HALF)
    p1 = x_ptr + t * stride_t + h[:, None] * stride_h + d[None, :] * stride_d
    p2 = p1 + HALF * stride_d
    # Rotate-half pairing (HF Llama): element i pairs with i + head_dim / 2.
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(p1, (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=mask)
    tl.store(p2, (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_cp,
    stride_cd,
    stride_sp,
    stride_sd,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF_PAD)
    d_mask = d < HALF
    # The model rounds its fp32 tables to the activation dtype before use: so does this kernel.
    dtype = q_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * stride_cp + d * stride_cd, mask=d_mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sp + d * stride_sd, mask=d_mask, other=0.0).to(dtype).to(tl.float32)
    _rotate_heads(
        q_ptr, t, stride_qt, stride_qh, stride_qd, cos, sin, NUM_Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD
    )
    _rotate_heads(
        k_ptr, t, stride_kt, stride_kh, stride_kd, cos, sin, NUM_K_HEADS, K_HEADS_PAD, HALF, HALF_PAD
    )


def apply_rotary_(
    q: torch.Tensor,  # [T, n_heads, head_dim], rotated in place (any strides: a view of the qkv matmul)
    k: torch.Tensor,  # [T, n_kv_heads, head_dim], rotated in place
    positions: torch.Tensor,  # [T] int: absolute position of each token
    cos_table: torch.Tensor,  # [max_seq_len, head_dim // 2] fp32, Llama-3 scaling already applied
    sin_table: torch.Tensor,
) -> None:
    """Rotary embedding of q and k in one launch, one program per token."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or positions.shape != (num_tokens,):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, positions "
                         f"{tuple(positions.shape)} do not agree")
    if head_dim % 2 or cos_table.shape[-1] != head_dim // 2:
        raise ValueError(f"head_dim {head_dim} must be even and the tables hold {cos_table.shape[-1]} "
                         "frequencies, not head_dim / 2")
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_table,
        sin_table,
        *q.stride(),
        *k.stride(),
        *cos_table.stride(),
        *sin_table.stride(),
        NUM_Q_HEADS=num_q_heads,
        NUM_K_HEADS=num_k_heads,
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        K_HEADS_PAD=triton.next_power_of_2(num_k_heads),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
    )


@triton.jit
def _silu_and_mul_kernel(gu_ptr, out_ptr, stride_g, stride_o, ffn_dim, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn_dim
    gate = tl.load(gu_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_g + ffn_dim + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # torch rounds F.silu's output too
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2 * ffn_dim] (gate first, then up, as the fused w13 matmul lays them out) →
    SiLU(gate) * up [..., ffn_dim]."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim {gate_up.shape[-1]} must be even (gate and up halves)")
    ffn_dim = gate_up.shape[-1] // 2
    gu = _rows(gate_up)
    out = torch.empty(gu.shape[0], ffn_dim, dtype=gate_up.dtype, device=gate_up.device)
    if gu.shape[0] > 0:
        block = min(_SILU_BLOCK, triton.next_power_of_2(ffn_dim))
        _silu_and_mul_kernel[(gu.shape[0], triton.cdiv(ffn_dim, block))](
            gu, out, gu.stride(0), out.stride(0), ffn_dim, BLOCK=block
        )
    return out.view(*gate_up.shape[:-1], ffn_dim)
