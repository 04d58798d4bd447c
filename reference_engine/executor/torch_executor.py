"""Runs one scheduler step on a real model: selective batching over a paged KV cache, in plain torch.

Every token of the step (prefill chunks and decode tokens, concatenated) goes through the dense layers at
once; attention is per request: each layer writes the step's K/V into the slots of each sequence's block
table, then each query attends over its own sequence's positions 0 .. start_pos+len-1 only. Decode tokens
of all sequences share one padded SDPA call (a mask keeps each on its own context); prefill chunks get one
call each. Index tensors are built once per step, not per layer or per token.

That is the "sdpa" attention backend (plain torch, the CPU default). The "kernels" backend sends the same
step through `reference_engine.kernels` instead: Triton kernels on CUDA (the default there). On CUDA with
the kernels, all-decode steps replay CUDA graphs (`cuda_graphs`), and the KV cache can be sized from free
memory after a warm-up step (`kv_sizing`).
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from reference_engine.errors import ConfigError
from reference_engine.executor.base import SamplingParams, SeqChunk, StepBatch, StepResult
from reference_engine.executor.cuda_graphs import DecodeGraphRunner, GraphPlan, use_cuda_graphs
from reference_engine.executor.kv_sizing import (
    MemoryProfile,
    measure_cuda_memory,
    num_kv_blocks,
    warmup_chunks,
)
from reference_engine.model import ModelConfig, build_model, get_config
from reference_engine.tokenizer import ByteTokenizer

log = logging.getLogger(__name__)


def kv_bytes_per_token(model_config: str | ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    cfg = get_config(model_config)
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype.itemsize


def resolve_dtype(dtype: torch.dtype | str, device: str | torch.device) -> torch.dtype:
    """dtype "auto" is bf16 on CUDA (half the bytes a bandwidth-bound decode reads) and fp32 elsewhere (CPUs
    have few fast bf16 kernels, and fp32 keeps the CPU path exact against the dense oracle)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ConfigError(
            "dtype", dtype, "must be 'auto' or a torch floating dtype name (float32, bfloat16, float16)"
        )
    return resolved


def num_blocks_for_memory(
    memory_bytes: int, model_config: str | ModelConfig, block_size: int, dtype: torch.dtype = torch.float32
) -> int:
    """How many KV blocks fit in `memory_bytes` (e.g. free GPU memory less a safety margin)."""
    return max(0, memory_bytes // (kv_bytes_per_token(model_config, dtype) * block_size))


@dataclass(slots=True)
class _DecodeGroup:
    rows: Tensor  # [D] rows of the step's token axis that are single-token chunks
    block_ids: Tensor  # [D * max_blocks] each sequence's blocks, padded with its own first block
    mask: Tensor  # [D, 1, 1, max_blocks * block_size] additive: 0 inside the context, -inf past it


@dataclass(slots=True)
class _PrefillChunk:
    first_row: int
    num_tokens: int
    ctx_len: int
    block_ids: Tensor  # [ceil(ctx_len / block_size)]
    mask: Tensor | None  # [num_tokens, ctx_len] additive causal mask; None when plain is_causal applies


class _StepAttention:
    """The `attend` function the model calls per layer, holding this step's index tensors.

    K/V are read a whole block at a time (one contiguous copy per block, not per slot); the slots of a
    block past the context are masked, so what they hold (stale or unwritten) never counts."""

    def __init__(self, executor: TorchExecutor, slots: Tensor, decode: _DecodeGroup | None,
                 prefills: list[_PrefillChunk]) -> None:
        self.ex = executor
        self.slots, self.decode, self.prefills = slots, decode, prefills
        self.group = executor.config.n_heads // executor.config.n_kv_heads

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        ex = self.ex
        ex._k_flat[layer_idx].index_copy_(0, self.slots, k)  # [num_slots, kv_heads, head_dim]
        ex._v_flat[layer_idx].index_copy_(0, self.slots, v)
        k_blocks, v_blocks = ex.k_cache[layer_idx], ex.v_cache[layer_idx]  # [num_blocks, bs, kv, hd]
        if self.decode is not None and not self.prefills:
            return self._decode(q, k_blocks, v_blocks, self.decode)  # the common all-decode step: no scatter
        out = torch.empty_like(q)
        if self.decode is not None:
            d = self.decode
            out.index_copy_(0, d.rows, self._decode(q.index_select(0, d.rows), k_blocks, v_blocks, d))
        for p in self.prefills:
            rows = slice(p.first_row, p.first_row + p.num_tokens)
            qp = q[rows].transpose(0, 1)  # [heads, n, hd]
            kp, vp = _context(k_blocks, p), _context(v_blocks, p)  # [kv, L, hd]
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, is_causal=p.mask is None,
                                               enable_gqa=True)
            out[rows] = o.transpose(0, 1)
        return out

    def _decode(self, q: Tensor, k_blocks: Tensor, v_blocks: Tensor, d: _DecodeGroup) -> Tensor:
        num_seqs, n_heads, head_dim = q.shape
        n_kv = n_heads // self.group
        # The query heads sharing a KV head become that head's "query length": no K/V repeat needed.
        qg = q.view(num_seqs, n_kv, self.group, head_dim)
        kd = k_blocks.index_select(0, d.block_ids).view(num_seqs, -1, n_kv, head_dim).transpose(1, 2)
        vd = v_blocks.index_select(0, d.block_ids).view(num_seqs, -1, n_kv, head_dim).transpose(1, 2)
        # An additive float mask keeps SDPA on its fast CPU kernel; a bool mask falls back to the slow path.
        o = F.scaled_dot_product_attention(qg, kd, vd, attn_mask=d.mask)  # [D, kv, group, hd]
        return o.reshape(num_seqs, n_heads, head_dim)


