"""The torch executor's GPU path, tested for its logic on the CPU: CUDA-graph sizes and fallbacks, the padded
static-buffer layout a graph replays (run eagerly here), KV sizing from memory, dtype resolution, server
knobs. The tests that capture and replay real graphs need CUDA and are skipped without it."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")
from engine_helpers import TESTS_DIR, dense_greedy, one_torch_thread

from reference_engine.executor.base import SeqChunk, StepBatch
from reference_engine.executor.cuda_graphs import (
    DecodeGraphRunner,
    GraphPlan,
    graph_batch_sizes,
    use_cuda_graphs,
)
from reference_engine.executor.kv_sizing import GIB, MemoryProfile, num_kv_blocks, warmup_chunks
from reference_engine.executor.torch_executor import TorchExecutor, resolve_dtype
from slobench.errors import EngineConfigError

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: graph capture and replay need one")
BLOCK_SIZE = 4
NUM_BLOCKS = 64


_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


# ---- which graph, and when not --------------------------------------------------------------------------


def decode(seq_id: int, start_pos: int, table: list[int] | None = None) -> SeqChunk:
    nb = start_pos // BLOCK_SIZE + 1
    return SeqChunk(seq_id, [7], start_pos, table if table is not None else list(range(nb)), sample=True)


@pytest.mark.parametrize(
    ("max_num_seqs", "sizes"),
    [
        (1, (1,)),
        (64, (1, 2, 4, 8, 16, 32, 64)),
        (48, (1, 2, 4, 8, 16, 32, 48)),  # a full batch of 48 gets its own graph
        (256, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
        (1000, (1, 2, 4, 8, 16, 32, 64, 128, 256)),  # capped: batches above 256 run eagerly
    ],
)
def test_graph_batch_sizes(max_num_seqs: int, sizes: tuple[int, ...]) -> None:
    assert graph_batch_sizes(max_num_seqs) == sizes


def test_graph_batch_sizes_rejects_bad_limits() -> None:
    with pytest.raises(EngineConfigError, match="max_num_seqs"):
        graph_batch_sizes(0)
    with pytest.raises(EngineConfigError, match="batch_sizes"):
        GraphPlan((4, 2), 16, 128)
    with pytest.raises(EngineConfigError, match="max_context_len"):
        GraphPlan((1, 2), 16, 0)


@pytest.mark.parametrize(
    ("num_seqs", "padded"), [(1, 1), (2, 2), (3, 4), (5, 8), (33, 64), (64, 64), (65, None)]
)
def test_padded_size_is_the_next_captured_size(num_seqs: int, padded: int | None) -> None:
    plan = GraphPlan.for_limits(64, 256, 16)
    assert plan.padded_size(num_seqs) == padded


def test_choose_graph_or_eager() -> None:
    plan = GraphPlan((1, 2, 4), BLOCK_SIZE, 20)  # 5 blocks of 4 tokens wide
    assert plan.max_blocks_per_seq == 5
    choice = plan.choose([decode(0, 0), decode(1, 9), decode(2, 19)])  # context 20: exactly the width
    assert choice.is_graph and choice.batch_size == 4, choice.reason
    prefill = SeqChunk(3, [1, 2, 3], 0, [0], sample=True)
    assert plan.choose([prefill]).batch_size is None
    mixed = plan.choose([decode(0, 5), prefill])
    assert mixed.batch_size is None and "prefill or mixed" in mixed.reason
    too_many = plan.choose([decode(i, 3) for i in range(5)])
    assert too_many.batch_size is None and "above the largest graph (4)" in too_many.reason
    too_wide = plan.choose([decode(0, 3), decode(1, 20)])  # context 21 > 20 tokens captured
    assert too_wide.batch_size is None and "context 21 wider" in too_wide.reason
    assert not plan.choose([]).is_graph


def test_graphs_only_on_cuda_with_the_kernels_and_not_enforce_eager() -> None:
    assert use_cuda_graphs("cuda", "kernels", False)[0]
    assert use_cuda_graphs(torch.device("cuda", 1), "kernels", False)[0]
    off = {use_cuda_graphs("cpu", "kernels", False), use_cuda_graphs("cuda", "sdpa", False),
           use_cuda_graphs("cuda", "kernels", True)}
    assert {is_on for is_on, _ in off} == {False}
    assert use_cuda_graphs("cuda", "kernels", True)[1] == "enforce_eager is set"


@pytest.mark.parametrize(
    ("given", "device", "want"),
    [("auto", "cuda", torch.bfloat16), ("auto", "cuda:1", torch.bfloat16), ("auto", "cpu", torch.float32),
     ("bfloat16", "cpu", torch.bfloat16), ("float16", "cuda", torch.float16), (torch.float64, "cpu", torch.float64)],
)
def test_dtype_auto_resolution(given: str | torch.dtype, device: str, want: torch.dtype) -> None:
    assert resolve_dtype(given, device) == want


@pytest.mark.parametrize("bad", ["int32", "bf16x", "bool"])
def test_dtype_names_that_are_not_float_dtypes_are_spec_errors(bad: str) -> None:
    with pytest.raises(EngineConfigError, match="dtype"):
        resolve_dtype(bad, "cpu")


# ---- KV sizing ------------------------------------------------------------------------------------------


def test_kv_blocks_from_given_memory_numbers() -> None:
    profile = MemoryProfile(total_bytes=80 * GIB, used_bytes=3 * GIB, activation_peak_bytes=2 * GIB)
    per_block = 16 * 32 * 1024  # llama-3.2-1b in bf16: 32 KiB per token, 16 tokens per block
    # 0.9 × 80 − 3 − 2 = 67 GiB of blocks of 512 KiB.
    assert num_kv_blocks(profile, 0.9, per_block) == 67 * 2048
    assert num_kv_blocks(profile, 1.0, per_block) == 75 * 2048
    assert num_kv_blocks(profile, 0.9, per_block + 1) == (67 * GIB) // (per_block + 1)


def test_kv_sizing_says_clearly_when_nothing_fits() -> None:
    profile = MemoryProfile(total_bytes=80 * GIB, used_bytes=70 * GIB, activation_peak_bytes=3 * GIB)
    with pytest.raises(EngineConfigError, match=r"leaves room for 0 KV blocks.*0.9 × 80.00 GiB total − 70.00 GiB in use"
                                        r".*3.00 GiB activation peak = -1.00 GiB.*--kv-blocks"):
        num_kv_blocks(profile, 0.9, 512 * 1024)
    roomy = MemoryProfile(total_bytes=80 * GIB, used_bytes=0, activation_peak_bytes=0)
    with pytest.raises(EngineConfigError, match="leaves room for 10 KV blocks, 11 needed"):
        num_kv_blocks(roomy, 0.5, 4 * GIB, min_blocks=11)
    with pytest.raises(EngineConfigError, match="gpu_memory_utilization"):
        num_kv_blocks(roomy, 1.5, 1024)
    with pytest.raises(EngineConfigError, match="used_bytes"):
        MemoryProfile(total_bytes=GIB, used_bytes=-1, activation_peak_bytes=0)


@pytest.mark.parametrize(("tokens", "max_seqs", "max_len"), [(2048, 64, 4096), (8192, 256, 8192), (100, 256, 4096),
                                                             (8192, 1, 2048), (10, 3, 16)])
def test_warmup_step_covers_the_token_budget(tokens: int, max_seqs: int, max_len: int) -> None:
    chunks, num_blocks = warmup_chunks(tokens, max_seqs, max_len, 16)
    lens = [len(c.token_ids) for c in chunks]
    assert sum(lens) == tokens and max(lens) <= max_len and min(lens) >= 1
    assert len(chunks) >= min(max_seqs, tokens) and all(c.sample and c.start_pos == 0 for c in chunks)
    blocks = [b for c in chunks for b in c.block_table]
    assert sorted(blocks) == list(range(num_blocks))  # disjoint, back to back
    assert all(len(c.block_table) * 16 >= len(c.token_ids) for c in chunks)


def test_cpu_executor_needs_kv_blocks() -> None:
    with pytest.raises(EngineConfigError, match="num_blocks: must be given on cpu"):
        TorchExecutor("tiny", None, BLOCK_SIZE)


# ---- the CPU executor and the padded static-buffer layout --------------------------------------------------


def test_cpu_executor_never_tries_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[object] = []
    monkeypatch.setattr(DecodeGraphRunner, "capture", lambda self, sizes=None: attempts.append(sizes))
    for backend in ("sdpa", "kernels"):
        ex = TorchExecutor("tiny", 8, BLOCK_SIZE, attention_backend=backend)
        assert ex.decode_graphs is None and "not CUDA" in ex.graphs_off_reason
        assert ex.dtype == torch.float32
        ex.execute(StepBatch([SeqChunk(0, [1, 2, 3], 0, [0], True)]))
        ex.execute(StepBatch([decode(0, 3, [0])]))  # a decode step: still eager, nothing to replay
    assert attempts == []


def test_a_failed_capture_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the CPU qualifies: the capture then fails (no CUDA) and the executor serves eagerly."""
    from reference_engine.executor import torch_executor

    monkeypatch.setattr(torch_executor, "use_cuda_graphs", lambda *a: (True, "forced"))
    ex = TorchExecutor("tiny", 8, BLOCK_SIZE, max_num_seqs=4, max_model_len=32)
    assert ex.decode_graphs is None and ex.graphs_off_reason.startswith("capture failed: RuntimeError")
    assert ex.execute(StepBatch([SeqChunk(0, [1, 2, 3], 0, [0], True)])).tokens[0] is not None


