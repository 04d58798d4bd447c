"""The seam between the scheduler (pure Python) and whatever runs one step (a model, or a cost model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from reference_engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    # EOS may not be sampled while fewer than this many tokens are generated: executors mask it out of the
    # logits (vLLM's min_tokens), so the request cannot end early. The scheduler sets it from the request.
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ConfigError("min_tokens", self.min_tokens, "must be an integer >= 0")


@dataclass(slots=True)
class SeqChunk:
    """One sequence's share of a step.

    The executor computes `token_ids` at positions start_pos .. start_pos+len-1, writing their K/V into the
    slots given by `block_table` (slot = block_table[pos // block_size] * block_size + pos % block_size),
    and attends over positions 0 .. start_pos+len-1 (never beyond: KV past that is not written yet).
    """

    seq_id: int
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool  # True when this chunk ends at the sequence's last known token: sample the next one
    sampling: SamplingParams = field(default_factory=SamplingParams)
    num_generated: int = 0  # tokens generated so far (seeded sampling uses it to stay reproducible)


@dataclass(slots=True)
class StepBatch:
    chunks: list[SeqChunk]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks if not (c.sample and len(c.token_ids) == 1))

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for c in self.chunks if c.sample and len(c.token_ids) == 1)

    @property
    def num_context_tokens(self) -> int:
        return sum(c.start_pos + len(c.token_ids) for c in self.chunks)

    def features(self) -> tuple[int, int, int, int, int]:
        """(prompt tokens, decoding sequences, context tokens, attention pairs, first tokens) in one pass: what
        `CostProfile.step_s` charges (the modeled executor) and the step log records (reference_engine.step_log).
        A one-token chunk that samples is a decode; a request samples its first token when it has none yet."""
        prefill = decode = context = pairs = firsts = 0
        for c in self.chunks:
            n = len(c.token_ids)
            context += c.start_pos + n
            pairs += n * c.start_pos + n * (n + 1) // 2
            if c.sample and n == 1:
                decode += 1
            else:
                prefill += n
            if c.sample and not c.num_generated:
                firsts += 1
        return prefill, decode, context, pairs, firsts


@dataclass(slots=True)
class StepResult:
    tokens: list[int | None]  # one per chunk: the sampled token, or None where chunk.sample is False
    modeled_s: float | None = None  # a modeled executor's step time; None when the step really ran


class Executor(Protocol):
    """Runs a step. Contract: for a sampled chunk with num_generated < sampling.min_tokens, the token is
    never `eos_token_id` (the scheduler ends a request on the first EOS it gets, unless ignore_eos)."""

    block_size: int
    num_blocks: int
    vocab_size: int
    eos_token_id: int | None

    def execute(self, batch: StepBatch) -> StepResult: ...