@dataclass(slots=True)
class _KernelAttention:
    """The `attend` function when attention goes through `reference_engine.kernels` (Triton on CUDA)."""

    executor: TorchExecutor
    slots: Tensor  # [T] int64
    block_tables: Tensor  # [B, max_blocks] int32
    context_lens: Tensor | None  # [B] int32, set for an all-decode step
    max_context_len: int
    cu_seqlens_q: Tensor | None  # [B + 1] int32, set for a step with any multi-token chunk
    prefix_lens: Tensor | None  # [B] int32
    max_seqlen_q: int

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        from reference_engine import kernels

        k_blocks, v_blocks = self.executor.k_cache[layer_idx], self.executor.v_cache[layer_idx]
        kernels.write_kv(k, v, k_blocks, v_blocks, self.slots)
        scale = q.shape[-1] ** -0.5
        if self.context_lens is not None:
            return kernels.paged_decode_attention(q, k_blocks, v_blocks, self.block_tables, self.context_lens,
                                                  scale, max_context_len=self.max_context_len)
        assert self.cu_seqlens_q is not None and self.prefix_lens is not None
        return kernels.extend_attention(q, k_blocks, v_blocks, self.cu_seqlens_q, self.prefix_lens,
                                        self.block_tables, scale, max_seqlen_q=self.max_seqlen_q)


def _context(blocks: Tensor, p: _PrefillChunk) -> Tensor:
    return blocks.index_select(0, p.block_ids).flatten(0, 1)[: p.ctx_len].transpose(0, 1)


