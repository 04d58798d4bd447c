"""CUDA graphs for decode steps: capture the model's forward once per batch size, replay it every step.

A decode step of a small model on a GPU is mostly kernel-launch overhead on the host (hundreds of launches
for a few hundred microseconds of device work), so vLLM and SGLang replay captured graphs for decode. A
graph replays fixed shapes and fixed pointers (`DecodeGraphRunner`'s doc says what that asks).

Two parts, kept apart so the first is tested on any machine: `GraphPlan` (pure Python: which sizes exist,
whether a step fits and at which size) and `DecodeGraphRunner` (the buffers, the capture, the replay). The
runner also runs its padded step eagerly, with exactly the buffer layout a graph reads; that is how the
layout is checked on a CPU, and what it does for a size it has not captured.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from reference_engine.errors import ConfigError
from reference_engine.executor.base import SeqChunk

# vLLM captures 1, 2, 4, then multiples of 8; powers of two keep the number of graphs (and their memory)
# small while padding at most doubles a batch's dense work, which a bandwidth-bound decode barely feels.
DEFAULT_GRAPH_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def graph_batch_sizes(
    max_num_seqs: int, candidates: Sequence[int] = DEFAULT_GRAPH_BATCH_SIZES
) -> tuple[int, ...]:
    """The candidates up to `max_num_seqs`, plus `max_num_seqs` itself when it falls between two of them
    (so a full batch is never left to eager); capped at the largest candidate."""
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ConfigError("max_num_seqs", max_num_seqs, "must be an integer >= 1")
    if not candidates or min(candidates) < 1:
        raise ConfigError("candidates", candidates, "must be positive batch sizes")
    top = min(max_num_seqs, max(candidates))
    return tuple(sorted({s for s in candidates if s < top} | {top}))


@dataclass(frozen=True, slots=True)
class GraphChoice:
    """Whether a step replays a graph (`batch_size` = the padded size) or runs eagerly, and why."""

    batch_size: int | None
    reason: str

    @property
    def is_graph(self) -> bool:
        return self.batch_size is not None


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """Which decode steps a set of captured graphs can serve. No torch, no CUDA: decisions only."""

    batch_sizes: tuple[int, ...]  # ascending, each captured once
    block_size: int
    max_context_len: int  # tokens; block tables are captured ceil(max_context_len / block_size) wide

    def __post_init__(self) -> None:
        sizes = self.batch_sizes
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ConfigError("batch_sizes", sizes, "must be a non-empty tuple of integers >= 1")
        if list(sizes) != sorted(set(sizes)):
            raise ConfigError("batch_sizes", sizes, "must be strictly ascending")
        for name in ("block_size", "max_context_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "must be an integer >= 1")

    @classmethod
    def for_limits(cls, max_num_seqs: int, max_context_len: int, block_size: int,
                   candidates: Sequence[int] = DEFAULT_GRAPH_BATCH_SIZES) -> GraphPlan:
        return cls(graph_batch_sizes(max_num_seqs, candidates), block_size, max_context_len)

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_context_len / self.block_size)

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest captured size >= num_seqs, or None above the largest."""
        i = bisect.bisect_left(self.batch_sizes, num_seqs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def choose(self, chunks: Sequence[SeqChunk]) -> GraphChoice:
        """Called every step, so one pass over the chunks and no allocation on the common path."""
        if not chunks:
            return GraphChoice(None, "eager: empty step")
        widest = 0
        for c in chunks:
            if len(c.token_ids) != 1:
                return GraphChoice(None, "eager: a prefill or mixed step (a chunk of more than one token)")
            widest = max(widest, c.start_pos + 1)
        size = self.padded_size(len(chunks))
        if size is None:
            return GraphChoice(None, f"eager: {len(chunks)} sequences, above the largest graph "
                                     f"({self.max_batch_size})")
        if widest > self.max_context_len:
            return GraphChoice(None, f"eager: context {widest} wider than the captured block tables "
                                     f"({self.max_context_len} tokens)")
        return GraphChoice(size, f"graph: {len(chunks)} sequences padded to {size}")


def use_cuda_graphs(
    device: torch.device | str, attention_backend: str, enforce_eager: bool
) -> tuple[bool, str]:
    """Whether an executor captures decode graphs, and why not when it does not."""
    if enforce_eager:
        return False, "enforce_eager is set"
    if torch.device(device).type != "cuda":
        return False, f"device {torch.device(device).type!r} is not CUDA"
    if attention_backend != "kernels":
        # The sdpa path builds masks and reads lengths on the host every step: not capturable.
        return False, f"attention_backend {attention_backend!r} is not 'kernels'"
    from reference_engine.kernels import triton_available

    if not triton_available():  # the torch reference reads lengths on the host: not capturable either
        return False, "Triton is not installed"
    return True, "CUDA with the Triton kernels"


class DecodeBuffers:
    """The static inputs of a padded decode step, with host staging copies filled each step.

    Device tensors are allocated once; a graph keeps pointers to them. The host side is pinned on CUDA, so
    each step costs two asynchronous copies; an event recorded after them is waited on before the host
    side is written again (a step usually syncs anyway when it reads its tokens back, but not always)."""

    def __init__(self, max_batch_size: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.max_batch_size, self.width, self.block_size = max_batch_size, max_blocks_per_seq, block_size
        self.device = device
        on_cuda = device.type == "cuda"
        # Rows of one int64 array: token ids, positions, slot mapping, context lengths.
        self.ints = torch.zeros(4, max_batch_size, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_batch_size, max_blocks_per_seq, dtype=torch.int32, device=device)
        # The kernels take int32 lengths; the graph itself converts (one tiny kernel, no extra host copy).
        self.context_lens = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        if on_cuda:
            self._host_ints = torch.zeros(4, max_batch_size, dtype=torch.long, pin_memory=True)
            self._host_tables = torch.zeros(max_batch_size * max_blocks_per_seq, dtype=torch.int32,
                                            pin_memory=True)
            self._staging_tables = torch.zeros_like(self._host_tables, device=device)
        else:  # the CPU (tests): fill the buffers in place
            self._host_ints = self.ints
            self._host_tables = self.block_tables.view(-1)
            self._staging_tables = self._host_tables
        # Recorded after each step's host-to-device copies; waiting on a never-recorded event returns at once.
        self._copied: Any = torch.cuda.Event() if on_cuda else None
        self._ints_np: Any = self._host_ints.numpy()
        self._tables_np: Any = self._host_tables.numpy()

    @property
    def token_ids(self) -> Tensor:
        return self.ints[0]

    @property
    def positions(self) -> Tensor:
        return self.ints[1]

    @property
    def slot_mapping(self) -> Tensor:
        return self.ints[2]

    def fill(self, chunks: Sequence[SeqChunk], padded_size: int) -> None:
        """Rows 0..n-1 from the chunks (one token each), rows n..padded_size-1 padding (context 0, slot -1).

        Only each row's first ceil(context / block_size) table entries are written; entries past a
        sequence's context are never read, so what they hold from an earlier step does not matter."""
        n, bs = len(chunks), self.block_size
        if not 1 <= n <= padded_size <= self.max_batch_size:
            raise ValueError(f"{n} sequences padded to {padded_size}: outside 1..{self.max_batch_size}")
        if self._copied is not None:
            self._copied.synchronize()
        ints = self._ints_np
        ints[:, n:padded_size] = [[0], [0], [-1], [0]]
        num_blocks = [(c.start_pos // bs) + 1 for c in chunks]
        nb_max = max(num_blocks)
        if nb_max > self.width:
            raise ValueError(f"a context of {nb_max} blocks is wider than the captured {self.width}")
        tokens, positions, slots, flat = [], [], [], []
        for c, nb in zip(chunks, num_blocks, strict=True):
            table = c.block_table
            if len(table) < nb:
                raise ValueError(
                    f"seq {c.seq_id}: block_table has {len(table)} blocks, position {c.start_pos} needs {nb}"
                )
            pos = c.start_pos
            tokens.append(c.token_ids[0])
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            flat.extend(table[:nb])
            flat.extend([0] * (nb_max - nb))
        ints[0, :n], ints[1, :n], ints[2, :n] = tokens, positions, slots
        ints[3, :n] = positions
        ints[3, :n] += 1  # context length: the positions so far and the token being decoded
        if self.device.type == "cuda":
            # Compact [n, nb_max] on the host, one async copy, then one device copy into the strided rows.
            self._tables_np[: n * nb_max] = flat
            self.ints.copy_(self._host_ints, non_blocking=True)
            self._staging_tables[: n * nb_max].copy_(self._host_tables[: n * nb_max], non_blocking=True)
            self._copied.record()
            self.block_tables[:n, :nb_max].copy_(self._staging_tables[: n * nb_max].view(n, nb_max))
        else:
            self.block_tables[:n, :nb_max] = torch.from_numpy(
                np.asarray(flat, dtype=np.int32).reshape(n, nb_max)
            )


@dataclass(slots=True)
class _StaticDecodeAttention:
    """The `attend` a captured step uses: every tensor is a fixed view of the static buffers."""

    k_cache: list[Tensor]
    v_cache: list[Tensor]
    slot_mapping: Tensor  # [B] int64, -1 on padding rows
    block_tables: Tensor  # [B, width] int32
    context_lens: Tensor  # [B] int32, 0 on padding rows
    max_context_len: int  # host int >= every context: no device read to size the launch
    scale: float

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        from reference_engine import kernels

        kc, vc = self.k_cache[layer_idx], self.v_cache[layer_idx]
        kernels.write_kv(k, v, kc, vc, self.slot_mapping)
        return kernels.paged_decode_attention(q, kc, vc, self.block_tables, self.context_lens, self.scale,
                                              max_context_len=self.max_context_len)


class DecodeGraphRunner:
    """Padded decode steps over static buffers: replayed from a CUDA graph when one was captured for the
    padded size, run eagerly (same buffers, same kernels dispatch) otherwise. A graph replays fixed shapes
    and fixed pointers, hence:

    - static input buffers (token ids, positions, slot mapping, context lengths, block tables padded to a
      fixed width), of the largest batch size; the graph of size B reads their first B rows;
    - a batch of n sequences is padded up to the next captured size with rows of context 0 and slot -1: the
      KV write skips them and attention gives zeros for them (never NaN), and their hidden states are dropped;
    - the decode kernel gets the host int `max_context_len` = the captured width in tokens (no host sync, and
      it bounds every real context because wider ones never reach the graph).

    The graphs capture the model's forward to the final-normed hidden states only; the vocabulary
    projection and sampling stay eager (as in vLLM), so no [batch, vocab] logits live in graph memory."""

    def __init__(self, model: Any, k_cache: list[Tensor], v_cache: list[Tensor], plan: GraphPlan) -> None:
        self.model, self.k_cache, self.v_cache, self.plan = model, k_cache, v_cache, plan
        self.device = k_cache[0].device
        self.buffers = DecodeBuffers(
            plan.max_batch_size, plan.max_blocks_per_seq, plan.block_size, self.device
        )
        self.scale = model.config.head_dim**-0.5
        self.graphs: dict[int, Any] = {}  # padded size -> torch.cuda.CUDAGraph
        self._outputs: dict[int, Tensor] = {}  # padded size -> the graph's hidden-state output [B, dim]
        self.num_replays = 0
        self.num_eager = 0

    def _forward(self, size: int) -> Tensor:
        """The captured computation: reads rows [:size] of the static buffers, writes K/V, returns hidden."""
        b = self.buffers
        b.context_lens[:size].copy_(b.ints[3, :size])
        attend = _StaticDecodeAttention(self.k_cache, self.v_cache, b.slot_mapping[:size], b.block_tables[:size],
                                        b.context_lens[:size], self.plan.max_blocks_per_seq * self.plan.block_size,
                                        self.scale)
        return self.model(b.token_ids[:size], b.positions[:size], attend)

    @torch.inference_mode()
    def run(self, chunks: Sequence[SeqChunk], padded_size: int) -> Tensor:
        """Hidden states [len(chunks), dim], row i for chunk i. Valid until the next call."""
        self.buffers.fill(chunks, padded_size)
        graph = self.graphs.get(padded_size)
        if graph is None:
            self.num_eager += 1
            hidden = self._forward(padded_size)
        else:
            self.num_replays += 1
            graph.replay()
            hidden = self._outputs[padded_size]
        return hidden[: len(chunks)]

    @torch.inference_mode()
    def capture(self, sizes: Sequence[int] | None = None) -> None:
        """Capture every planned size (or `sizes`), largest first so smaller graphs reuse its memory pool.

        Before each capture the step runs twice eagerly on a side stream, all rows padding: that compiles
        the Triton kernels and lets cuBLAS pick and allocate for this shape outside the graph."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device}")
        sizes = sorted(sizes or self.plan.batch_sizes, reverse=True)
        b = self.buffers
        b.ints[:, :] = torch.tensor([[0], [0], [-1], [0]], device=self.device)  # every row padding
        pool = torch.cuda.graph_pool_handle()
        for size in sizes:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(size)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(size)
            self.graphs[size], self._outputs[size] = graph, out
        torch.cuda.synchronize(self.device)
