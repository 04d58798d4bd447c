"""The paged, selectively batched executor gives exactly the tokens of the dense model (fp32, CPU)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")
from engine_helpers import TESTS_DIR, dense_greedy, one_torch_thread

from reference_engine.executor.base import SamplingParams, SeqChunk, StepBatch
from reference_engine.executor.torch_executor import TorchExecutor, kv_bytes_per_token, num_blocks_for_memory
from slobench.errors import EngineConfigError

NUM_BLOCKS = 96


_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


@dataclass
class Seq:
    seq_id: int
    tokens: list[int]  # prompt, then generated tokens as they come
    block_table: list[int]
    num_prompt: int
    num_new: int
    num_computed: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.num_new


def step(ex: TorchExecutor, seqs: list[Seq], rng: random.Random, max_chunk: int) -> None:
    """One step: every unfinished sequence contributes a chunk (a prefill piece of random size, or its
    decode token), in a shuffled order, all in one StepBatch."""
    live = [s for s in seqs if not s.done]
    rng.shuffle(live)
    chunks = []
    for s in live:
        n = min(len(s.tokens) - s.num_computed, rng.randint(1, max_chunk))
        sample = s.num_computed + n == len(s.tokens)
        chunks.append(SeqChunk(s.seq_id, s.tokens[s.num_computed : s.num_computed + n], s.num_computed,
                               s.block_table, sample, s.sampling, len(s.generated)))
    result = ex.execute(StepBatch(chunks))
    assert len(result.tokens) == len(chunks)
    for s, c, token in zip(live, chunks, result.tokens, strict=True):
        s.num_computed += len(c.token_ids)
        assert (token is None) == (not c.sample)
        if token is not None:
            s.tokens.append(token)


def run_all(ex: TorchExecutor, seqs: list[Seq], rng: random.Random, max_chunk: int = 6) -> None:
    for _ in range(1000):
        if all(s.done for s in seqs):
            return
        step(ex, seqs, rng, max_chunk)
    raise AssertionError("sequences did not finish")


def make_seqs(prompts: list[list[int]], num_new: int, block_size: int, rng: random.Random) -> list[Seq]:
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)  # non-contiguous, out-of-order block tables
    seqs = []
    for i, prompt in enumerate(prompts):
        nb = -(-(len(prompt) + num_new) // block_size)
        table, free = free[:nb], free[nb:]
        seqs.append(Seq(i, list(prompt), table, len(prompt), num_new))
    return seqs


def poison(ex: TorchExecutor) -> None:
    """Huge values in every slot: attending to any KV not written yet turns the tokens into garbage.
    (Finite, because slots past a context are read and masked: NaN would survive the mask.)"""
    gen = torch.Generator().manual_seed(0)
    for cache in (*ex.k_cache, *ex.v_cache):
        cache.copy_(torch.randn(cache.shape, generator=gen) * 1e3)


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


@pytest.fixture(scope="module")
def executors() -> dict[int, TorchExecutor]:
    return {bs: TorchExecutor("tiny", NUM_BLOCKS, bs, seed=0) for bs in (4, 16)}


@pytest.mark.parametrize(
    ("block_size", "backend"), [(4, "sdpa"), (16, "sdpa"), (4, "kernels")], ids=["bs4", "bs16", "bs4-kernels"]
)
def test_concurrent_greedy_matches_dense(
    executors: dict[int, TorchExecutor], block_size: int, backend: str
) -> None:
    # "kernels" routes attention through reference_engine.kernels (their torch reference on the CPU).
    ex = (
        executors[block_size]
        if backend == "sdpa"
        else TorchExecutor("tiny", NUM_BLOCKS, 4, attention_backend=backend)
    )
    poison(ex)
    rng = random.Random(block_size)
    # 1-token prompt, prompts of exactly one and two blocks, and ones that cross boundaries while decoding.
    lengths = [1, block_size, 2 * block_size, block_size + 3, 13, 29]
    prompts = [random_prompt(rng, n) for n in lengths]
    seqs = make_seqs(prompts, num_new=7, block_size=block_size, rng=rng)
    run_all(ex, seqs, rng)
    for s, prompt in zip(seqs, prompts, strict=True):
        assert s.generated == dense_greedy(prompt, s.num_new), f"prompt length {len(prompt)}"


def test_whole_prompt_prefill_then_batched_decode(executors: dict[int, TorchExecutor]) -> None:
    """Prefill in one chunk per sequence (is_causal path), then pure decode steps (the all-decode path)."""
    ex = executors[4]
    poison(ex)
    rng = random.Random(7)
    prompts = [random_prompt(rng, n) for n in (3, 8, 11, 1)]
    seqs = make_seqs(prompts, num_new=9, block_size=4, rng=rng)
    run_all(ex, seqs, rng, max_chunk=64)
    for s, prompt in zip(seqs, prompts, strict=True):
        assert s.generated == dense_greedy(prompt, 9)


def test_prefix_shared_blocks_give_the_same_tokens(executors: dict[int, TorchExecutor]) -> None:
    ex = executors[4]
    poison(ex)
    rng = random.Random(3)
    shared = random_prompt(rng, 8)  # two full blocks
    a_prompt, b_prompt = shared + random_prompt(rng, 5), shared + random_prompt(rng, 3)
    a, b = make_seqs([a_prompt, b_prompt], num_new=6, block_size=4, rng=rng)
    b.block_table[:2] = a.block_table[:2]  # b reuses a's prefix blocks, as a prefix-cache hit does
    run_all(ex, [a], rng)  # a writes the shared KV (and finishes)
    b.num_computed = len(shared)  # b starts right after the cached prefix
    c_prompt = shared + [b_prompt[8]]  # the prefix plus one token: only one token left to compute
    spare = [x for x in range(NUM_BLOCKS) if x not in set(a.block_table) | set(b.block_table)]
    c = Seq(2, list(c_prompt), a.block_table[:2] + spare[:2], len(c_prompt), 6, num_computed=len(shared))
    run_all(ex, [b, c], rng)
    assert a.generated == dense_greedy(a_prompt, 6)
    assert b.generated == dense_greedy(b_prompt, 6)
    assert c.generated == dense_greedy(c_prompt, 6)


@pytest.mark.parametrize("new_blocks", [False, True])
def test_recompute_after_preemption_gives_the_same_tokens(
    executors: dict[int, TorchExecutor], new_blocks: bool
) -> None:
    ex = executors[4]
    poison(ex)
    rng = random.Random(11)
    prompt = random_prompt(rng, 10)
    (s,) = make_seqs([prompt], num_new=12, block_size=4, rng=rng)
    s.num_new = 5
    run_all(ex, [s], rng)  # 5 tokens in, the sequence is preempted: its KV is thrown away
    for block in s.block_table:
        for cache in (*ex.k_cache, *ex.v_cache):
            cache[block].normal_()
    if new_blocks:
        s.block_table = [b for b in range(NUM_BLOCKS) if b not in s.block_table][::-7][: len(s.block_table)]
    s.num_computed, s.num_new = 0, 12  # recompute prompt + generated tokens from scratch, then go on
    other = make_seqs([random_prompt(rng, 6)], num_new=4, block_size=4, rng=random.Random(5))[0]
    other.seq_id, other.block_table = 1, [b for b in range(NUM_BLOCKS) if b not in s.block_table][:3]
    run_all(ex, [s, other], rng)
    assert s.generated == dense_greedy(prompt, 12)


def test_seeded_sampling_is_reproducible_across_batches(executors: dict[int, TorchExecutor]) -> None:
    ex = executors[16]
    rng = random.Random(1)
    prompt = random_prompt(rng, 9)

    def sample_run(seed: int | None, with_company: bool, top_p: float = 0.9) -> list[int]:
        sp = SamplingParams(temperature=1.0, top_p=top_p, seed=seed)
        prompts = [prompt] + ([random_prompt(rng, 17)] if with_company else [])
        seqs = make_seqs(prompts, num_new=12, block_size=16, rng=random.Random(2))
        seqs[0].sampling = sp
        if with_company:  # unseeded random sampling in the same batch must not disturb the seeded row
            seqs[1].sampling = SamplingParams(temperature=0.8, top_p=0.95)
        run_all(ex, seqs, random.Random(4 if with_company else 5))
        return seqs[0].generated

    first = sample_run(seed=42, with_company=False)
    assert sample_run(seed=42, with_company=True) == first  # batch composition and chunking do not matter
    assert sample_run(seed=43, with_company=False) != first
    assert first != dense_greedy(prompt, 12)  # temperature 1 really samples
    unseeded = sample_run(seed=None, with_company=False)
    assert all(0 <= t < ex.vocab_size for t in unseeded)
    # A top_p so small that only the most likely token survives is greedy decoding.
    assert sample_run(seed=7, with_company=True, top_p=1e-6) == dense_greedy(prompt, 12)
    assert sample_run(seed=8, with_company=False, top_p=0.0) == dense_greedy(prompt, 12)


def test_only_chunks_marked_sample_get_a_token(executors: dict[int, TorchExecutor]) -> None:
    ex = executors[4]
    chunks = [SeqChunk(0, [1, 2, 3], 0, [5], False), SeqChunk(1, [4], 0, [6], True)]
    assert ex.execute(StepBatch(chunks)).tokens[0] is None
    assert isinstance(ex.execute(StepBatch([SeqChunk(1, [4], 0, [6], True)])).tokens[0], int)
    assert ex.execute(StepBatch([])).tokens == []


def test_block_table_too_short_is_a_clear_error(executors: dict[int, TorchExecutor]) -> None:
    ex = executors[4]
    with pytest.raises(ValueError, match="seq 9: block_table has 1 blocks"):
        ex.execute(StepBatch([SeqChunk(9, [1, 2, 3, 4, 5], 0, [3], True)]))


_TRITON_SCRIPT = f"""
import random, sys
sys.path.insert(0, {TESTS_DIR!r})
from engine_helpers import greedy, prefill_then_decode
from reference_engine.executor.torch_executor import TorchExecutor
from reference_engine import kernels
ex = TorchExecutor("tiny", 16, 4, attention_backend="kernels")
rng = random.Random(0)
prompts = [[rng.randrange(256) for _ in range(n)] for n in (5, 8)]
tables = [[3, 9, 1, 12], [7, 0, 14, 5]]
want = [greedy(ex.model, p, 4) for p in prompts]
# chunked prefill: first 3 tokens, then the rest (mixed step: extend kernel), then pure decode steps
got = prefill_then_decode(ex, prompts, tables, 4, first_chunk=3)
assert kernels.uses_triton(ex.k_cache[0])
assert got == want, (got, want)
print("ok")
"""


@pytest.mark.kernels
def test_triton_kernels_through_the_interpreter_match_dense() -> None:
    """The executor's kernel wiring (slots, int32 block tables, cu_seqlens, prefix lens) on the real Triton
    kernels, run by Triton's CPU interpreter in a child process (the flag must precede triton's import)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SLOBENCH_FORCE_TRITON": "1"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_unknown_attention_backend_is_a_spec_error() -> None:
    with pytest.raises(EngineConfigError, match="attention_backend"):
        TorchExecutor("tiny", 4, 4, attention_backend="flash")