class TorchExecutor:
    def __init__(
        self,
        model_config: str | ModelConfig,
        num_blocks: int | None,
        block_size: int,
        *,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device = "cpu",
        seed: int = 0,
        weights_path: str | Path | None = None,
        attention_backend: str | None = None,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        """With `weights_path`, the checkpoint's config.json decides the model's shape, not `model_config`.

        `dtype`: a torch dtype, a name ("bfloat16"), or "auto" (bf16 on CUDA, fp32 elsewhere).
        `attention_backend`: "sdpa" (plain torch SDPA, the CPU default) or "kernels" (the dispatchers of
        `reference_engine.kernels`: Triton on CUDA, their torch reference elsewhere; the CUDA default).
        `num_blocks` None (CUDA only): size the KV cache from free memory after a warm-up step of
        `max_num_batched_tokens` tokens, to `gpu_memory_utilization` of the device (see kv_sizing).
        On CUDA with the kernels backend, decode steps of up to `max_num_seqs` sequences and
        `max_model_len` tokens replay CUDA graphs unless `enforce_eager`."""
        if num_blocks is not None and num_blocks < 1:
            raise ConfigError("num_blocks", num_blocks, "must be >= 1")
        if block_size < 1:
            raise ConfigError("block_size", block_size, "must be >= 1")
        self.device = torch.device(device)
        dtype = resolve_dtype(dtype, self.device)
        if weights_path is not None:
            from reference_engine.weights import load_model  # safetensors is only needed here

            self.model = load_model(weights_path, dtype=dtype, device=self.device)
        else:
            self.model = build_model(model_config, dtype=dtype, device=self.device, seed=seed)
        cfg = self.config = self.model.config
        self.block_size, self.dtype = block_size, dtype
        self.vocab_size = cfg.vocab_size
        self.tokenizer = ByteTokenizer(cfg.vocab_size)
        self.eos_token_id: int | None = self.tokenizer.eos_token_id
        self.kv_bytes_per_token = kv_bytes_per_token(cfg, dtype)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        if attention_backend is None:
            attention_backend = "kernels" if self.device.type == "cuda" else "sdpa"
        if attention_backend not in ("sdpa", "kernels"):
            raise ConfigError("attention_backend", attention_backend, "must be 'sdpa' or 'kernels'")
        self.attention_backend = attention_backend
        # The kernels backend also fuses norms, rotary and SiLU·mul (set before any warm-up or capture).
        self.model.use_fused_kernels = attention_backend == "kernels"
        self.max_model_len = min(max_model_len or cfg.max_seq_len, cfg.max_seq_len)
        self.memory_profile: MemoryProfile | None = None
        # Decode steps that fit replay CUDA graphs through this runner (None: every step runs eagerly).
        self.decode_graphs: DecodeGraphRunner | None = None
        if num_blocks is None:
            num_blocks = self._profile_num_blocks(
                max_num_batched_tokens, max_num_seqs, gpu_memory_utilization
            )
        self._allocate_kv(num_blocks)
        is_graphed, self.graphs_off_reason = use_cuda_graphs(self.device, attention_backend, enforce_eager)
        if is_graphed:
            plan = GraphPlan.for_limits(max_num_seqs, self.max_model_len, block_size)
            runner = DecodeGraphRunner(self.model, self.k_cache, self.v_cache, plan)
            try:
                runner.capture()
                self.decode_graphs = runner
            except Exception as exc:  # serve eagerly rather than not at all; the reason stays visible
                log.warning("CUDA graph capture failed, decode steps run eagerly: %r", exc)
                self.graphs_off_reason = f"capture failed: {exc!r}"

    def _allocate_kv(self, num_blocks: int) -> None:
        cfg = self.config
        self.num_blocks = num_blocks
        shape = (cfg.n_layers, num_blocks * self.block_size, cfg.n_kv_heads, cfg.head_dim)
        self._k_flat = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._v_flat = torch.zeros(shape, dtype=self.dtype, device=self.device)
        block_shape = (num_blocks, self.block_size, cfg.n_kv_heads, cfg.head_dim)
        # Per layer [num_blocks, block_size, n_kv_heads, head_dim], views of the same memory.
        self.k_cache = [self._k_flat[i].view(block_shape) for i in range(cfg.n_layers)]
        self.v_cache = [self._v_flat[i].view(block_shape) for i in range(cfg.n_layers)]

    def _profile_num_blocks(self, max_num_batched_tokens: int, max_num_seqs: int, utilization: float) -> int:
        """Warm-up step on a scratch cache just big enough for it, then size the real cache (kv_sizing)."""
        if self.device.type != "cuda":
            raise ConfigError("num_blocks", None, f"must be given on {self.device.type}: free memory is only "
                                                "measured on CUDA")
        chunks, warmup_blocks = warmup_chunks(max_num_batched_tokens, max_num_seqs, self.max_model_len,
                                              self.block_size)
        self._allocate_kv(warmup_blocks)

        def release() -> None:
            self.k_cache = self.v_cache = []
            del self._k_flat, self._v_flat

        profile = measure_cuda_memory(lambda: self.execute(StepBatch(chunks)), release, self.device)
        self.memory_profile = profile
        per_block = self.kv_bytes_per_token * self.block_size
        return num_kv_blocks(
            profile, utilization, per_block, min_blocks=-(-self.max_model_len // self.block_size)
        )

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> StepResult:
        chunks = batch.chunks
        if not chunks:
            return StepResult(tokens=[])
        hidden: Tensor | None = None
        if self.decode_graphs is not None:
            size = self.decode_graphs.plan.choose(chunks).batch_size
            if size is not None:  # [len(chunks), dim]: one token per chunk, rows in chunk order
                hidden = self.decode_graphs.run(chunks, size)
        if hidden is None:
            token_ids, positions, attention = self._prepare(chunks)
            hidden = self.model(token_ids, positions, attention)  # [T, dim]
        sampled = [i for i, c in enumerate(chunks) if c.sample]
        tokens: list[int | None] = [None] * len(chunks)
        if sampled:
            if len(sampled) == hidden.shape[0]:  # every row is a sampled last row: no index tensor to copy
                logits = self.model.logits(hidden)
            else:
                ends = list(itertools.accumulate(len(c.token_ids) for c in chunks))
                last_rows = torch.tensor([ends[i] - 1 for i in sampled], device=self.device)
                logits = self.model.logits(hidden[last_rows])  # [S, vocab]: project only what is sampled
            for i, token in zip(sampled, self._sample(logits, [chunks[i] for i in sampled]), strict=True):
                tokens[i] = token
        return StepResult(tokens=tokens)

    def _prepare(self, chunks: list[SeqChunk]) -> tuple[Tensor, Tensor, _StepAttention | _KernelAttention]:
        bs, dev = self.block_size, self.device
        lens = [len(c.token_ids) for c in chunks]
        starts = [c.start_pos for c in chunks]
        ctx_lens = [s + n for s, n in zip(starts, lens, strict=True)]
        num_ctx_blocks = [-(-n // bs) for n in ctx_lens]
        for c, n, nb in zip(chunks, lens, num_ctx_blocks, strict=True):
            if n < 1:
                raise ValueError(f"seq {c.seq_id}: a chunk must hold at least one token")
            if len(c.block_table) < nb:
                raise ValueError(f"seq {c.seq_id}: block_table has {len(c.block_table)} blocks, "
                                 f"positions up to {c.start_pos + n - 1} need {nb}")
            if c.start_pos + n > self.config.max_seq_len:
                raise ValueError(f"seq {c.seq_id}: position {c.start_pos + n - 1} is past max_seq_len")
        max_blocks = max(num_ctx_blocks)
        tables = torch.tensor([c.block_table[:nb] + [c.block_table[0]] * (max_blocks - nb)
                               for c, nb in zip(chunks, num_ctx_blocks, strict=True)], device=dev)
        token_ids = torch.tensor(list(itertools.chain.from_iterable(c.token_ids for c in chunks)), device=dev)

        all_decode = max(lens) == 1
        if all_decode:
            positions = torch.tensor(starts, device=dev)
            slots = tables[torch.arange(len(chunks), device=dev), positions // bs] * bs + positions % bs
        else:
            lens_t = torch.tensor(lens, device=dev)
            chunk_of_token = torch.repeat_interleave(torch.arange(len(chunks), device=dev), lens_t)
            first_row = torch.cumsum(lens_t, 0) - lens_t
            offset = torch.arange(len(token_ids), device=dev) - first_row[chunk_of_token]
            positions = torch.tensor(starts, device=dev)[chunk_of_token] + offset
            slots = tables[chunk_of_token, positions // bs] * bs + positions % bs

        if self.attention_backend == "kernels":
            tables32 = tables.to(torch.int32)
            if all_decode:
                context_lens = torch.tensor(ctx_lens, dtype=torch.int32, device=dev)
                attend = _KernelAttention(self, slots, tables32, context_lens, max(ctx_lens), None, None, 1)
            else:
                cu = torch.tensor(list(itertools.accumulate([0, *lens])), dtype=torch.int32, device=dev)
                prefix = torch.tensor(starts, dtype=torch.int32, device=dev)
                attend = _KernelAttention(self, slots, tables32, None, max(ctx_lens), cu, prefix, max(lens))
            return token_ids, positions, attend

        decode = None
        decode_idx = list(range(len(chunks))) if all_decode else [i for i, n in enumerate(lens) if n == 1]
        if decode_idx:
            d_tables = tables if all_decode else tables[decode_idx]
            d_max_blocks = max(num_ctx_blocks[i] for i in decode_idx)
            ctx = torch.tensor([ctx_lens[i] for i in decode_idx], device=dev)
            pos = torch.arange(d_max_blocks * bs, device=dev)
            mask = torch.zeros(len(decode_idx), len(pos), dtype=self.dtype, device=dev)
            mask.masked_fill_(pos[None, :] >= ctx[:, None], -math.inf)
            if all_decode:
                rows = torch.arange(len(chunks), device=dev)
            else:
                row_of_chunk = list(itertools.accumulate([0, *lens]))
                rows = torch.tensor([row_of_chunk[i] for i in decode_idx], device=dev)
            block_ids = d_tables[:, :d_max_blocks].reshape(-1)
            decode = _DecodeGroup(rows=rows, block_ids=block_ids, mask=mask[:, None, None, :])

        prefills: list[_PrefillChunk] = []
        if not all_decode:
            first = 0
            for i, (start, n, ctx_len) in enumerate(zip(starts, lens, ctx_lens, strict=True)):
                if n > 1:
                    causal = None
                    if start > 0:  # queries sit at the end of the context: causal aligned bottom-right
                        q_pos = torch.arange(start, ctx_len, device=dev)
                        k_pos = torch.arange(ctx_len, device=dev)
                        causal = torch.zeros(n, ctx_len, dtype=self.dtype, device=dev)
                        causal.masked_fill_(k_pos[None, :] > q_pos[:, None], -math.inf)
                    block_ids = tables[i, : num_ctx_blocks[i]]
                    prefills.append(_PrefillChunk(first, n, ctx_len, block_ids, causal))
                first += n
        return token_ids, positions, _StepAttention(self, slots, decode, prefills)

    def _sample(self, logits: Tensor, chunks: list[SeqChunk]) -> list[int]:
        self._mask_eos_before_min_tokens(logits, chunks)
        tokens: list[int] = logits.argmax(dim=-1).tolist()
        random_rows = [r for r, c in enumerate(chunks) if c.sampling.temperature > 0]
        if not random_rows:
            return tokens  # all greedy: the common case costs one argmax
        # Unseeded rows draw together from the executor's generator; a seeded row needs its own.
        unseeded = [r for r in random_rows if chunks[r].sampling.seed is None]
        if unseeded:
            drawn = _sample_rows(logits[unseeded], [chunks[r].sampling for r in unseeded], self._generator)
            for r, token in zip(unseeded, drawn, strict=True):
                tokens[r] = token
        for r in random_rows:
            if chunks[r].sampling.seed is not None:
                gen = self._request_generator(chunks[r])
                tokens[r] = _sample_rows(logits[r : r + 1], [chunks[r].sampling], gen)[0]
        return tokens

    def _mask_eos_before_min_tokens(self, logits: Tensor, chunks: list[SeqChunk]) -> None:
        """EOS gets -inf (in place) in the rows still short of their min_tokens, before greedy or top-p
        sampling, so such a request cannot end early (vLLM's min_tokens). One write per step, and none
        at all when no row needs it."""
        eos = self.eos_token_id
        if eos is None:
            return
        rows = [r for r, c in enumerate(chunks) if c.num_generated < c.sampling.min_tokens]
        if not rows:
            return
        if len(rows) == len(chunks):
            logits[:, eos] = -math.inf  # e.g. a benchmark pinning min_tokens on every request: no index tensor
        else:
            logits[torch.tensor(rows, device=logits.device), eos] = -math.inf

    def _request_generator(self, chunk: SeqChunk) -> torch.Generator:
        # The same (seed, position in the output) always draws the same token, across batches and restarts.
        assert chunk.sampling.seed is not None
        mixed = (chunk.sampling.seed * 0x9E3779B97F4A7C15 + chunk.num_generated) % (1 << 63)
        return torch.Generator(device=self.device).manual_seed(mixed)


def _sample_rows(logits: Tensor, params: list[SamplingParams], gen: torch.Generator) -> list[int]:
    """Temperature + top-p (nucleus) sampling of each row of logits [N, vocab]."""
    dev = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if all(p.top_p >= 1.0 for p in params):
        return torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()
    top_p = torch.tensor([p.top_p for p in params], device=dev).unsqueeze(1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p; the most likely token always survives.
    drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
    drop[:, 0] = False
    choice = torch.multinomial(sorted_probs.masked_fill(drop, 0.0), 1, generator=gen)
    return order.gather(1, choice).squeeze(1).tolist()
