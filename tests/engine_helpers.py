"""Set-up shared by the engine tests (model, executor, kernels): one torch thread, the dense greedy oracle,
and a multi-step run of an executor. Plain functions: a test module wraps what it needs as a fixture.

Imported as `engine_helpers` (pytest puts tests/ on sys.path); the Triton child-process scripts put
`TESTS_DIR` on their path first.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import torch

from reference_engine.executor.base import SeqChunk, StepBatch
from reference_engine.executor.torch_executor import TorchExecutor
from reference_engine.model import Transformer, build_model

TESTS_DIR = str(Path(__file__).resolve().parent)


def one_torch_thread() -> Iterator[None]:
    """The tiny model's matmuls gain nothing from a second thread, and on a busy machine OpenMP's
    spin-waiting makes two threads several times slower. Restored afterwards for other modules.

    Use as `_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def greedy(model: Transformer, prompt: list[int], num_new: int) -> list[int]:
    """The next `num_new` greedy tokens after `prompt`, one dense forward over the whole sequence each."""
    ids = list(prompt)
    for _ in range(num_new):
        ids.append(int(model.forward_dense(ids)[-1].argmax()))
    return ids[len(prompt) :]


@functools.cache
def tiny_oracle() -> Transformer:
    """The tiny model built on its own (same config and seed as the executors), so an executor's weights
    are checked too. Shared: no test may modify it."""
    return build_model("tiny", seed=0)


def dense_greedy(prompt: list[int], num_new: int) -> list[int]:
    """`greedy` on `tiny_oracle()`, cached: many tests ask for the same continuation."""
    return list(_dense_greedy(tuple(prompt), num_new))


@functools.cache
def _dense_greedy(prompt: tuple[int, ...], num_new: int) -> tuple[int, ...]:
    return tuple(greedy(tiny_oracle(), list(prompt), num_new))


def prefill_then_decode(
    ex: TorchExecutor, prompts: list[list[int]], tables: list[list[int]], num_new: int, first_chunk: int = 0
) -> list[list[int]]:
    """Greedy tokens of all sequences batched together: each prompt's first `first_chunk` tokens as an
    unsampled prefill step (none when 0), the rest in one sampled step (a mixed step when chunked), then
    `num_new - 1` decode steps of one token per sequence. Returns each sequence's generated tokens."""
    seqs = [list(p) for p in prompts]
    ids = range(len(seqs))
    if first_chunk:
        ex.execute(StepBatch([SeqChunk(i, seqs[i][:first_chunk], 0, tables[i], False) for i in ids]))
    r = ex.execute(StepBatch([SeqChunk(i, seqs[i][first_chunk:], first_chunk, tables[i], True) for i in ids]))
    for i in ids:
        seqs[i].append(r.tokens[i])
    for _ in range(num_new - 1):
        r = ex.execute(StepBatch([SeqChunk(i, seqs[i][-1:], len(seqs[i]) - 1, tables[i], True) for i in ids]))
        for i in ids:
            seqs[i].append(r.tokens[i])
    return [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)]