def padded_executor(plan: GraphPlan) -> TorchExecutor:
    """A CPU executor whose decode steps go through the graph runner's buffers, uncaptured: eager replays."""
    ex = TorchExecutor("tiny", NUM_BLOCKS, BLOCK_SIZE)
    ex.decode_graphs = DecodeGraphRunner(ex.model, ex.k_cache, ex.v_cache, plan)
    return ex


def test_buffer_layout_of_a_padded_batch() -> None:
    plan = GraphPlan((1, 2, 4, 8), BLOCK_SIZE, 32)
    runner = padded_executor(plan).decode_graphs
    assert runner is not None
    b = runner.buffers
    b.ints.fill_(99)  # stale values from an earlier, larger step
    chunks = [decode(0, 0, [5]), decode(1, 6, [3, 9]), decode(2, 12, [1, 2, 4, 6, 8])]
    b.fill(chunks, 4)
    assert b.token_ids[:4].tolist() == [7, 7, 7, 0]
    assert b.positions[:4].tolist() == [0, 6, 12, 0]
    assert b.slot_mapping[:4].tolist() == [5 * 4 + 0, 9 * 4 + 2, 6 * 4 + 0, -1]
    assert b.ints[3, :4].tolist() == [1, 7, 13, 0]  # context lengths; 0 marks the padding row
    assert b.block_tables[:3, :4].tolist() == [[5, 0, 0, 0], [3, 9, 0, 0], [1, 2, 4, 6]]
    assert b.block_tables.shape == (8, 8)  # the widest context (32 tokens) is 8 blocks of 4
    with pytest.raises(ValueError, match="seq 3: block_table has 1 blocks"):
        b.fill([decode(3, 4, [0])], 1)
    with pytest.raises(ValueError, match="padded to 2"):
        b.fill(chunks, 2)


