"""min_tokens as vLLM does it: EOS is masked out of the logits until min_tokens tokens are generated, so a
request cannot end early; the scheduler ends a request on the first EOS it gets (unless ignore_eos)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")
from engine_helpers import dense_greedy, one_torch_thread

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine, VirtualClock
from reference_engine.executor.base import SamplingParams, SeqChunk, StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.executor.torch_executor import TorchExecutor
from reference_engine.scheduler import Scheduler
from reference_engine.sequence import Sequence
from slobench.errors import EngineConfigError

NUM_BLOCKS = 64
PROMPT = [3, 17, 101, 42, 250, 7]  # six tokens: prefill spans two blocks of 4

_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


@pytest.fixture(scope="module")
def eos_model() -> Iterator[TorchExecutor]:
    """The tiny model with an output bias that makes EOS the greedy choice at every step (and nearly
    certain when sampled): any EOS kept out of the output was kept out by the mask."""
    ex = TorchExecutor("tiny", NUM_BLOCKS, 4, seed=0)
    assert ex.eos_token_id is not None
    bias = torch.zeros(ex.vocab_size)
    bias[ex.eos_token_id] = 1e4
    ex.model.output.bias = torch.nn.Parameter(bias, requires_grad=False)
    yield ex


def engine_on(ex: TorchExecutor | ModeledExecutor) -> LLMEngine:
    cfg = EngineConfig(block_size=4, num_blocks=ex.num_blocks, max_num_seqs=8, max_num_batched_tokens=16,
                       max_model_len=128, enable_prefix_caching=False)
    return LLMEngine(cfg, ex, VirtualClock())


def run_each(engine: LLMEngine, requests: list[tuple[list[int], dict[str, object]]]) -> list[list[int]]:
    """Requests with their own keyword arguments, all in flight together; the tokens of each."""
    ids = [engine.add_request(p, **kw) for p, kw in requests]  # type: ignore[arg-type]
    out: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        for ev in engine.step():
            if ev.token_id is not None:
                out[ev.request_id].append(ev.token_id)
    return [out[i] for i in ids]


# ---- torch executor ------------------------------------------------------------------------------------
def test_greedy_eos_ends_at_once_without_min_tokens(eos_model: TorchExecutor) -> None:
    [out] = engine_on(eos_model).generate([PROMPT], max_tokens=20)
    assert out.token_ids == [eos_model.eos_token_id] and out.finish_reason == "stop"


@pytest.mark.parametrize("min_tokens", [1, 5, 11])
def test_greedy_masks_eos_until_min_tokens(eos_model: TorchExecutor, min_tokens: int) -> None:
    eos = eos_model.eos_token_id
    expected = dense_greedy(PROMPT, min_tokens)  # the unbiased model: what wins once EOS is masked
    assert eos not in expected
    [out] = engine_on(eos_model).generate([PROMPT], max_tokens=20, min_tokens=min_tokens)
    assert out.token_ids == [*expected, eos] and out.finish_reason == "stop"


def test_rows_are_masked_by_their_own_min_tokens(eos_model: TorchExecutor) -> None:
    """One step, three sequences: only the row short of its min_tokens is masked (the index-tensor path),
    and a row at exactly min_tokens may end."""
    eos = eos_model.eos_token_id
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 256) for _ in range(n)] for n in (5, 7, 3)]
    params = [SamplingParams(min_tokens=0), SamplingParams(min_tokens=2), SamplingParams(min_tokens=3)]
    num_generated = [0, 0, 3]
    chunks = [SeqChunk(i, p, 0, [4 * i, 4 * i + 1], True, sp, g)
              for i, (p, sp, g) in enumerate(zip(prompts, params, num_generated, strict=True))]
    tokens = eos_model.execute(StepBatch(chunks)).tokens
    assert tokens == [eos, dense_greedy(prompts[1], 1)[0], eos]


def test_ignore_eos_with_min_tokens_masks_then_keeps_eos_as_a_token(eos_model: TorchExecutor) -> None:
    eos = eos_model.eos_token_id
    [out] = engine_on(eos_model).generate([PROMPT], max_tokens=7, min_tokens=3, ignore_eos=True)
    assert out.token_ids == [*dense_greedy(PROMPT, 3), eos, eos, eos, eos] and out.finish_reason == "length"


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_seeded_sampling_with_min_tokens_is_reproducible(eos_model: TorchExecutor, top_p: float) -> None:
    eos = eos_model.eos_token_id
    seeded = {"max_tokens": 20, "min_tokens": 6, "sampling": SamplingParams(temperature=1.0, top_p=top_p,
                                                                            seed=11)}
    [alone] = run_each(engine_on(eos_model), [(PROMPT, seeded)])
    # Batched with others (an unmasked greedy one, an unseeded sampled one): the same tokens again.
    other = [9, 8, 7, 6, 5, 4, 3, 2, 1]
    batched = run_each(engine_on(eos_model), [(other, {"max_tokens": 4}), (PROMPT, seeded),
                                              (other, {"max_tokens": 9, "min_tokens": 8,
                                                       "sampling": SamplingParams(temperature=1.0)})])
    assert batched[1] == alone
    assert len(alone) == 7 and eos not in alone[:6] and alone[6] == eos
    assert batched[0] == [eos] and eos not in batched[2][:8]
    # A different seed draws differently (the test could fail if the seed were ignored).
    reseeded = dict(seeded, sampling=SamplingParams(temperature=1.0, top_p=top_p, seed=12))
    assert run_each(engine_on(eos_model), [(PROMPT, reseeded)])[0][:6] != alone[:6]


# ---- modeled executor ----------------------------------------------------------------------------------
PROFILE = CostProfile("test", step_overhead_s=0.001, per_prefill_token_s=0.0, per_decode_seq_s=0.0,
                      per_context_token_s=0.0)


@pytest.mark.parametrize("min_tokens", [0, 1, 9])
def test_modeled_always_eos_yields_exactly_min_tokens_then_eos(min_tokens: int) -> None:
    ex = ModeledExecutor(PROFILE, block_size=4, num_blocks=32, vocab_size=300, eos_token_id=0,
                         eos_probability=1.0)
    [out] = engine_on(ex).generate([PROMPT], max_tokens=20, min_tokens=min_tokens)
    assert len(out.token_ids) == min_tokens + 1 and out.finish_reason == "stop"
    assert 0 not in out.token_ids[:min_tokens] and out.token_ids[-1] == 0
    n = len(PROMPT)
    assert out.token_ids[:min_tokens] == [ex.token_at(out.request_id, n + i, allow_eos=False)
                                          for i in range(min_tokens)]


# ---- scheduler -----------------------------------------------------------------------------------------
class AlwaysEOS:
    """A broken executor: EOS every time, min_tokens or not."""

    block_size, num_blocks, vocab_size, eos_token_id = 4, 16, 10, 9

    def execute(self, batch: StepBatch) -> StepResult:
        return StepResult([self.eos_token_id if c.sample else None for c in batch.chunks])


def test_scheduler_passes_min_tokens_to_the_executor_and_refuses_an_early_eos() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=16, max_model_len=64, enable_prefix_caching=False)
    s, ex = Scheduler(cfg, eos_token_id=9), AlwaysEOS()
    seq = Sequence(0, [1, 2, 3], max_tokens=8, min_tokens=2, sampling=SamplingParams(seed=4))
    s.add(seq)
    assert seq.sampling == SamplingParams(seed=4, min_tokens=2)
    batch = s.schedule()
    assert batch.chunks[0].sampling.min_tokens == 2 and batch.chunks[0].num_generated == 0
    with pytest.raises(ValueError, match="before its min_tokens 2"):  # not kept as an ordinary token
        s.update(batch, ex.execute(batch))


def test_scheduler_ends_on_the_first_eos_once_min_tokens_is_met() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=16, max_model_len=64, enable_prefix_caching=False)
    s, ex = Scheduler(cfg, eos_token_id=9), AlwaysEOS()
    seq = Sequence(0, [1, 2, 3, 5, 6], max_tokens=8, min_tokens=1)
    s.add(seq)
    seq.token_ids.append(4)  # as if the executor had masked EOS for the first token
    batch = s.schedule()
    assert batch.chunks[0].num_generated == 1
    [out] = s.update(batch, ex.execute(batch))
    assert out.finish_reason == "stop" and seq.output_token_ids == [4, 9]


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_sampling_params_reject_a_bad_min_tokens(bad: object) -> None:
    with pytest.raises(EngineConfigError, match="min_tokens"):
        SamplingParams(min_tokens=bad)  # type: ignore[arg-type]
