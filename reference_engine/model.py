"""A Llama-style transformer in one file: RMSNorm, rotary embedding, grouped-query attention, SwiGLU.

The model does not own a KV cache. Every layer hands its rotated q/k/v to an `attend` function chosen by
the caller: `forward_dense` attends causally over the whole sequence (the test oracle), the torch executor
writes K/V into its paged cache and attends per request. So both paths share every dense layer.

Weights follow Hugging Face's Llama layout (rotate-half rotary, [out, in] linears) except that q/k/v and
gate/up are fused into one matmul each (as gpt-fast does): fewer, larger matmuls on a small CPU.

With `Transformer.use_fused_kernels` set (the executor sets it for its "kernels" attention backend), the
norms, residual adds, rotary and SiLU·mul go through `reference_engine.kernels` instead: one fused launch
each (Triton on CUDA) where eager torch runs ~26 small kernels per layer. Off, the plain torch code runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reference_engine import kernels
from reference_engine.model_config import CONFIGS, ModelConfig, RopeScaling, get_config  # noqa: F401  (re-exported)

# attend(layer_idx, q [T, n_heads, head_dim], k [T, n_kv_heads, head_dim], v [T, n_kv, hd]) -> [T, n_heads, hd]
AttendFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    inv_freq = 1.0 / (
        cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    )
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    # Long wavelengths are stretched by `factor`, short ones kept, the band between interpolated.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = s.original_max_seq_len / s.low_freq_factor
    high_wavelen = s.original_max_seq_len / s.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_seq_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def rope_table(cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos, sin of shape [max_seq_len, head_dim // 2], indexed by absolute position."""
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), rope_inv_freq(cfg))
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x [T, heads, head_dim]; cos/sin [T, 1, head_dim // 2]; HF's rotate-half pairing (i, i + head_dim/2).
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, layer_idx: int, attend: AttendFn) -> Tensor:
        num_tokens = x.shape[0]
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(num_tokens, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(num_tokens, self.n_kv_heads, self.head_dim), cos, sin)
        v = v.view(num_tokens, self.n_kv_heads, self.head_dim)
        out = attend(layer_idx, q, k, v)  # [T, n_heads, head_dim]
        return self.wo(out.reshape(num_tokens, q_size))

    def forward_fused(self, x: Tensor, positions: Tensor, cos_table: Tensor, sin_table: Tensor,
                      layer_idx: int, attend: AttendFn) -> Tensor:
        num_tokens = x.shape[0]
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        # Strided views of the qkv output, rotated in place: no copies, one launch for q and k.
        q = q.view(num_tokens, self.n_heads, self.head_dim)
        k = k.view(num_tokens, self.n_kv_heads, self.head_dim)
        kernels.apply_rotary_(q, k, positions, cos_table, sin_table)
        out = attend(layer_idx, q, k, v.view(num_tokens, self.n_kv_heads, self.head_dim))
        return self.wo(out.reshape(num_tokens, q_size))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)

    def forward_fused(self, x: Tensor) -> Tensor:
        return self.w2(kernels.silu_and_mul(self.w13(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, layer_idx: int, attend: AttendFn) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, layer_idx, attend)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward_fused(self, x: Tensor, residual: Tensor | None, positions: Tensor, cos_table: Tensor,
                      sin_table: Tensor, layer_idx: int, attend: AttendFn) -> tuple[Tensor, Tensor]:
        """(sublayer output, residual stream) -> the same pair one block later. The output is not yet
        added to the stream: the next norm adds it in its own launch (vLLM's fused_add_rms_norm)."""
        if residual is None:  # first block: the embedding is the stream
            residual, h = x, kernels.rms_norm(x, self.attention_norm.weight, self.attention_norm.eps)
        else:
            norm = self.attention_norm
            h, residual = kernels.add_rms_norm(x, residual, norm.weight, norm.eps)
        attn = self.attention.forward_fused(h, positions, cos_table, sin_table, layer_idx, attend)
        h, residual = kernels.add_rms_norm(attn, residual, self.ffn_norm.weight, self.ffn_norm.eps)
        return self.feed_forward.forward_fused(h), residual


class Transformer(nn.Module):
    rope_cos: Tensor  # [max_seq_len, head_dim // 2], fp32 buffers
    rope_sin: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.use_fused_kernels = False  # route elementwise ops through `reference_engine.kernels`
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_table(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, token_ids: Tensor, positions: Tensor, attend: AttendFn) -> Tensor:
        """token_ids, positions [T] -> final-normed hidden states [T, dim] (no vocab projection: the
        executor projects only the rows it samples from)."""
        x = self.tok_embeddings(token_ids)
        if self.use_fused_kernels:
            return self._forward_fused(x, positions, attend)
        cos = self.rope_cos[positions].to(x.dtype).unsqueeze(1)  # [T, 1, head_dim // 2]
        sin = self.rope_sin[positions].to(x.dtype).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attend)
        return self.norm(x)

    def _forward_fused(self, x: Tensor, positions: Tensor, attend: AttendFn) -> Tensor:
        residual: Tensor | None = None
        for i, layer in enumerate(cast("list[Block]", self.layers)):
            x, residual = layer.forward_fused(x, residual, positions, self.rope_cos, self.rope_sin, i, attend)
        assert residual is not None
        return kernels.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]

    def logits(self, hidden: Tensor) -> Tensor:
        return self.output(hidden).float()  # [N, vocab]

    @torch.inference_mode()
    def forward_dense(self, token_ids: list[int] | Tensor) -> Tensor:
        """Plain causal forward of one sequence, no paging: logits [T, vocab]. The test oracle."""
        device = self.tok_embeddings.weight.device
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
        positions = torch.arange(ids.shape[0], device=device)
        return self.logits(self.forward(ids, positions, dense_causal_attend))


