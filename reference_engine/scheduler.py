"""Iteration-level scheduling (Orca; vLLM v1 style): one token budget per step, no prefill/decode phases.

Each step, every running request's computed-token count catches up towards its length: a request in prefill
gets its next chunk, a decoding one gets one token. Running requests are served first (oldest first), then
waiting ones in FIFO order. When a running request needs a block and none is left, the newest running request
is preempted by recompute: its blocks are freed, its computed count reset to zero, and it goes back to the
front of the queue. A step that preempted admits nobody.

A waiting request is admitted only when blocks for its whole known token list fit now (vLLM PR #21809), so
admission never forces a preemption by itself; a request that could never fit in the whole cache is
rejected when it is added, instead of preempting forever.

That is the "chunked" policy (the default). The "vllm-v0" policy (`EngineConfig.scheduler`) is vLLM's before
chunked prefill: a step is either whole prompts, admitted FIFO while the token budget, max_num_seqs and the
free blocks allow, or one decode token for every running request, never both, and prompts come first;
preemption is the same (newest first, by recompute).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from reference_engine.block_manager import BlockManager, cdiv
from reference_engine.config import EngineConfig
from reference_engine.executor.base import SeqChunk, StepBatch, StepResult
from reference_engine.sequence import FinishReason, SeqStatus, Sequence


class RequestRejected(ValueError):
    """The request can never run on this engine. Raised by `Scheduler.add` before any state changes."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class SeqOutput:
    """What one step did to one request: a new token (None while its prefill is still chunking)."""

    seq: Sequence
    token_id: int | None
    finish_reason: str | None


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        eos_token_id: int | None = None,
        block_manager: BlockManager | None = None,
    ) -> None:
        self.config = config
        self.eos_token_id = eos_token_id
        self.block_manager = block_manager or BlockManager(
            config.num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            hash_key=config.prefix_hash_key,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the newest is last
        self._by_id: dict[int, Sequence] = {}
        self.num_preemptions = 0

    # ---- requests in and out -----------------------------------------------------------------------
    def validate(self, num_prompt_tokens: int, max_tokens: int, min_tokens: int = 0) -> None:
        """Raise RequestRejected if such a request could never complete here. Touches no state."""
        cfg = self.config
        if num_prompt_tokens < 1:
            raise RequestRejected("the prompt is empty: at least one token is needed", "prompt")
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        if not 0 <= min_tokens <= max_tokens:
            raise RequestRejected(f"min_tokens must be in 0..max_tokens, got {min_tokens}", "min_tokens")
        if cfg.scheduler == "vllm-v0" and num_prompt_tokens > cfg.max_num_batched_tokens:
            raise RequestRejected(
                f"the prompt has {num_prompt_tokens} tokens, more than a step's budget of "
                f"{cfg.max_num_batched_tokens}: prompts are not cut into chunks here", "prompt")
        total = num_prompt_tokens + max_tokens
        if total > cfg.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{total} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the completion).",
                "max_tokens",
            )
        # The final sampled token never gets KV, hence the - 1.
        need = cdiv(total - 1, cfg.block_size)
        if need > cfg.num_blocks:
            raise RequestRejected(
                f"the request needs up to {need} KV blocks ({total - 1} tokens) but the whole cache has "
                f"{cfg.num_blocks} blocks of {cfg.block_size} tokens: it could never complete",
                "max_tokens",
            )

    def add(self, seq: Sequence) -> None:
        self.validate(seq.num_prompt_tokens, seq.max_tokens, seq.min_tokens)
        if seq.seq_id in self._by_id:
            raise ValueError(f"seq_id {seq.seq_id} is already scheduled")
        if seq.sampling.min_tokens != seq.min_tokens:
            # The request's min_tokens is the one that counts; the executor reads it from the sampling params.
            seq.sampling = replace(seq.sampling, min_tokens=seq.min_tokens)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)
        self._by_id[seq.seq_id] = seq

    def adopt_running(self, seq: Sequence) -> None:
        """`seq`, its blocks admitted and its computed count set, joins the running batch as it is (its KV was
        computed elsewhere: a disaggregated prefill); its full blocks become findable by their prefix."""
        if seq.seq_id in self._by_id:
            raise ValueError(f"seq_id {seq.seq_id} is already scheduled")
        self.block_manager.register_computed(seq)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        self._by_id[seq.seq_id] = seq

    def admit_head(self, seq: Sequence, hits: list[int]) -> None:
        """`seq`, the queue's head, joins the running batch with blocks for its known tokens reusing `hits`, as
        `schedule` admits it (for a caller that builds a step itself: a simulator's decode run)."""
        if not self.waiting or self.waiting[0] is not seq:
            raise ValueError(f"seq {seq.seq_id} is not the head of the queue")
        self.waiting.popleft()
        self.block_manager.admit(seq, hits)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Drop a request now and free its blocks. Returns it, or None if it was not here (already done)."""
        seq = self._by_id.pop(seq_id, None)
        if seq is None:
            return None
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq, finished=True)
        else:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = FinishReason.ABORT
        return seq

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- one step ----------------------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        if self.config.scheduler == "vllm-v0":
            return self._schedule_whole_prompts()
        bm = self.block_manager
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False

        bs = bm.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            need = max(-(-(seq.num_computed_tokens + n) // bs) - len(seq.block_table), 0)  # num_blocks_to_grow
            while need > bm.num_allocatable:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break  # it was the newest and preempted itself; everything after it is gone too
            if need:
                bm.append_blocks(seq, need)
            scheduled.append((seq, n))
            budget -= n
            i += 1

        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            seq = self.waiting[0]
            hits = bm.match_prefix(seq)
            if not bm.can_admit(seq.num_tokens, hits):
                break  # FIFO: the head waits for room rather than being overtaken
            self.waiting.popleft()
            bm.admit(seq, hits)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            scheduled.append((seq, n))
            budget -= n

        return StepBatch([self._chunk(seq, n) for seq, n in scheduled])

    def _schedule_whole_prompts(self) -> StepBatch:
        """vllm-v0: whole prompts if any can be admitted now, else a decode token for every running request."""
        bm = self.block_manager
        cfg = self.config
        chunks: list[SeqChunk] = []
        budget = cfg.max_num_batched_tokens
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            hits = bm.match_prefix(seq)
            if seq.num_tokens - len(hits) * bm.block_size > budget or not bm.can_admit(seq.num_tokens, hits):
                break  # FIFO: the head waits for budget or room rather than being overtaken
            self.waiting.popleft()
            bm.admit(seq, hits)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = seq.num_tokens - seq.num_computed_tokens
            chunks.append(self._chunk(seq, n))
            budget -= n
        if chunks:
            return StepBatch(chunks)
        bs = bm.block_size
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            need = max(-(-(seq.num_computed_tokens + 1) // bs) - len(seq.block_table), 0)
            while need > bm.num_allocatable:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            if need:
                bm.append_blocks(seq, need)
            chunks.append(self._chunk(seq, len(seq.token_ids) - seq.num_computed_tokens))
            i += 1
        return StepBatch(chunks)

    def _chunk(self, seq: Sequence, n: int) -> SeqChunk:
        start = seq.num_computed_tokens
        end = start + n  # attention covers 0..end-1 only: KV beyond is not written yet (NOTES bug 3)
        toks = seq.token_ids
        # positional, properties and cdiv inlined: one of these per running request per step
        return SeqChunk(seq.seq_id, toks[start:end], start, seq.block_table[: -(-end // self.config.block_size)],
                        end == len(toks), seq.sampling, len(toks) - seq.num_prompt_tokens)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def update(self, batch: StepBatch, result: StepResult) -> list[SeqOutput]:
        """Take a step's sampled tokens back: advance computed counts, append tokens, finish requests."""
        if len(result.tokens) != len(batch.chunks):
            raise ValueError(f"{len(result.tokens)} tokens for {len(batch.chunks)} chunks")
        bm = self.block_manager
        bs = bm.block_size
        outputs: list[SeqOutput] = []
        for chunk, token in zip(batch.chunks, result.tokens, strict=True):
            seq = self._by_id.get(chunk.seq_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue  # aborted between schedule and update
            seq.num_computed_tokens = computed = chunk.start_pos + len(chunk.token_ids)
            if computed // bs > seq.num_hashed_blocks:  # a block filled (most decode steps fill none)
                bm.register_computed(seq)
            if not chunk.sample:
                outputs.append(SeqOutput(seq, None, None))
                continue
            if token is None:
                raise ValueError(f"executor sampled no token for seq {seq.seq_id}")
            seq.token_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
            outputs.append(SeqOutput(seq, token, reason))
        return outputs

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        """A request ends on its first EOS unless ignore_eos: `min_tokens` is honoured by the executor, which
        masks EOS out of the logits until that many tokens are generated (as vLLM does), not by keeping an
        early EOS here."""
        if token == self.eos_token_id and not seq.ignore_eos:
            # Executors mask EOS until min_tokens (SamplingParams.min_tokens): one arriving earlier is an
            # executor bug, and ending the request here would silently break min_tokens.
            if seq.num_output_tokens <= seq.sampling.min_tokens:
                raise ValueError(
                    f"executor sampled EOS as token {seq.num_output_tokens} of seq {seq.seq_id}, "
                    f"before its min_tokens {seq.sampling.min_tokens}"
                )
            return FinishReason.STOP
        if seq.stop_check is not None and seq.stop_check(token):
            return FinishReason.STOP
        if seq.num_output_tokens >= seq.max_tokens:
            return FinishReason.LENGTH
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """`seq` is done: it leaves the batch and its blocks are freed (its last token already appended)."""
        self.running.remove(seq)
        del self._by_id[seq.seq_id]
        self.block_manager.free(seq, finished=True)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    # ---- invariants --------------------------------------------------------------------------------
    def check(self) -> None:
        """The block manager's invariants, plus: every reference is held by a running request, and no
        running request has more computed tokens than its blocks can hold."""
        bm = self.block_manager
        bm.check()
        for seq in self.running:
            if seq.num_computed_tokens > len(seq.block_table) * bm.block_size:
                raise AssertionError(f"seq {seq.seq_id} computed {seq.num_computed_tokens} past its blocks")
            # All known tokens have blocks, except a just-sampled one whose block comes with its next step.
            if len(seq.block_table) not in (cdiv(seq.num_tokens, bm.block_size), cdiv(seq.num_tokens - 1, bm.block_size)):
                raise AssertionError(f"seq {seq.seq_id}: {len(seq.block_table)} blocks for {seq.num_tokens} tokens")
        for seq in self.waiting:
            if seq.block_table:
                raise AssertionError(f"waiting seq {seq.seq_id} holds blocks {seq.block_table}")
        bm.check_holders(self.running)