def test_sizes_and_protocol_attributes(executors: dict[int, TorchExecutor]) -> None:
    ex = executors[4]
    assert ex.kv_bytes_per_token == kv_bytes_per_token("tiny") == 2 * 4 * 2 * 32 * 4
    assert kv_bytes_per_token("llama-3.2-1b", torch.bfloat16) == 32 * 1024  # 32 KiB per token, as NOTES say
    assert num_blocks_for_memory(ex.kv_bytes_per_token * 16 * 10 + 5, "tiny", 16) == 10
    assert (ex.num_blocks, ex.block_size, ex.vocab_size, ex.eos_token_id) == (NUM_BLOCKS, 4, 512, 257)
    assert ex.k_cache[0].shape == (NUM_BLOCKS, 4, 2, 32) and len(ex.v_cache) == 4


def test_executor_loads_a_checkpoint(tmp_path, executors: dict[int, TorchExecutor]) -> None:
    from reference_engine.weights import save_hf_checkpoint

    save_hf_checkpoint(executors[4].model, tmp_path)
    ex = TorchExecutor("tiny", 16, 4, weights_path=tmp_path)
    prompt = [10, 20, 30, 40, 50]
    (s,) = make_seqs([prompt], num_new=5, block_size=4, rng=random.Random(0))
    s.block_table = [b % 16 for b in s.block_table]
    run_all(ex, [s], random.Random(0))
    assert s.generated == dense_greedy(prompt, 5)


