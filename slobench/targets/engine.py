"""The bundled reference engine as an in-process target: no HTTP, no SSE, the same RequestRecord.

Each RequestSpec becomes the body the OpenAI target would send, parsed by the engine server's own request
parser (validation and rejections match the HTTP path), and goes to an `LLMEngine` stepping in its thread.
Every token is stamped on the run's clock on the engine's thread, so the engine alone is measured: the
event loop's wake-up lag is part of what the HTTP/SSE path adds. One chunk per token; a request the engine
refuses is a failed record whose error starts with "too long:" when it is longer than the model's context
(as the HTTP path names it), else "rejected:". Cancelling `send` aborts the request in
the engine; `close()` aborts what is in flight and waits until the engine has freed those blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import slobench.profiles  # noqa: F401  (registers `--profile roofline:GPU/MODEL` with the engine)
from reference_engine.builder import build_engine
from reference_engine.config import EngineSpec
from reference_engine.engine import ERROR_FINISH_REASON, LLMEngine, NullObserver, TokenEvent
from reference_engine.metrics import EngineMetrics
from reference_engine.protocol import (
    BadRequest,
    GenerationRequest,
    TextTokenizer,
    parse_chat,
    parse_completion,
)
from reference_engine.scheduler import RequestRejected
from reference_engine.sequence import FinishReason
from reference_engine.tokenizer import ByteTokenizer
from slobench.errors import SpecError, TargetUnreachable, UsageError
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.base import TargetBase
from slobench.targets.capabilities import name_too_long
from slobench.targets.options import Api

CLOSE_TIMEOUT_S = 10.0  # how long close() waits for aborted requests to give their blocks back


def to_engine_request(
    spec: RequestSpec, *, model_name: str, tokenizer: TextTokenizer, max_model_len: int, api: Api = "completions"
) -> GenerationRequest:
    """The request the HTTP server would build from the OpenAI target's body for `spec`.

    Raises `reference_engine.protocol.BadRequest` where the server would answer 400.
    """
    body: dict[str, Any] = {"model": model_name, "temperature": 0, "max_tokens": spec.max_tokens}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = list(spec.prompt) if isinstance(spec.prompt, tuple) else spec.prompt
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.min_tokens is not None:
        body["min_tokens"] = spec.min_tokens
    body.update(spec.extra_body)
    parse = parse_chat if api == "chat" else parse_completion
    return parse(body, model_name, tokenizer, max_model_len)


def refusal_error(message: str) -> str:
    """A record's error for a request the bundled engine refuses without HTTP (this target, the simulator):
    "too long: " when its message says the request exceeds the context, by the rule that names the HTTP
    path's refusals (`name_too_long`), so length refusals are one error kind on every path; else "rejected: "."""
    named = name_too_long(400, message)
    return named if named != message else f"rejected: {message}"


def _engine_metrics(engine: LLMEngine, model_name: str) -> EngineMetrics:
    """The engine's metrics, made its observer so the latency histograms fill as it runs.

    An engine already observed by an EngineMetrics (shared with an HTTP server) keeps it, so both expose the
    same numbers; one with some other observer keeps that one, and these metrics still read its stats, with
    empty latency histograms.
    """
    if isinstance(engine.observer, EngineMetrics):
        return engine.observer
    metrics = EngineMetrics(model_name, engine.stats)
    if isinstance(engine.observer, NullObserver):
        engine.observer = metrics
    return metrics


@dataclass(slots=True)
class _Live:
    """One request in flight: its events as (run-clock time, event), and a future set when it ends."""

    queue: asyncio.Queue[tuple[float, TokenEvent]]
    ended: asyncio.Future[None]

    def deliver(self, item: tuple[float, TokenEvent]) -> None:  # on the event loop
        self.queue.put_nowait(item)
        if item[1].finish_reason is not None and not self.ended.done():
            self.ended.set_result(None)


