"""One request as the scheduler sees it: its tokens, how many of them have KV written, and its blocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from reference_engine.executor.base import SamplingParams

NEVER_PRIVATE = 1 << 62  # Sequence.unshared_from when nothing is known: every block kept in full


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason:
    """The `finish_reason` strings of the OpenAI API (and vLLM's `request_success_total` label)."""

    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(slots=True, eq=False)
class Sequence:
    """`token_ids` holds the prompt then every sampled token. KV exists for the first `num_computed_tokens`;
    the last sampled token never has KV until the next step computes it (that step samples its successor)."""

    seq_id: int
    token_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Fed every output token in order; True ends the request with "stop" (reference_engine.stop.OutputText).
    stop_check: Callable[[int], bool] | None = None
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit on the latest admission
    # Prefix-cache bookkeeping: how many leading blocks of `block_table` carry a registered hash.
    num_hashed_blocks: int = 0
    # The prefix hash of each full block of `token_ids` computed so far, under the key `block_hashes_key`
    # (BlockManager.hash_chain). Tokens are only ever appended, so a block's hash never goes stale: the
    # lookup before admission and the registration after the step hash each block once between them.
    block_hashes: list[bytes | int] = field(default_factory=list)
    block_hashes_key: bytes | None = None
    # The first block index no other request's prompt shares (a simulator, which knows every prompt, says so):
    # its blocks from there on are private (the simulator's block manager, reference_engine.private_blocks). Until its first preemption.
    unshared_from: int = NEVER_PRIVATE
    # Set by a simulator that holds stand-in ids for prompt or output tokens nothing reads (a private request's:
    # no lookup can reach its blocks); rewrites them with the real ones before anything does (the block
    # manager calls it when the request is preempted and its blocks get registered).
    draw_tokens: Callable[[Sequence], None] | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens == 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def max_kv_tokens(self) -> int:
        """The most KV slots this request can ever hold: its final sampled token is never computed."""
        return self.num_prompt_tokens + self.max_tokens - 1