def dense_causal_attend(layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    del layer_idx  # one sequence, nothing cached: every layer attends the same way
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1)


@torch.no_grad()
def init_dummy_weights(model: Transformer, seed: int) -> None:
    """Seeded random weights scaled so activations keep unit RMS and logits have a spread of a few units:
    greedy decoding is then deterministic (no near-ties) yet depends on the whole prompt."""
    cfg = model.config
    gen = torch.Generator(device=model.rope_cos.device).manual_seed(seed)

    def normal_(p: Tensor, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32) * std)

    # Tied: the embedding is also the output matrix, so its scale sets the logit spread.
    normal_(model.tok_embeddings.weight, 3.0 / math.sqrt(cfg.dim) if cfg.tie_embeddings else 1.0)
    for layer in model.layers:
        assert isinstance(layer, Block)
        normal_(layer.attention.wqkv.weight, 1.0 / math.sqrt(cfg.dim))
        normal_(layer.attention.wo.weight, 1.0 / math.sqrt(cfg.dim))
        normal_(layer.feed_forward.w13.weight, 1.0 / math.sqrt(cfg.dim))
        normal_(layer.feed_forward.w2.weight, 1.0 / math.sqrt(cfg.ffn_dim))
        for norm in (layer.attention_norm, layer.ffn_norm):
            norm.weight.fill_(1.0)
    if cfg.tie_embeddings:
        # The input embedding rides the residual stream to the output; with the same matrix on both ends
        # it would favour repeating the current token. Random signs on the final norm cancel that bias.
        model.norm.weight.copy_(torch.randint(0, 2, (cfg.dim,), generator=gen, device=gen.device) * 2.0 - 1.0)
    else:
        model.norm.weight.fill_(1.0)
        normal_(model.output.weight, 3.0 / math.sqrt(cfg.dim))


def empty_model(
    cfg: ModelConfig, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Transformer:
    """A model with uninitialised weights, allocated once, directly in `dtype` on `device`."""
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    model = model.to_empty(device=device)
    if cfg.tie_embeddings:  # to_empty off meta makes a new Parameter per module: tie them again
        model.output.weight = model.tok_embeddings.weight
    cos, sin = rope_table(cfg)  # kept in fp32: rounding the table would shift far positions
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def build_model(
    model_config: str | ModelConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Transformer:
    """A model with seeded dummy weights (vLLM's `--load-format dummy`), in eval mode."""
    model = empty_model(get_config(model_config), dtype=dtype, device=device)
    init_dummy_weights(model, seed)
    return model