class EngineTarget(TargetBase):
    """The reference engine in this process. `engine` is an `LLMEngine` or knobs.

    Knobs are `reference_engine.config.EngineSpec`'s fields (`executor`, `profile`, `kv_blocks`,
    `max_num_seqs`, ...): `EngineTarget({"executor": "modeled", "profile": "cpu-tiny"})`. The target starts
    the engine's thread in `start()` and stops it in `close()` unless `keep_running` is set (an engine
    shared with something else).
    """

    def __init__(
        self,
        engine: LLMEngine | Mapping[str, Any],
        clock: Clock | None = None,
        *,
        model_name: str | None = None,
        api: Api = "completions",
        tokenizer: TextTokenizer | None = None,
        keep_running: bool = False,
    ) -> None:
        if api not in ("completions", "chat"):
            raise SpecError("api", api, "must be 'completions' or 'chat'")
        self.knobs: dict[str, Any] | None = None
        if isinstance(engine, Mapping):
            self.knobs = dict(engine)
            engine, built_tokenizer = build_engine(EngineSpec.from_knobs(self.knobs))
            tokenizer = tokenizer or built_tokenizer
            model_name = model_name or str(self.knobs.get("model", "tiny"))
        if tokenizer is None:
            tokenizer = getattr(engine.executor, "tokenizer", None) or ByteTokenizer(engine.executor.vocab_size)
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = model_name or "tiny"
        self._metrics = _engine_metrics(engine, self.model)
        self.api: Api = api
        self.clock = clock if clock is not None else Clock()
        self.keep_running = keep_running
        self._started = False
        self._in_flight: dict[int, asyncio.Future[None]] = {}  # engine request id -> set when it ends

    def __repr__(self) -> str:
        return f"EngineTarget(model={self.model!r}, executor={type(self.engine.executor).__name__}, api={self.api!r})"

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this target."""
        cfg = asdict(self.engine.config)
        cfg.pop("prefix_hash_key", None)  # a secret key, not a setting
        out: dict[str, Any] = {
            "kind": "engine", "model": self.model, "api": self.api,
            "executor": type(self.engine.executor).__name__, "config": cfg,
        }
        profile = getattr(self.engine.executor, "profile", None)
        if profile is not None:
            out["profile"] = asdict(profile)
        if self.knobs is not None:
            out["knobs"] = self.knobs
        return out

    def metrics_text(self) -> str:
        """The engine's Prometheus exposition, vLLM's names, as its HTTP server's `/metrics` serves it.

        Safe from any thread (the scraper calls it from a worker): gauges and counts are read from
        `engine.stats()`, whose fields are single reads the engine thread may move between but never tears,
        and prometheus_client's histograms take their own locks.
        """
        return self._metrics.render().decode()

    def check_compatible(self, spec: RequestSpec) -> None:
        if self.api == "chat" and isinstance(spec.prompt, tuple):
            raise UsageError(
                f"request {spec.request_id}: api='chat' sends text messages, but this prompt is token ids; "
                "use api='completions' or a text-prompt workload"
            )

    # ---- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.engine.start()
        self._started = True

    async def preflight(self) -> str:
        if not self._started:
            raise TargetUnreachable("in-process engine: preflight() before start()")
        if not self.engine.is_healthy():
            raise TargetUnreachable(f"in-process engine: the engine loop has stopped ({self.engine.error!r})")
        cfg = self.engine.config
        return (f"{self.model} in process ({type(self.engine.executor).__name__}, "
                f"{cfg.num_blocks} KV blocks of {cfg.block_size})")

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Abort what is still in flight, wait (bounded) until the engine has freed those requests' blocks,
        then stop the engine's thread."""
        pending = [(rid, f) for rid, f in self._in_flight.items() if not f.done()]
        for rid, _ in pending:
            self.engine.abort(rid)  # a second abort of a cancelled request is a no-op in the engine
        if pending and self.engine.is_healthy():
            await asyncio.wait([f for _, f in pending], timeout=timeout_s)
        if self._started and not self.keep_running:
            await asyncio.to_thread(self.engine.stop)
        self._started = False

    # ---- the hot path ----------------------------------------------------------------------------------

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        if not self._started:
            raise RuntimeError("EngineTarget.send() called before start()")
        engine = self.engine
        now = self.clock.now_s
        try:
            req = to_engine_request(spec, model_name=self.model, tokenizer=self.tokenizer,
                                    max_model_len=engine.config.max_model_len, api=self.api)
        except BadRequest as e:
            record.sent_s = now()
            record.fail("error", refusal_error(e.message), now())
            return
        loop = asyncio.get_running_loop()
        live = _Live(asyncio.Queue(), loop.create_future())
        deliver = live.deliver

        def on_token(ev: TokenEvent) -> None:  # the engine's thread
            try:
                loop.call_soon_threadsafe(deliver, (now(), ev))
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        record.sent_s = now()
        try:
            rid = engine.add_request(req.prompt_token_ids, req.max_tokens, min_tokens=req.min_tokens,
                                     ignore_eos=req.ignore_eos, sampling=req.sampling, on_token=on_token,
                                     stop_check=req.stop_check())
        except RequestRejected as e:
            record.fail("error", refusal_error(str(e)), now())
            return
        except RuntimeError as e:  # the engine loop has died
            record.fail("error", f"engine: {e}", now())
            return
        record.prompt_tokens = len(req.prompt_token_ids)
        self._in_flight[rid] = live.ended
        live.ended.add_done_callback(lambda _: self._in_flight.pop(rid, None))
        ended = False
        try:
            while not ended:
                t, ev = await live.queue.get()
                if ev.num_cached_tokens is not None:
                    record.cached_tokens = ev.num_cached_tokens
                if ev.token_id is not None:
                    if record.first_token_s is None:
                        record.first_token_s = t
                    record.chunk_times_s.append(t)
                    record.chunk_tokens.append(1)
                    record.output_tokens += 1
                reason = ev.finish_reason
                if reason is None:
                    continue
                ended = True
                if reason in (FinishReason.LENGTH, FinishReason.STOP):
                    record.done_s = t
                elif reason == ERROR_FINISH_REASON:
                    record.fail("error", "engine: the engine failed while generating", t)
                else:
                    record.fail("error", f"engine: the request ended with finish_reason {reason!r}", t)
        finally:
            if not ended:  # cancelled (or failed) while in flight: give its KV blocks back
                engine.abort(rid)