# --- the real engine (scheduler + block manager + step loop) on this executor ------------------------------


@pytest.mark.parametrize(
    ("prefix_caching", "num_blocks"),
    [(True, NUM_BLOCKS), (False, NUM_BLOCKS), (True, 14), (False, 14)],
    ids=["cache-on", "cache-off", "cache-on-preempt", "cache-off-preempt"],
)
def test_llm_engine_generate_matches_dense(prefix_caching: bool, num_blocks: int) -> None:
    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine

    rng = random.Random(21)
    shared = random_prompt(rng, 8)  # two blocks of 4: the prefix cache can serve them
    prompts = [shared + random_prompt(rng, n) for n in (0, 1, 5)] + [
        random_prompt(rng, n) for n in (1, 4, 10)
    ]
    num_new = 10
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=12,
                       max_model_len=64, enable_prefix_caching=prefix_caching, prefix_hash_key=b"test")
    ex = TorchExecutor("tiny", num_blocks, 4, seed=0)
    poison(ex)
    engine = LLMEngine(cfg, ex)
    first = engine.generate(prompts, max_tokens=num_new, ignore_eos=True)
    again = engine.generate(prompts[:3], max_tokens=num_new, ignore_eos=True)  # prefixes cached by now
    expected = [dense_greedy(p, num_new) for p in prompts]
    assert [o.token_ids for o in first] == expected
    assert [o.token_ids for o in again] == expected[:3]
    stats = engine.stats()
    assert (stats.num_prefix_hit_tokens > 0) == prefix_caching
    if num_blocks < NUM_BLOCKS:
        assert stats.num_preemptions > 0  # the small cache really forced recomputation
    assert stats.num_blocks_in_use == 0 and stats.num_idle_check_failures == 0
