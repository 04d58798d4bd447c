"""Triton kernels against the plain-torch reference.

On a machine without CUDA the kernels run on the CPU through Triton's interpreter (fp32 only: numpy has
no bf16). With CUDA they run compiled, in fp32 and bf16. Every KV slot not written by the test holds
NaN, so a kernel that reads past a context, a chunk, or a block table's used entries fails loudly.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must precede the first import of a Triton kernel module: triton.jit reads it when decorating.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from reference_engine import kernels  # noqa: E402
from reference_engine.kernels import torch_ref  # noqa: E402
from reference_engine.kernels.decode_attention import paged_decode_attention  # noqa: E402
from reference_engine.kernels.kv_write import write_kv  # noqa: E402
from reference_engine.kernels.prefill_attention import extend_attention  # noqa: E402

pytestmark = pytest.mark.kernels

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
NUM_KV_HEADS = 2
HEAD_DIM = 32

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(not HAS_CUDA, reason="bf16 needs CUDA")),
]


def _tol(dtype: torch.dtype) -> dict[str, Any]:
    if dtype == torch.bfloat16:  # p is rounded to bf16 before the PV product
        return {"atol": 3e-2, "rtol": 3e-2}
    return {"atol": 2e-5, "rtol": 1e-4}


class PagedCache:
    """A NaN-poisoned paged cache holding random K/V for some sequences, with shuffled block tables."""

    def __init__(
        self,
        lens: list[int],
        *,
        block_size: int = 16,
        num_kv_heads: int = NUM_KV_HEADS,
        head_dim: int = HEAD_DIM,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.block_size = block_size
        blocks_per_seq = [math.ceil(n / block_size) for n in lens]
        num_blocks = sum(blocks_per_seq) + 3  # spare blocks stay NaN and pad the tables
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = torch.full(shape, float("nan"), dtype=dtype)
        self.v_cache = torch.full(shape, float("nan"), dtype=dtype)
        order = torch.randperm(num_blocks, generator=gen).tolist()
        spare = order[sum(blocks_per_seq) :]
        max_blocks = max(blocks_per_seq) + 2  # unused trailing entries: a kernel must not follow them
        tables, used = [], 0
        for n in blocks_per_seq:
            row = order[used : used + n]
            used += n
            tables.append(row + [spare[(i + n) % len(spare)] for i in range(max_blocks - n)])
        self.block_tables = torch.tensor(tables, dtype=torch.int32)
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        for i, n in enumerate(lens):
            self.fill(i, 0, n, gen)

    def slots(self, seq: int, start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        return self.block_tables[seq][pos // self.block_size].long() * self.block_size + pos % self.block_size

    def fill(self, seq: int, start: int, end: int, gen: torch.Generator) -> None:
        s = self.slots(seq, start, end)
        n = end - start
        self.k_cache.view(-1, self.num_kv_heads, self.head_dim)[s] = torch.randn(
            n, self.num_kv_heads, self.head_dim, generator=gen
        ).to(self.k_cache.dtype)
        self.v_cache.view(-1, self.num_kv_heads, self.head_dim)[s] = torch.randn(
            n, self.num_kv_heads, self.head_dim, generator=gen
        ).to(self.v_cache.dtype)

    def to(self, device: torch.device) -> PagedCache:
        self.k_cache, self.v_cache = self.k_cache.to(device), self.v_cache.to(device)
        self.block_tables = self.block_tables.to(device)
        return self


def _query(num_tokens: int, n_heads: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, n_heads, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)


def _int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _check_decode(
    lens: list[int], group: int, num_splits: int | None, dtype: torch.dtype, **cache_kw
) -> None:
    cache = PagedCache(lens, dtype=dtype, **cache_kw).to(DEVICE)
    q = _query(len(lens), NUM_KV_HEADS * group, dtype)
    context_lens = _int32(lens)
    scale = 1 / math.sqrt(HEAD_DIM)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, context_lens, scale)
    expected = torch_ref.paged_decode_attention(*args)
    got = paged_decode_attention(*args, num_splits=num_splits)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected.float(), **_tol(dtype))


# ---- paged decode attention -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3], ids=["no-split", "split3"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_ragged_lengths(group: int, num_splits: int, dtype: torch.dtype) -> None:
    # a single token, lengths off the block size, exactly two blocks, just past a 64-token tile
    _check_decode([1, 17, 32, 65, 300], group, num_splits, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 8], ids=["no-split", "split8"])
def test_decode_long_context(num_splits: int, dtype: torch.dtype) -> None:
    _check_decode([3000, 5, 1000], 4, num_splits, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_large_blocks_and_odd_head_dim(dtype: torch.dtype) -> None:
    # nano-vllm's 256-token blocks; head_dim 32 padded is covered above, so also a wide GQA group
    _check_decode([700, 256, 3], 8, 4, dtype, block_size=256)


def test_decode_default_split_choice_and_out_buffer() -> None:
    lens = [40, 200]
    cache = PagedCache(lens).to(DEVICE)
    q = _query(2, NUM_KV_HEADS * 4, torch.float32)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, _int32(lens), 0.17)
    out = torch.empty_like(q)
    got = paged_decode_attention(*args, out=out, max_context_len=200)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, torch_ref.paged_decode_attention(*args), **_tol(torch.float32))


@pytest.mark.parametrize("num_splits", [1, 2], ids=["no-split", "split2"])
def test_decode_padding_rows_give_zeros(num_splits: int) -> None:
    """A CUDA-graph batch is padded with context-0 rows (and slot -1 writes): they must not make NaN."""
    cache = PagedCache([70, 70]).to(DEVICE)
    q = _query(3, NUM_KV_HEADS * 4, torch.float32)
    table = torch.cat([cache.block_tables, cache.block_tables[:1]])
    args = (q, cache.k_cache, cache.v_cache, table, _int32([70, 0, 70]), 0.2)
    got = paged_decode_attention(*args, num_splits=num_splits, max_context_len=70)
    expected = torch_ref.paged_decode_attention(*args)
    assert not got[1].any() and not expected[1].any()
    torch.testing.assert_close(got, expected, **_tol(torch.float32))


def test_decode_split_count_is_bounded() -> None:
    from reference_engine.kernels.decode_attention import choose_num_splits

    cpu = torch.device("cpu")
    assert choose_num_splits(4, 8, 100_000, cpu) == 1  # one "SM": splitting buys nothing
    assert choose_num_splits(1, 1, 100, cpu) == 1


# ---- prefill / extend attention -----------------------------------------------------------------------


def _check_extend(prefixes: list[int], new: list[int], group: int, dtype: torch.dtype) -> None:
    lens = [p + n for p, n in zip(prefixes, new, strict=True)]
    cache = PagedCache(lens, dtype=dtype).to(DEVICE)
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    q = _query(cu[-1], NUM_KV_HEADS * group, dtype)
    args = (q, cache.k_cache, cache.v_cache, _int32(cu), _int32(prefixes), cache.block_tables, 0.2)
    expected = torch_ref.extend_attention(*args)
    got = extend_attention(*args, max_seqlen_q=max(new))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected.float(), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 4, 8])
def test_extend_fresh_prefill(group: int, dtype: torch.dtype) -> None:
    # one token, a length off the block size, more than one 64-row query tile
    _check_extend([0, 0, 0], [1, 20, 70], group, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 4, 8])
def test_extend_with_cached_prefix(group: int, dtype: torch.dtype) -> None:
    # a prefix hit, a fresh prompt, a chunk of one token, a prefix of exactly one block
    _check_extend([33, 0, 99, 16], [50, 5, 1, 16], group, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_long_prefix(dtype: torch.dtype) -> None:
    _check_extend([2000, 7], [70, 3], 4, dtype)


def test_extend_reads_max_seqlen_itself() -> None:
    cache = PagedCache([12, 9]).to(DEVICE)
    q = _query(12, NUM_KV_HEADS, torch.float32)
    args = (q, cache.k_cache, cache.v_cache, _int32([0, 5, 12]), _int32([7, 2]), cache.block_tables, 0.3)
    torch.testing.assert_close(
        extend_attention(*args), torch_ref.extend_attention(*args), **_tol(torch.float32)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_equals_one_shot(dtype: torch.dtype) -> None:
    """Bug 3 of NOTES-engine: a chunk must attend only to KV already written (the rest is NaN here)."""
    group, length, chunks = 4, 50, [20, 20, 1, 9]
    n_heads = NUM_KV_HEADS * group
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    q = _query(length, n_heads, dtype)

    def fresh() -> PagedCache:
        c = PagedCache([length], dtype=dtype, seed=5).to(DEVICE)
        c.k_cache.fill_(float("nan"))
        c.v_cache.fill_(float("nan"))
        return c

    whole = fresh()
    slots = whole.slots(0, 0, length).to(DEVICE)
    write_kv(k, v, whole.k_cache, whole.v_cache, slots)
    one_shot = extend_attention(
        q, whole.k_cache, whole.v_cache, _int32([0, length]), _int32([0]), whole.block_tables, 0.2
    )
    chunked = fresh()
    outs, start = [], 0
    for n in chunks:
        write_kv(
            k[start : start + n],
            v[start : start + n],
            chunked.k_cache,
            chunked.v_cache,
            slots[start : start + n],
        )
        outs.append(
            extend_attention(
                q[start : start + n],
                chunked.k_cache,
                chunked.v_cache,
                _int32([0, n]),
                _int32([start]),
                chunked.block_tables,
                0.2,
            )
        )
        start += n
    assert torch.isfinite(one_shot).all()
    torch.testing.assert_close(torch.cat(outs).float(), one_shot.float(), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_equals_extend_of_one_token(dtype: torch.dtype) -> None:
    lens = [1, 37, 130]
    cache = PagedCache(lens, dtype=dtype).to(DEVICE)
    q = _query(len(lens), NUM_KV_HEADS * 8, dtype)
    dec = paged_decode_attention(
        q, cache.k_cache, cache.v_cache, cache.block_tables, _int32(lens), 0.2, num_splits=2
    )
    ext = extend_attention(
        q,
        cache.k_cache,
        cache.v_cache,
        _int32(list(range(len(lens) + 1))),
        _int32([n - 1 for n in lens]),
        cache.block_tables,
        0.2,
    )
    torch.testing.assert_close(dec.float(), ext.float(), **_tol(dtype))


# ---- KV write ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_skips_padding_and_takes_strided_inputs(dtype: torch.dtype) -> None:
    num_blocks, block_size, num_tokens = 6, 16, 9
    gen = torch.Generator().manual_seed(7)
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    # K and V as views into a fused QKV projection output, as an executor produces them: not contiguous
    qkv = torch.randn(num_tokens, 3 * NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    k = qkv[:, NUM_KV_HEADS * HEAD_DIM : 2 * NUM_KV_HEADS * HEAD_DIM].view(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    v = qkv[:, 2 * NUM_KV_HEADS * HEAD_DIM :].view(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    assert not k.is_contiguous()
    last_slot = num_blocks * block_size - 1
    slot_mapping = torch.tensor([5, -1, 17, last_slot, -1, 40, 0, 63, -1], dtype=torch.int64, device=DEVICE)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    torch_ref.write_kv(k, v, expected_k, expected_v, slot_mapping)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0)
    flat = k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(flat[last_slot], k[3], atol=0, rtol=0)


def test_write_kv_of_no_tokens_is_a_no_op() -> None:
    cache = torch.zeros(2, 4, NUM_KV_HEADS, HEAD_DIM, device=DEVICE)
    empty = torch.empty(0, NUM_KV_HEADS, HEAD_DIM, device=DEVICE)
    write_kv(empty, empty, cache, cache, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert not cache.any()


# ---- the oracle itself, and the dispatcher ------------------------------------------------------------


def test_reference_matches_sdpa_on_a_contiguous_cache() -> None:
    """The oracle is checked against torch's SDPA with an identity block table (one sequence, GQA 4)."""
    length, block_size, group = 45, 8, 4
    num_blocks = math.ceil(length / block_size)
    gen = torch.Generator().manual_seed(11)
    k = torch.randn(num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(length, NUM_KV_HEADS * group, HEAD_DIM, generator=gen)
    table = torch.arange(num_blocks, dtype=torch.int32)[None]
    k_cache = k.view(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    v_cache = v.view(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    cu, prefix = torch.tensor([0, length], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    got = torch_ref.extend_attention(q, k_cache, v_cache, cu, prefix, table, 0.25)
    kk = k[:length].repeat_interleave(group, dim=1).transpose(0, 1)
    vv = v[:length].repeat_interleave(group, dim=1).transpose(0, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), kk, vv, is_causal=True, scale=0.25
    )
    torch.testing.assert_close(got, sdpa.transpose(0, 1), atol=1e-5, rtol=1e-5)
    dec = torch_ref.paged_decode_attention(q[-1:], k_cache, v_cache, table, torch.tensor([length]), 0.25)
    torch.testing.assert_close(dec, got[-1:], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(HAS_CUDA, reason="CPU routing")
def test_dispatcher_routes_by_device_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import reference_engine.kernels.decode_attention as triton_decode

    calls: list[str] = []

    def fake(*args, **kwargs):
        calls.append("triton")
        return torch_ref.paged_decode_attention(*args, **kwargs)

    monkeypatch.setattr(triton_decode, "paged_decode_attention", fake)
    cache = PagedCache([5])
    q = _query(1, NUM_KV_HEADS, torch.float32)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, _int32([5]), 0.3)
    monkeypatch.delenv("SLOBENCH_FORCE_TRITON", raising=False)
    assert not kernels.uses_triton(q)
    kernels.paged_decode_attention(*args)
    assert calls == []
    monkeypatch.setenv("SLOBENCH_FORCE_TRITON", "1")
    assert kernels.uses_triton(q)
    kernels.paged_decode_attention(*args)
    assert calls == ["triton"]


def test_dispatchers_agree_with_reference_when_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOBENCH_FORCE_TRITON", "1")
    lens = [9, 40]
    cache = PagedCache(lens).to(DEVICE)
    q = _query(2, NUM_KV_HEADS * 4, torch.float32)
    dec = (q, cache.k_cache, cache.v_cache, cache.block_tables, _int32(lens), 0.2)
    torch.testing.assert_close(kernels.paged_decode_attention(*dec), torch_ref.paged_decode_attention(*dec))
    ext = (q, cache.k_cache, cache.v_cache, _int32([0, 1, 2]), _int32([8, 39]), cache.block_tables, 0.2)
    torch.testing.assert_close(kernels.extend_attention(*ext), torch_ref.extend_attention(*ext))


def test_package_imports_and_runs_without_triton() -> None:
    code = """
import sys
from typing import Any
sys.modules["triton"] = None  # as if not installed: any `import triton` raises ImportError
import os, torch
os.environ["SLOBENCH_FORCE_TRITON"] = "1"
from reference_engine import kernels
assert not kernels.triton_available() and not kernels.uses_triton(torch.zeros(1))
kc = torch.zeros(2, 4, 1, 8); vc = torch.zeros(2, 4, 1, 8)
kernels.write_kv(torch.ones(1, 1, 8), torch.ones(1, 1, 8), kc, vc, torch.tensor([5]))
out = kernels.paged_decode_attention(torch.ones(1, 2, 8), kc, vc, torch.tensor([[1, 0]], dtype=torch.int32),
                                     torch.tensor([2], dtype=torch.int32), 0.5)
assert out.shape == (1, 2, 8) and "triton" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    env = {k: val for k, val in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


# ---- end to end through the engine's model ----------------------------------------------------------


def test_greedy_tokens_through_the_kernels_equal_the_dense_forward() -> None:
    """The tiny model with Triton attention over a paged cache (chunked prefill, then decode steps) picks
    the same greedy tokens as its plain causal forward, with logits within fp32 noise."""
    from reference_engine.model import build_model

    model = build_model("tiny", dtype=torch.float32, device=DEVICE, seed=0)
    cfg = model.config
    block_size, num_blocks = 16, 8
    shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
    k_caches = [torch.full(shape, float("nan"), device=DEVICE) for _ in range(cfg.n_layers)]
    v_caches = [torch.full(shape, float("nan"), device=DEVICE) for _ in range(cfg.n_layers)]
    table = _int32([5, 2, 7, 0])[None]  # shuffled blocks; 1, 3, 4 and 6 stay NaN
    scale = 1 / math.sqrt(cfg.head_dim)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (21,), generator=gen).tolist()

    def run_chunk(chunk: list[int], start: int) -> torch.Tensor:
        n = len(chunk)
        pos = torch.arange(start, start + n, device=DEVICE)
        slots = table[0][pos // block_size].long() * block_size + pos % block_size

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = k_caches[layer], v_caches[layer]
            write_kv(k, v, kc, vc, slots)
            if n == 1:
                return paged_decode_attention(q, kc, vc, table, _int32([start + 1]), scale, num_splits=2)
            return extend_attention(q, kc, vc, _int32([0, n]), _int32([start]), table, scale, max_seqlen_q=n)

        with torch.inference_mode():
            hidden = model(torch.tensor(chunk, device=DEVICE), pos, attend)
            return model.logits(hidden[-1:])[0]

    run_chunk(tokens[:13], 0)  # a chunked prefill: the first chunk samples nothing
    logits = run_chunk(tokens[13:], 13)
    for _ in range(4):
        dense = model.forward_dense(tokens)[-1]
        torch.testing.assert_close(logits, dense, atol=1e-3, rtol=1e-3)
        assert int(logits.argmax()) == int(dense.argmax())
        tokens.append(int(logits.argmax()))
        logits = run_chunk(tokens[-1:], len(tokens) - 1)


def test_public_surface_is_pinned() -> None:
    assert kernels.__all__ == [
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
