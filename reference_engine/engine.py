"""The step loop: schedule -> execute -> update -> emit, on a clock it is handed.

Two ways to drive it:
- `generate(prompts)`: synchronous, no thread; steps until every request is done (tests, offline runs).
- `start()` / `stop()`: a background thread for the HTTP server. It sleeps on a threading.Event while idle
  (no polling), and applies requests added and aborted from other threads at step boundaries only, so the
  scheduler is only ever touched by one thread.

With a modeled executor the loop waits until step start + modeled step time on its clock, so the real
scheduler runs at GPU-like speed; on a `VirtualClock` that wait is an instant jump of the clock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from reference_engine.block_manager import BlockAccountingError, BlockManager
from reference_engine.config import EngineConfig
from reference_engine.errors import ConfigError
from reference_engine.executor.base import Executor, SamplingParams
from reference_engine.scheduler import RequestRejected, Scheduler
from reference_engine.sequence import FinishReason, Sequence

if TYPE_CHECKING:
    from reference_engine.step_log import StepLog

log = logging.getLogger(__name__)

ERROR_FINISH_REASON = "error"  # the engine loop died; every open request ends with this


class EngineClock(Protocol):
    def now_s(self) -> float: ...


class VirtualClock:
    """A clock that only moves when told: modeled step times pass instantly."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance_to(self, t_s: float) -> None:
        self._now_s = max(self._now_s, t_s)


class _MonotonicClock:
    def __init__(self) -> None:
        self._origin_ns = time.perf_counter_ns()

    def now_s(self) -> float:
        return (time.perf_counter_ns() - self._origin_ns) * 1e-9


class StatsObserver(Protocol):
    """Where the engine reports per-request and per-step observations (metrics.EngineMetrics)."""

    def observe_iteration_tokens(self, num_tokens: int) -> None: ...
    def observe_ttft(self, seconds: float) -> None: ...
    def observe_itl(self, seconds: float) -> None: ...
    def observe_finished(self, finish_reason: str, e2e_s: float, queue_s: float | None) -> None: ...


