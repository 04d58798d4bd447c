"""Fused elementwise kernels (RMSNorm + residual, rotary, SiLU·mul) against their torch twins and the
model's own torch code, and the model with and without them.

Without CUDA the Triton kernels run through Triton's interpreter (fp32: numpy has no bf16); with CUDA they
run compiled. The model's plain torch path must stay bit-identical when the fused flag is off.
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must precede the first import of a Triton kernel module: triton.jit reads it when decorating.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from engine_helpers import greedy, one_torch_thread, prefill_then_decode  # noqa: E402

from reference_engine import kernels  # noqa: E402
from reference_engine.executor.torch_executor import TorchExecutor  # noqa: E402
from reference_engine.kernels import fused, torch_ref  # noqa: E402
from reference_engine.model import (  # noqa: E402
    CONFIGS,
    Block,
    RMSNorm,
    Transformer,
    apply_rope,
    build_model,
    dense_causal_attend,
    rope_table,
)

pytestmark = pytest.mark.kernels

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
TOL = {"atol": 2e-5, "rtol": 2e-5}


_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


def randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE)


# --- RMSNorm, with and without the residual add ------------------------------------------------------


@pytest.mark.parametrize("num_tokens, dim", [(1, 256), (7, 37), (3, 2048)])
def test_rms_norm_matches_twin_and_model(num_tokens: int, dim: int) -> None:
    x, weight = randn(num_tokens, dim, seed=1) * 3, randn(dim, seed=2)
    x_before = x.clone()
    got, no_residual = fused.rms_norm(x, weight, 1e-5)
    want, _ = torch_ref.rms_norm(x, weight, 1e-5)
    norm = RMSNorm(dim, 1e-5).to(DEVICE)
    norm.weight.data.copy_(weight)
    with torch.no_grad():
        model_out = norm(x)
    assert no_residual is None and got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got, model_out, **TOL)
    assert torch.equal(want, model_out)  # the twin is the model's code
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("num_tokens, dim", [(1, 256), (5, 37)])
def test_add_rms_norm_returns_the_new_residual_and_its_norm(num_tokens: int, dim: int) -> None:
    x, residual, weight = randn(num_tokens, dim, seed=3), randn(num_tokens, dim, seed=4), randn(dim, seed=5)
    inputs = (x.clone(), residual.clone())
    normed, new_residual = fused.rms_norm(x, weight, 1e-6, residual)
    assert new_residual is not None
    assert torch.equal(new_residual, x + residual)  # one fp32 add, the same on every backend
    twin_normed, twin_residual = torch_ref.rms_norm(x, weight, 1e-6, residual)
    assert twin_residual is not None and torch.equal(twin_residual, x + residual)
    torch.testing.assert_close(normed, twin_normed, **TOL)
    norm = RMSNorm(dim, 1e-6).to(DEVICE)
    norm.weight.data.copy_(weight)
    with torch.no_grad():
        torch.testing.assert_close(normed, norm(x + residual), **TOL)
    assert torch.equal(x, inputs[0]) and torch.equal(residual, inputs[1])


def test_rms_norm_reads_strided_rows_and_leading_dims() -> None:
    wide = randn(4, 100, seed=6)
    x = wide[:, 10:74]  # row stride 100, unit column stride: read in place
    weight = randn(64, seed=7)
    torch.testing.assert_close(
        fused.rms_norm(x, weight, 1e-5)[0], torch_ref.rms_norm(x, weight, 1e-5)[0], **TOL
    )
    x3 = randn(2, 3, 64, seed=8)
    got = fused.rms_norm(x3, weight, 1e-5)[0]
    assert got.shape == (2, 3, 64)
    torch.testing.assert_close(got, torch_ref.rms_norm(x3, weight, 1e-5)[0], **TOL)


def test_rms_norm_rejects_a_mismatched_residual() -> None:
    with pytest.raises(ValueError, match="residual shape"):
        fused.rms_norm(randn(2, 8, seed=0), randn(8, seed=0), 1e-5, randn(3, 8, seed=0))


# --- rotary --------------------------------------------------------------------------------------------


def _qkv(num_tokens: int, n_heads: int, n_kv: int, head_dim: int, seed: int):
    """q, k, v as the model makes them: strided views of one fused qkv matmul output."""
    qkv = randn(num_tokens, (n_heads + 2 * n_kv) * head_dim, seed=seed)
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    return (qkv, q.view(num_tokens, n_heads, head_dim), k.view(num_tokens, n_kv, head_dim),
            v.view(num_tokens, n_kv, head_dim))


@pytest.mark.parametrize(
    "config, num_tokens, n_heads, n_kv",
    [
        ("llama-3.2-1b", 1, 32, 8),  # hd 64, Llama-3 rope scaling in the tables, GQA 4
        ("llama-3.2-1b", 5, 6, 3),  # head counts that are not powers of two
        ("tiny", 1, 8, 2),  # hd 32
        ("tiny", 9, 8, 8),  # no GQA
    ],
)
def test_rotary_in_place_matches_twin_and_model(
    config: str, num_tokens: int, n_heads: int, n_kv: int
) -> None:
    cfg = CONFIGS[config]
    cos_table, sin_table = (t.to(DEVICE) for t in rope_table(cfg))
    rng = random.Random(num_tokens)
    positions = torch.tensor([rng.randrange(cfg.max_seq_len) for _ in range(num_tokens - 1)]
                             + [cfg.max_seq_len - 1], device=DEVICE)  # far positions too
    qkv, q, k, v = _qkv(num_tokens, n_heads, n_kv, cfg.head_dim, seed=11)
    v_before, qkv_before = v.clone(), qkv.clone()
    cos = cos_table[positions].unsqueeze(1)
    sin = sin_table[positions].unsqueeze(1)
    want_q, want_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # the model's own code

    _, tq, tk, _ = _qkv(num_tokens, n_heads, n_kv, cfg.head_dim, seed=11)
    assert torch_ref.apply_rotary_(tq, tk, positions, cos_table, sin_table) is None
    assert torch.equal(tq, want_q) and torch.equal(tk, want_k)

    assert fused.apply_rotary_(q, k, positions, cos_table, sin_table) is None
    torch.testing.assert_close(q, want_q, **TOL)
    torch.testing.assert_close(k, want_k, **TOL)
    assert torch.equal(v, v_before)  # rotated in place inside the qkv buffer, v untouched
    assert not torch.equal(qkv, qkv_before)


def test_rotary_rejects_disagreeing_shapes() -> None:
    cos, sin = rope_table(CONFIGS["tiny"])
    _, q, k, _ = _qkv(3, 8, 2, 32, seed=0)
    with pytest.raises(ValueError, match="do not agree"):
        fused.apply_rotary_(q, k[:2], torch.arange(3, device=DEVICE), cos.to(DEVICE), sin.to(DEVICE))
    with pytest.raises(ValueError, match="head_dim"):
        fused.apply_rotary_(q, k, torch.arange(3, device=DEVICE), cos[:, :8].to(DEVICE), sin.to(DEVICE))


# --- SiLU · mul ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens, ffn_dim", [(1, 768), (4, 37), (2, 1500)])
def test_silu_and_mul_matches_twin_and_model(num_tokens: int, ffn_dim: int) -> None:
    gate_up = randn(num_tokens, 2 * ffn_dim, seed=21) * 4
    before = gate_up.clone()
    got = fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    model_out = F.silu(gate) * up  # FeedForward.forward's code
    assert got.shape == (num_tokens, ffn_dim)
    assert torch.equal(torch_ref.silu_and_mul(gate_up), model_out)
    torch.testing.assert_close(got, model_out, **TOL)
    assert torch.equal(gate_up, before)


def test_silu_and_mul_keeps_leading_dims_and_rejects_odd_width() -> None:
    gate_up = randn(2, 3, 10, seed=22)
    torch.testing.assert_close(fused.silu_and_mul(gate_up), torch_ref.silu_and_mul(gate_up), **TOL)
    with pytest.raises(ValueError, match="even"):
        fused.silu_and_mul(randn(2, 9, seed=0))


# --- dispatchers ---------------------------------------------------------------------------------------


def test_dispatchers_choose_triton_only_when_forced_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def spy(name: str, impl):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return impl(*args, **kwargs)

        return wrapped

    for name in ("rms_norm", "apply_rotary_", "silu_and_mul"):
        monkeypatch.setattr(fused, name, spy(name, getattr(fused, name)))
    x, w = randn(2, 16, seed=1), randn(16, seed=2)
    _, q, k, _ = _qkv(2, 4, 2, 8, seed=3)
    cos, sin = randn(10, 4, seed=4), randn(10, 4, seed=5)
    pos = torch.tensor([3, 9], device=DEVICE)

    def run_all() -> None:
        kernels.rms_norm(x, w, 1e-5)
        kernels.add_rms_norm(x, x, w, 1e-5)
        kernels.apply_rotary_(q, k, pos, cos, sin)
        kernels.silu_and_mul(x)

    if not HAS_CUDA:
        monkeypatch.delenv("SLOBENCH_FORCE_TRITON", raising=False)
        run_all()
        assert calls == []
    monkeypatch.setenv("SLOBENCH_FORCE_TRITON", "1")
    run_all()
    assert calls == ["rms_norm", "rms_norm", "apply_rotary_", "silu_and_mul"]
    normed, residual = kernels.add_rms_norm(x, x, w, 1e-5)
    assert torch.equal(residual, x + x)
    torch.testing.assert_close(normed, torch_ref.rms_norm(x + x, w, 1e-5)[0], **TOL)


# --- the model -----------------------------------------------------------------------------------------


def _original_forward(model: Transformer, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The model's forward as it was before the fused path existed, written out op by op."""

    def norm(m: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + m.eps)).type_as(x) * m.weight

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    x = model.tok_embeddings(token_ids)
    cos = model.rope_cos[positions].to(x.dtype).unsqueeze(1)
    sin = model.rope_sin[positions].to(x.dtype).unsqueeze(1)
    num_tokens = x.shape[0]
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, Block)
        a = layer.attention
        q_size, kv_size = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        q, k, v = a.wqkv(norm(layer.attention_norm, x)).split([q_size, kv_size, kv_size], dim=-1)
        q = rope(q.view(num_tokens, a.n_heads, a.head_dim), cos, sin)
        k = rope(k.view(num_tokens, a.n_kv_heads, a.head_dim), cos, sin)
        out = dense_causal_attend(i, q, k, v.view(num_tokens, a.n_kv_heads, a.head_dim))
        h = x + a.wo(out.reshape(num_tokens, q_size))
        gate, up = layer.feed_forward.w13(norm(layer.ffn_norm, h)).chunk(2, dim=-1)
        x = h + layer.feed_forward.w2(F.silu(gate) * up)
    return norm(model.norm, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flag_off_is_bit_identical_to_the_original_forward(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("a fused kernel ran with use_fused_kernels off")

    for name in ("rms_norm", "add_rms_norm", "apply_rotary_", "silu_and_mul"):
        monkeypatch.setattr(kernels, name, forbidden)
    model = build_model("tiny", seed=3, dtype=dtype)
    assert model.use_fused_kernels is False  # the default
    ids = torch.tensor([random.Random(1).randrange(512) for _ in range(21)])
    positions = torch.arange(21)
    with torch.inference_mode():
        got = model(ids, positions, dense_causal_attend)
        want = _original_forward(model, ids, positions)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flag_on_with_the_torch_twins_is_bit_identical(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU kernels backend (twins, not Triton) must not change a single bit either."""
    monkeypatch.delenv("SLOBENCH_FORCE_TRITON", raising=False)
    model = build_model("tiny", seed=4, dtype=dtype)
    ids = [random.Random(2).randrange(512) for _ in range(13)]
    plain = model.forward_dense(ids)
    model.use_fused_kernels = True
    assert torch.equal(model.forward_dense(ids), plain)


def test_flag_on_with_triton_matches_the_plain_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOBENCH_FORCE_TRITON", "1")
    model = build_model("tiny", seed=5, device=DEVICE)
    ids = [random.Random(3).randrange(512) for _ in range(11)]
    plain = model.forward_dense(ids)
    model.use_fused_kernels = True
    fused_logits = model.forward_dense(ids)
    torch.testing.assert_close(fused_logits, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(fused_logits.argmax(-1), plain.argmax(-1))


def test_executor_turns_the_flag_on_for_the_kernels_backend_only() -> None:
    assert TorchExecutor("tiny", 4, 4, attention_backend="kernels").model.use_fused_kernels is True
    assert TorchExecutor("tiny", 4, 4, attention_backend="sdpa").model.use_fused_kernels is False


def test_greedy_tokens_through_triton_with_fused_kernels_equal_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's kernels backend end to end on Triton (interpreter on CPU): fused norms, rotary and
    SiLU·mul around the paged attention kernels; chunked prefill, a mixed step, then decode steps."""
    monkeypatch.setenv("SLOBENCH_FORCE_TRITON", "1")
    ex = TorchExecutor("tiny", 16, 4, attention_backend="kernels", device=DEVICE)
    assert ex.model.use_fused_kernels and kernels.uses_triton(ex.k_cache[0])
    oracle = build_model("tiny", seed=0, device=DEVICE)  # plain torch code, flag off
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (5, 8)]
    tables = [[3, 9, 1, 12], [7, 0, 14, 5]]
    want = [greedy(oracle, p, 4) for p in prompts]
    assert prefill_then_decode(ex, prompts, tables, 4, first_chunk=3) == want


@pytest.mark.skipif(not HAS_CUDA, reason="bf16 needs CUDA (the interpreter runs numpy: no bf16)")
def test_bf16_kernels_stay_within_an_ulp_of_the_model_code() -> None:
    bf16 = {"atol": 2e-2, "rtol": 1.6e-2}  # a couple of bf16 ulps: rotary rounds once, torch per op
    x, res, w = (
        t.bfloat16() for t in (randn(33, 2048, seed=1), randn(33, 2048, seed=2), randn(2048, seed=3))
    )
    normed, new_res = fused.rms_norm(x, w, 1e-5, res)
    want, want_res = torch_ref.rms_norm(x, w, 1e-5, res)
    assert new_res is not None and want_res is not None and torch.equal(new_res, want_res)
    torch.testing.assert_close(normed, want, **bf16)
    gate_up = randn(33, 2 * 1500, seed=4).bfloat16()
    torch.testing.assert_close(fused.silu_and_mul(gate_up), torch_ref.silu_and_mul(gate_up), **bf16)
    cfg = CONFIGS["llama-3.2-1b"]
    cos, sin = (t.to(DEVICE) for t in rope_table(cfg))
    positions = torch.randint(0, cfg.max_seq_len, (33,), device=DEVICE)
    qkv, q, k, _ = _qkv(33, 32, 8, 64, seed=5)
    qkv_b = qkv.bfloat16()
    q2, k2, _ = qkv_b.split([32 * 64, 8 * 64, 8 * 64], dim=-1)
    q2, k2 = q2.view(33, 32, 64), k2.view(33, 8, 64)
    tq, tk = q2.clone(), k2.clone()
    fused.apply_rotary_(q2, k2, positions, cos, sin)
    torch_ref.apply_rotary_(tq, tk, positions, cos, sin)
    torch.testing.assert_close(q2, tq, **bf16)
    torch.testing.assert_close(k2, tk, **bf16)