def prefill_all(
    executors: list[TorchExecutor], prompts: list[list[int]], tables: list[list[int]]
) -> list[int]:
    tokens: list[list[int | None]] = []
    for ex in executors:
        batch = StepBatch(
            [SeqChunk(i, p, 0, t, True) for i, (p, t) in enumerate(zip(prompts, tables, strict=True))]
        )
        tokens.append(ex.execute(batch).tokens)
    assert all(t == tokens[0] for t in tokens)
    return [int(t) for t in tokens[0] if t is not None]


def test_padded_decode_on_the_cpu_gives_the_unpadded_tokens() -> None:
    """Five sequences padded to a graph of 8 (three context-0 rows), run eagerly through the same buffers a
    CUDA graph would read: the tokens equal those of the plain executor and of the dense model, the
    padding rows write no KV and come out finite."""
    plan = GraphPlan((1, 2, 4, 8), BLOCK_SIZE, 48)
    plain, padded = TorchExecutor("tiny", NUM_BLOCKS, BLOCK_SIZE), padded_executor(plan)
    runner = padded.decode_graphs
    assert runner is not None
    rng = random.Random(3)
    lens = [3, 4, 7, 8, 1]  # block-boundary lengths: decode crosses into a new block
    prompts = [[rng.randrange(256) for _ in range(n)] for n in lens]
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(5)] for _ in prompts]  # scattered, room for 20 tokens each
    seqs = [list(p) for p in prompts]
    for s, t in zip(seqs, prefill_all([plain, padded], prompts, tables), strict=True):
        s.append(t)
    for step in range(6):
        chunks = [SeqChunk(i, s[-1:], len(s) - 1, tables[i], True) for i, s in enumerate(seqs)]
        real_slots = {tables[i][(len(s) - 1) // BLOCK_SIZE] * BLOCK_SIZE + (len(s) - 1) % BLOCK_SIZE
                      for i, s in enumerate(seqs)}
        before = padded._k_flat.clone()
        want = plain.execute(StepBatch(chunks)).tokens
        got = padded.execute(StepBatch(chunks)).tokens
        assert got == want, f"step {step}"
        changed = (padded._k_flat != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
        assert set(changed) <= real_slots and changed, "padding rows wrote KV"
        for s, tok in zip(seqs, got, strict=True):
            assert tok is not None
            s.append(tok)
    assert runner.num_eager == 6 and runner.num_replays == 0
    assert [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)] == [dense_greedy(p, 7) for p in prompts]
    # Every row the graph would compute, padding included, is finite (context 0 gives zeros, not NaN).
    runner.buffers.fill(chunks, 8)
    with torch.inference_mode():
        hidden = runner._forward(8)
    assert hidden.shape[0] == 8 and bool(torch.isfinite(hidden).all())


def test_llm_engine_with_graph_sized_decode_matches_dense() -> None:
    """The whole engine on an executor whose decode steps of up to 4 sequences take the padded path and
    larger ones (and prefills) fall back to the eager path."""
    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine

    ex = padded_executor(GraphPlan((1, 2, 4), BLOCK_SIZE, 64))
    cfg = EngineConfig(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, max_num_seqs=6, max_num_batched_tokens=16,
                       max_model_len=64, prefix_hash_key=b"test")
    engine = LLMEngine(cfg, ex)
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (2, 5, 8, 3, 6, 4)]
    max_tokens = [3, 9, 5, 12, 2, 7]  # ragged ends: the batch shrinks through 6, 5, 4, ... 1
    ids = [
        engine.add_request(p, max_tokens=m, ignore_eos=True) for p, m in zip(prompts, max_tokens, strict=True)
    ]
    got: dict[int, list[int]] = {i: [] for i in ids}
    num_big_decodes = 0
    while engine.has_work():
        events = engine.step()
        num_big_decodes += sum(ev.token_id is not None for ev in events) > 4
        for ev in events:
            if ev.token_id is not None:
                got[ev.request_id].append(ev.token_id)
    assert num_big_decodes > 0  # some steps were too big for the largest graph: eager fallback
    runner = ex.decode_graphs
    assert runner is not None and runner.num_eager > 0  # decode steps of <= 4 took the padded path
    for rid, p, m in zip(ids, prompts, max_tokens, strict=True):
        assert got[rid] == dense_greedy(p, m)