class NullObserver:
    """Observes nothing: the engine's default, and what a caller that replays steps itself checks for."""

    def observe_iteration_tokens(self, num_tokens: int) -> None: ...
    def observe_ttft(self, seconds: float) -> None: ...
    def observe_itl(self, seconds: float) -> None: ...
    def observe_finished(self, finish_reason: str, e2e_s: float, queue_s: float | None) -> None: ...


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One token for one request (token_id None when it ends without one: abort, error)."""

    request_id: int
    token_id: int | None
    finish_reason: str | None
    time_s: float
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache at first admission


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_blocks: int
    num_blocks_in_use: int
    num_blocks_free: int
    num_blocks_cached: int
    kv_cache_usage: float
    num_preemptions: int
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    num_prompt_tokens: int
    num_generation_tokens: int
    num_steps: int
    last_step_num_tokens: int
    num_idle_check_failures: int


@dataclass(slots=True)
class GenerateOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    ttft_s: float | None
    e2e_s: float | None
    num_preemptions: int


@dataclass(slots=True)
class RequestState:
    """The engine's record of one request: its sequence, where its tokens go, and its times."""

    seq: Sequence
    on_token: Callable[[TokenEvent], None] | None
    arrival_s: float
    first_scheduled_s: float | None = None
    cached_tokens: int | None = None  # prefix-cache hit at first admission (vLLM reports the same)
    first_token_s: float | None = None
    last_token_s: float | None = None


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        clock: EngineClock | None = None,
        *,
        wait_until: Callable[[float], None] | None = None,
        observer: StatsObserver | None = None,
        block_manager: BlockManager | None = None,
    ) -> None:
        """`wait_until(t_s)` waits on `clock` until `t_s` (a modeled step's end); `block_manager` replaces the
        one the scheduler would build from `config` (a simulator's, say)."""
        if executor.block_size != config.block_size:
            raise ConfigError("block_size", executor.block_size, f"executor's differs from config's {config.block_size}")
        if executor.num_blocks != config.num_blocks:
            raise ConfigError("num_blocks", executor.num_blocks, f"executor's differs from config's {config.num_blocks}")
        self.config = config
        self.executor = executor
        self.clock: EngineClock = clock if clock is not None else _MonotonicClock()
        if wait_until is None:
            wait_until = self.clock.advance_to if isinstance(self.clock, VirtualClock) else self._sleep_until
        self.wait_until = wait_until
        self.observer: StatsObserver = observer if observer is not None else NullObserver()
        self.scheduler = Scheduler(config, eos_token_id=executor.eos_token_id, block_manager=block_manager)
        self._requests: dict[int, RequestState] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending_adds: list[RequestState] = []
        self._pending_aborts: list[int] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None
        self.step_log: StepLog | None = None  # one line per step when set (reference_engine.step_log)
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_steps = 0
        self.last_step_num_tokens = 0
        self.num_idle_check_failures = 0

    # ---- requests (any thread) ---------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: SequenceABC[int],
        max_tokens: int = 16,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        sampling: SamplingParams | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
        stop_check: Callable[[int], bool] | None = None,
        ids_checked: bool = False,
        unshared_from: int | None = None,
        draw_tokens: Callable[[Sequence], None] | None = None,
    ) -> int:
        """Queue a request; returns its id. Raises RequestRejected (and changes nothing) if it can never run.

        `stop_check` is fed each output token on the engine's thread; True ends the request with "stop" in
        that step (stop strings: `GenerationRequest.stop_check()`). `ids_checked`: the caller has already
        checked that every prompt id is an int in the vocabulary (the simulator, which parses the request as
        the server does); the check costs ~0.1 ms for a 1k-token prompt. `unshared_from`: the first block of
        the prompt that no other request's prompt shares, when the caller knows every prompt (a simulator;
        `Sequence.unshared_from`). `draw_tokens`: the prompt's ids are a simulator's stand-ins, which this
        writes over with the real ones before anything reads them (`Sequence.draw_tokens`)."""
        if self.error is not None:
            raise RuntimeError("the engine loop has died") from self.error
        prompt = list(prompt_token_ids)
        vocab = self.executor.vocab_size if not ids_checked else None
        # type() is int excludes bools; the set of types, min and max run at C speed (a per-token generator
        # here was a fifth of a simulated run)
        if vocab is not None and (
            not set(map(type, prompt)) <= {int} or (prompt and (min(prompt) < 0 or max(prompt) >= vocab))
        ):
            for t in prompt:
                if type(t) is not int or not 0 <= t < vocab:
                    raise RequestRejected(f"prompt token id {t!r} is outside the vocabulary 0..{vocab - 1}",
                                          "prompt")
        self.scheduler.validate(len(prompt), max_tokens, min_tokens)
        with self._lock:
            rid = next(self._ids)
            seq = Sequence(
                rid, prompt, max_tokens, min_tokens, ignore_eos, sampling if sampling is not None else SamplingParams(),
                stop_check,
            )
            if unshared_from is not None:
                seq.unshared_from = unshared_from
            seq.draw_tokens = draw_tokens
            self._pending_adds.append(RequestState(seq, on_token, self.clock.now_s()))
        self._wake.set()
        return rid

    def abort(self, request_id: int) -> None:
        """Ask for a request to be dropped; its blocks are freed at the next step boundary."""
        with self._lock:
            self._pending_aborts.append(request_id)
        self._wake.set()

    # ---- the loop (one thread) ---------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending_adds)

    def step(self) -> list[TokenEvent]:
        """One iteration. Returns the token events it emitted (also sent to each request's callback)."""
        events = self.apply_pending()
        sched = self.scheduler
        if not sched.has_work():
            return events
        batch = sched.schedule()
        t0 = self.clock.now_s()
        if not batch.chunks:
            return events
        for chunk in batch.chunks:
            req = self._requests[chunk.seq_id]
            if req.first_scheduled_s is None:
                req.first_scheduled_s = t0
                req.cached_tokens = req.seq.num_cached_tokens
        result = self.executor.execute(batch)
        if result.modeled_s is not None:
            self.wait_until(t0 + result.modeled_s)
        t1 = self.clock.now_s()
        if self.step_log is not None:
            self.step_log.record(t0, t1, batch)
        outputs = sched.update(batch, result)
        self.num_steps += 1
        self.last_step_num_tokens = sum(len(c.token_ids) for c in batch.chunks)
        self.observer.observe_iteration_tokens(self.last_step_num_tokens)
        for out in outputs:
            if out.token_id is None:
                continue
            req = self._requests[out.seq.seq_id]
            self.num_generation_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = t1
                self.num_prompt_tokens += out.seq.num_prompt_tokens
                self.observer.observe_ttft(t1 - req.arrival_s)
            else:
                self.observer.observe_itl(t1 - (req.last_token_s or t1))
            req.last_token_s = t1
            if out.finish_reason is not None:
                self._finished(req, out.finish_reason, t1)
            events.append(self._emit(req, out.token_id, out.finish_reason, t1))
        return events

    def generate(
        self,
        prompts: SequenceABC[SequenceABC[int]],
        max_tokens: int = 16,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        sampling: SamplingParams | None = None,
    ) -> list[GenerateOutput]:
        """Run `prompts` to completion on the calling thread (not while `start()`ed)."""
        if self._thread is not None:
            raise RuntimeError("generate() cannot run while the background loop is started")
        outputs: dict[int, GenerateOutput] = {}
        for p in prompts:
            rid = self.add_request(p, max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, sampling=sampling)
            outputs[rid] = GenerateOutput(rid, list(p), [], None, None, None, 0)
        arrival = self.clock.now_s()
        while self.has_work():
            for ev in self.step():
                out = outputs.get(ev.request_id)
                if out is None:
                    continue
                if ev.token_id is not None:
                    if not out.token_ids:
                        out.ttft_s = ev.time_s - arrival
                    out.token_ids.append(ev.token_id)
                if ev.finish_reason is not None:
                    out.finish_reason = ev.finish_reason
                    out.e2e_s = ev.time_s - arrival
        self.idle_check()
        return list(outputs.values())

    # ---- background thread -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake.set()
        thread.join(timeout_s)
        self._thread = None

    def is_healthy(self) -> bool:
        return self.error is None and (self._thread is None or self._thread.is_alive())

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()  # before looking for work, so a set() after this is never lost
                if not self.has_work() and not self._pending_aborts:
                    self.idle_check()
                    self._wake.wait()
                    continue
                self.step()
        except BaseException as e:  # the loop must not die silently: fail every open request
            self.error = e
            log.exception("engine loop died")
            self._fail_all()

    # ---- stats and checks --------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.scheduler.block_manager
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting + len(self._pending_adds),
            num_blocks=bm.num_blocks,
            num_blocks_in_use=bm.num_in_use,
            num_blocks_free=bm.num_free,
            num_blocks_cached=bm.num_cached,
            kv_cache_usage=bm.usage,
            num_preemptions=self.scheduler.num_preemptions,
            num_prefix_query_tokens=bm.num_prefix_query_tokens,
            num_prefix_hit_tokens=bm.num_prefix_hit_tokens,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            num_steps=self.num_steps,
            last_step_num_tokens=self.last_step_num_tokens,
            num_idle_check_failures=self.num_idle_check_failures,
        )

    def idle_check(self) -> bool:
        """mini-sglang's check: with nothing running, every block must be free or cached. Logs loudly."""
        if self.scheduler.has_work():
            return True
        bm = self.scheduler.block_manager
        try:
            bm.check()
            if bm.num_free + bm.num_cached != bm.num_blocks:
                raise BlockAccountingError(f"idle with {bm.num_in_use} blocks still in use")
        except BlockAccountingError as e:
            self.num_idle_check_failures += 1
            log.error("KV CACHE ACCOUNTING BROKEN WHILE IDLE: %s", e)
            return False
        return True

    # ---- for a caller that takes steps itself (a simulator's fast path) -----------------------------
    def has_pending_aborts(self) -> bool:
        return bool(self._pending_aborts)

    @property
    def requests(self) -> Mapping[int, RequestState]:
        """The open requests' states by id (a finished one is gone), read-only."""
        return self._requests

    def finish_by_length(self, seq: Sequence, now_s: float) -> None:
        """`seq` sampled its last allowed token in a step taken outside `step()`: the scheduler frees it and
        the request closes, as `step()` would have done."""
        self.scheduler.finish(seq, FinishReason.LENGTH)
        self._finished(self._requests[seq.seq_id], FinishReason.LENGTH, now_s)

    def admit_head(self, seq: Sequence, hits: list[int], now_s: float) -> None:
        """The queue's head `seq` admitted in a step taken outside `step()` that starts at `now_s`
        (`Scheduler.admit_head`), its first scheduling recorded as `step()` records it."""
        self.scheduler.admit_head(seq, hits)
        req = self._requests[seq.seq_id]
        if req.first_scheduled_s is None:
            req.first_scheduled_s = now_s
            req.cached_tokens = seq.num_cached_tokens

    def tokens_sampled(self, seqs: SequenceABC[Sequence], first_s: float, last_s: float) -> dict[int, int | None]:
        """Steps taken outside `step()` from `first_s` to `last_s` sampled a token for each of `seqs` at every
        step: each request's first token (where it had none) at `first_s`, its last at `last_s`, as `step()`
        records them, observers left out (such steps are taken only with the NullObserver). Returns seq id ->
        prefix-cache hit, for the requests whose first token came here."""
        first: dict[int, int | None] = {}
        requests = self._requests
        for seq in seqs:
            req = requests[seq.seq_id]
            if req.first_token_s is None:
                req.first_token_s = first_s
                self.num_prompt_tokens += seq.num_prompt_tokens
                first[seq.seq_id] = req.cached_tokens
            req.last_token_s = last_s
        return first

    def steps_taken(self, num_steps: int, last_step_num_tokens: int, num_generation_tokens: int) -> None:
        """`num_steps` steps were taken outside `step()`, emitting `num_generation_tokens` tokens in all, the last
        of them scheduling `last_step_num_tokens`: the engine's counters as `step()` would leave them."""
        self.num_steps += num_steps
        self.last_step_num_tokens = last_step_num_tokens
        self.num_generation_tokens += num_generation_tokens

    def prefilled_sequence(self, prompt: SequenceABC[int], first_token: int, max_tokens: int, *, min_tokens: int = 0,
                           ignore_eos: bool = False, sampling: SamplingParams | None = None,
                           stop_check: Callable[[int], bool] | None = None) -> Sequence:
        """A new request whose prompt was computed elsewhere (a prefill instance) and whose first token was
        sampled there, with this engine's next id: the caller finds it blocks (its block manager's
        `match_prefix`, `admit`), then hands it over with `adopt_prefilled` once its KV is here."""
        sampling = sampling if sampling is not None else SamplingParams()
        if sampling.min_tokens != min_tokens:
            sampling = replace(sampling, min_tokens=min_tokens)
        with self._lock:
            rid = next(self._ids)
        return Sequence(rid, [*prompt, first_token], max_tokens, min_tokens, ignore_eos, sampling, stop_check,
                        num_prompt_tokens=len(prompt))

    def adopt_prefilled(self, seq: Sequence, now_s: float, cached_tokens: int | None) -> None:
        """`seq` (from `prefilled_sequence`, its blocks admitted) joins the running batch: its prompt's KV is
        written, its first token is the last sampled one, first scheduled and first token both now."""
        seq.num_computed_tokens = seq.num_prompt_tokens
        self.scheduler.adopt_running(seq)
        self._requests[seq.seq_id] = RequestState(seq, None, now_s, first_scheduled_s=now_s,
                                                  cached_tokens=cached_tokens, first_token_s=now_s,
                                                  last_token_s=now_s)

    def apply_pending(self) -> list[TokenEvent]:
        """Requests added and aborted since the last step take effect (what each step does first)."""
        if not (self._pending_adds or self._pending_aborts):
            return []
        with self._lock:
            adds, self._pending_adds = self._pending_adds, []
            aborts, self._pending_aborts = self._pending_aborts, []
        for req in adds:
            self.scheduler.add(req.seq)  # validated in add_request: cannot raise here
            self._requests[req.seq.seq_id] = req
        events = []
        now = self.clock.now_s()
        for rid in aborts:
            if self.scheduler.abort(rid) is None:
                continue  # finished already
            req = self._requests[rid]
            self._finished(req, FinishReason.ABORT, now)
            events.append(self._emit(req, None, FinishReason.ABORT, now))
        return events

    # ---- internals ---------------------------------------------------------------------------------
    def _finished(self, req: RequestState, reason: str, now_s: float) -> None:
        del self._requests[req.seq.seq_id]
        queue_s = None if req.first_scheduled_s is None else req.first_scheduled_s - req.arrival_s
        self.observer.observe_finished(reason, now_s - req.arrival_s, queue_s)

    def _emit(self, req: RequestState, token_id: int | None, reason: str | None, now_s: float) -> TokenEvent:
        ev = TokenEvent(req.seq.seq_id, token_id, reason, now_s, req.cached_tokens)
        if req.on_token is not None:
            try:
                req.on_token(ev)
            except Exception:  # one broken consumer must not stop every other request
                log.exception("on_token callback of request %d failed; aborting it", req.seq.seq_id)
                if reason is None:
                    self.abort(req.seq.seq_id)
        return ev

    def _fail_all(self) -> None:
        with self._lock:
            pending, self._pending_adds = self._pending_adds, []
        now = self.clock.now_s()
        for req in [*self._requests.values(), *pending]:
            if req.on_token is not None:
                try:
                    req.on_token(TokenEvent(req.seq.seq_id, None, ERROR_FINISH_REASON, now))
                except Exception:
                    log.exception("on_token callback failed while failing request %d", req.seq.seq_id)

    def _sleep_until(self, t_s: float) -> None:
        delay = t_s - self.clock.now_s()
        if delay > 0:
            time.sleep(delay)