_TRITON_PADDED_SCRIPT = f"""
import random, sys
sys.path.insert(0, {TESTS_DIR!r})
from engine_helpers import greedy, prefill_then_decode
from reference_engine import kernels
from reference_engine.executor.cuda_graphs import DecodeGraphRunner, GraphPlan
from reference_engine.executor.torch_executor import TorchExecutor
ex = TorchExecutor("tiny", 16, 4, attention_backend="kernels")
runner = ex.decode_graphs = DecodeGraphRunner(ex.model, ex.k_cache, ex.v_cache, GraphPlan((1, 2, 4), 4, 24))
rng = random.Random(1)
prompts = [[rng.randrange(256) for _ in range(n)] for n in (3, 5, 8)]
tables = [[0, 9, 1], [7, 2, 14], [8, 10, 13]]  # block 0 in use: a padding write to slot 0 would show
want = [greedy(ex.model, p, 4) for p in prompts]
# whole-prompt prefill, then 3 decode steps: 3 sequences padded to the graph of 4, max_context_len = the
# 24-token width
got = prefill_then_decode(ex, prompts, tables, 4)
assert kernels.uses_triton(ex.k_cache[0]) and runner.num_eager == 3
assert got == want, (got, want)
print("ok")
"""


@pytest.mark.kernels
def test_padded_decode_through_the_triton_kernels_in_the_interpreter() -> None:
    """The exact kernel calls a captured graph makes (slot -1 and context 0 on padding rows, the captured
    width as `max_context_len`, stale table entries past each context) on the Triton kernels, run by the
    interpreter in a child process (the flag must precede triton's import)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SLOBENCH_FORCE_TRITON": "1"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_PADDED_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ---- server knobs ---------------------------------------------------------------------------------------


def test_serve_arguments_and_build_engine_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_engine import builder, server

    parser = argparse.ArgumentParser()
    server.add_serve_arguments(parser)
    args = parser.parse_args(["--executor", "torch", "--enforce-eager", "--gpu-memory-utilization", "0.8",
                              "--weights", "/ckpt", "--attention-backend", "kernels"])
    seen: dict[str, object] = {}
    monkeypatch.setattr(server, "serve", lambda spec, *a, **kw: seen.update(spec.to_knobs()))
    server.serve_from_args(args)
    assert seen["dtype"] == "auto" and seen["enforce_eager"] is True and seen["weights"] == "/ckpt"
    assert seen["gpu_memory_utilization"] == 0.8 and seen["attention_backend"] == "kernels"
    defaults = parser.parse_args([])
    assert (defaults.dtype, defaults.enforce_eager, defaults.gpu_memory_utilization) == ("auto", False, 0.9)
    assert defaults.weights is None and defaults.attention_backend is None

    engine, _ = builder.build_engine(builder.EngineSpec(executor="torch", kv_blocks=None, max_model_len=100_000))
    ex = engine.executor
    assert isinstance(ex, TorchExecutor)
    assert ex.num_blocks == engine.config.num_blocks == 1024 and ex.dtype == torch.float32
    assert ex.decode_graphs is None and ex.attention_backend == "sdpa"
    assert engine.config.max_model_len == ex.max_model_len == 2048  # capped by the tiny model


# ---- CUDA only --------------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("num_seqs", [1, 3, 8])
def test_cuda_graph_replay_matches_eager(num_seqs: int) -> None:
    kw = dict(device="cuda", dtype=torch.float32, max_num_seqs=8, max_model_len=256)
    graphed = TorchExecutor("tiny", NUM_BLOCKS, BLOCK_SIZE, **kw)  # type: ignore[arg-type]
    eager = TorchExecutor("tiny", NUM_BLOCKS, BLOCK_SIZE, enforce_eager=True, **kw)  # type: ignore[arg-type]
    runner = graphed.decode_graphs
    assert runner is not None and sorted(runner.graphs) == [1, 2, 4, 8] and eager.decode_graphs is None
    rng = random.Random(num_seqs)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 9))] for _ in range(num_seqs)]
    tables = [[i * 8 + j for j in range(8)] for i in range(num_seqs)]
    seqs = [list(p) for p in prompts]
    for s, t in zip(seqs, prefill_all([graphed, eager], prompts, tables), strict=True):
        s.append(t)
    for _ in range(8):
        chunks = [SeqChunk(i, s[-1:], len(s) - 1, tables[i], True) for i, s in enumerate(seqs)]
        hidden_graph = runner.run(chunks, runner.plan.padded_size(num_seqs) or 0).clone()
        got, want = graphed.execute(StepBatch(chunks)).tokens, eager.execute(StepBatch(chunks)).tokens
        assert got == want
        token_ids, positions, attend = eager._prepare(chunks)
        with torch.inference_mode():
            hidden_eager = eager.model(token_ids, positions, attend)
        torch.testing.assert_close(hidden_graph, hidden_eager, atol=2e-3, rtol=2e-3)
        for s, tok in zip(seqs, got, strict=True):
            s.append(int(tok or 0))
    assert runner.num_replays >= 16 and runner.num_eager == 0


@needs_cuda
def test_cuda_kv_sized_from_free_memory() -> None:
    ex = TorchExecutor("tiny", None, 16, device="cuda", max_num_batched_tokens=1024, max_num_seqs=16,
                       max_model_len=512, gpu_memory_utilization=0.25)
    prof = ex.memory_profile
    assert prof is not None and prof.activation_peak_bytes > 0 and ex.dtype == torch.bfloat16
    per_block = ex.kv_bytes_per_token * 16
    assert ex.num_blocks == num_kv_blocks(prof, 0.25, per_block, min_blocks=512 // 16) > 0
