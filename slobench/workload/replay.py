"""Trace replay: a `Trace` becomes the requests of one run, scaled in time, windowed and given prompts
(`replay` says how); `TraceReplay` is a loaded trace as a `Workload`."""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_engine.splitmix import GAMMA, mix64_array
from slobench.errors import SpecError, UsageError
from slobench.run.records import RequestSpec, with_drawn_ids
from slobench.workload.base import AS_IT_IS, RunShape, refuse_fixed_lengths
from slobench.workload.prompts import DEFAULT_TOKEN_ID_RANGE, WORDS, text_prompts, token_prompts
from slobench.workload.sessions import ids_to_prompt
from slobench.workload.trace_sessions import check_session_mode, session_turns
from slobench.workload.traces import SHAREGPT_THINK_S, Trace, TraceColumns, TraceEntry, load_trace

__all__ = ["ReplaySpecs", "TraceReplay", "block_token_ids", "replay", "replay_scale"]

_GOLDEN = np.uint64(GAMMA)
MAX_CACHED_BLOCKS = 8192  # 32 MiB of 512-token blocks
MAX_SESSIONS = 16384


def block_token_ids(
    key: int, hash_id: int, num_tokens: int, id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
) -> np.ndarray:
    """The token ids of one prompt block: a pure function of (key, hash_id), so equal ids give equal
    tokens in every request and every process; the first m ids of a block do not depend on its length."""
    return blocks_token_ids(key, [hash_id], num_tokens, id_range)[0]


def blocks_token_ids(key: int, hash_ids: list[int], num_tokens: int, id_range: tuple[int, int]) -> np.ndarray:
    """block_token_ids for several ids at once, one row each (one numpy pass: a prompt's missing blocks)."""
    lo, hi = id_range
    mask = 0xFFFFFFFFFFFFFFFF
    with np.errstate(over="ignore"):
        base = mix64_array(np.uint64(key & mask) ^ mix64_array(np.array([h & mask for h in hash_ids], np.uint64) + _GOLDEN))
        pos = np.arange(1, num_tokens + 1, dtype=np.uint64)
        vals = mix64_array(base[:, None] + pos[None, :] * _GOLDEN)
    return (vals % np.uint64(hi - lo)).astype(np.int64) + lo


def replay_scale(trace: Trace, *, start_s: float = 0.0, time_scale: float | None = None,
                 rate_rps: float | None = None, duration_s: float | None = None,
                 num_requests: int | None = None) -> float:
    """The factor k that multiplies trace time (see `replay`); `rate_rps` wins over `time_scale`.

    With `rate_rps`, k makes the window actually replayed offer that rate: the first `num_requests` from
    `start_s` span (N − 1) / rate seconds; else the first round(rate × duration_s) fill `duration_s`
    (the next one lands exactly at its end, outside); else the whole rest of the trace is rescaled."""
    if rate_rps is None:
        return time_scale_factor(time_scale)
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise SpecError("rate_rps", rate_rps, "must be a finite number > 0")
    t = trace.arrival_s
    return rate_scale(t[t >= start_s], trace.path, start_s=start_s, rate_rps=rate_rps, duration_s=duration_s,
                      num_requests=num_requests)


def time_scale_factor(time_scale: float | None) -> float:
    k = 1.0 if time_scale is None else time_scale
    if isinstance(k, bool) or not (isinstance(k, int | float) and math.isfinite(k) and k > 0):
        raise SpecError("time_scale", time_scale, "must be a finite number > 0 (0.5 = twice as fast)")
    return float(k)


def rate_scale(t: np.ndarray, path: str, *, start_s: float, rate_rps: float, duration_s: float | None,
               num_requests: int | None) -> float:
    """replay_scale's arithmetic on the arrival times from `start_s` on (at least the window's, and with
    `duration_s` one more)."""
    if num_requests is not None:
        t = t[: max(num_requests, 2)]
    elif duration_s is not None and math.isfinite(duration_s) and duration_s > 0:
        n = max(2, round(rate_rps * duration_s))
        if n < len(t) and t[n] > start_s:  # t[n] is the first request left out: it lands at duration_s
            return duration_s / float(t[n] - start_s)
    if len(t) < 2 or t[-1] <= t[0]:
        raise UsageError(f"{path}: cannot rescale to a rate: fewer than two distinct arrival times "
                         f"after --start {start_s:g}")
    native_rps = (len(t) - 1) / float(t[-1] - t[0])
    return native_rps / rate_rps


def check_replay_fields(start_s: float, api: str, min_tokens: str) -> None:
    """The fields a replay shares, whole or streamed: a SpecError naming the first that is wrong."""
    if not (math.isfinite(start_s) and start_s >= 0):
        raise SpecError("start", start_s, "must be a finite number >= 0 (trace seconds)")
    if api not in ("completions", "chat"):
        raise SpecError("api", api, "must be 'completions' or 'chat'")
    if min_tokens not in ("max", "none"):
        raise SpecError("min_tokens", min_tokens, "must be 'max' or 'none'")


def prompt_salt(name: str, scale: float, seed: int) -> int:
    """The key of a replay's prompt ids: the trace's name, its time scale and the seed."""
    bits = int(np.float64(scale).view(np.uint64))
    return (seed << 40) ^ (zlib.crc32(name.encode()) << 8) ^ bits


def _window(trace: Trace, start_s: float, scale: float, duration_s: float | None,
            num_requests: int | None) -> tuple[list[TraceEntry], list[float]]:
    if not (math.isfinite(start_s) and start_s >= 0):
        raise SpecError("start_s", start_s, "must be a finite number >= 0")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError("duration_s", duration_s, "must be a finite number > 0")
    if num_requests is not None and num_requests < 1:
        raise SpecError("num_requests", num_requests, "must be >= 1")
    if isinstance(trace.entries, TraceColumns):
        kept, times = _window_of_columns(trace.entries, start_s, scale, duration_s, num_requests)
    else:
        kept, times = _window_of_entries(trace.entries, start_s, scale, duration_s, num_requests)
    if not kept:
        raise UsageError(
            f"{trace.path}: the window (--start {start_s:g} s, --duration {duration_s} s at scale {scale:g}) "
            "holds no request"
        )
    return kept, times


def _window_of_columns(cols: TraceColumns, start_s: float, scale: float, duration_s: float | None,
                       num_requests: int | None) -> tuple[list[TraceEntry], list[float]]:
    """`_window_of_entries` on a loaded trace's columns (sorted by arrival): entries built for the window only."""
    first = int(np.searchsorted(cols.arrival_s, start_s, side="left"))
    end = len(cols) if num_requests is None else min(len(cols), first + num_requests)
    t = (cols.arrival_s[first:end] - start_s) * scale
    if duration_s is not None:
        end = first + int(np.argmax(t >= duration_s)) if (t >= duration_s).any() else end
    return [cols.entry(i) for i in range(first, end)], t[: end - first].tolist()


def _window_of_entries(entries: Sequence[TraceEntry], start_s: float, scale: float, duration_s: float | None,
                       num_requests: int | None) -> tuple[list[TraceEntry], list[float]]:
    kept: list[TraceEntry] = []
    times: list[float] = []
    for e in entries:
        if e.arrival_s < start_s:
            continue
        t = (e.arrival_s - start_s) * scale
        if duration_s is not None and t >= duration_s:
            break
        kept.append(e)
        times.append(t)
        if num_requests is not None and len(kept) >= num_requests:
            break
    return kept, times


class PromptBuilder:
    """Builds each request's prompt as an id array (token ids, or word indices for text).

    Hash blocks are cached, least recently used first out past MAX_CACHED_BLOCKS (they are a pure function
    of the key and the id, so a block built again is the same); sessions keep their latest prompt, the
    least recently active dropped past MAX_SESSIONS (a later turn of a dropped session starts afresh)."""

    def __init__(self, block_tokens: int, key: int, is_text: bool, id_range: tuple[int, int]) -> None:
        self.block_tokens = block_tokens
        self.key = key
        self.is_text = is_text
        self.id_range = (0, len(WORDS)) if is_text else id_range
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.by_session: OrderedDict[int, np.ndarray] = OrderedDict()  # a session's latest prompt ids
        self.rng = np.random.default_rng(np.random.SeedSequence(key & ((1 << 63) - 1), spawn_key=(0x70,)))

    def fresh(self, n: int) -> np.ndarray:
        lo, hi = self.id_range
        return self.rng.integers(lo, hi, size=n, dtype=np.int64)

    def from_blocks(self, hash_ids: tuple[int, ...], n: int) -> np.ndarray:
        size = self.block_tokens
        used = hash_ids[: -(-n // size)]
        blocks = self.blocks
        missing = list(dict.fromkeys(h for h in used if h not in blocks))
        if missing:
            for h, row in zip(missing, blocks_token_ids(self.key, missing, size, self.id_range), strict=True):
                blocks[h] = row
        parts: list[np.ndarray] = []
        have = 0
        for h in used:
            blocks.move_to_end(h)
            take = min(size, n - have)
            parts.append(blocks[h][:take])
            have += take
        while len(blocks) > MAX_CACHED_BLOCKS:
            blocks.popitem(last=False)
        if have < n:  # more tokens than blocks: the rest is this request's own
            parts.append(self.fresh(n - have))
        return np.concatenate(parts)

    def finish(self, ids: np.ndarray) -> str | tuple[int, ...]:
        return ids_to_prompt(ids, self.is_text, self.id_range)

    def one(self, e: TraceEntry) -> str | tuple[int, ...] | None:
        """The prompt of `e` when it has its own, hash blocks or a session; None for a plain row."""
        own = e.prompt
        if own is not None and isinstance(own, str) == self.is_text:
            return own
        if e.hash_ids:
            return self.finish(self.from_blocks(e.hash_ids, e.input_tokens))
        if e.session_id is None:
            return None
        prev = self.by_session.get(e.session_id)
        grow = e.input_tokens - (0 if prev is None else len(prev))
        ids = self.fresh(e.input_tokens) if prev is None or grow < 0 else np.concatenate([prev, self.fresh(grow)])
        self.by_session[e.session_id] = ids
        self.by_session.move_to_end(e.session_id)
        if len(self.by_session) > MAX_SESSIONS:
            self.by_session.popitem(last=False)
        return self.finish(ids)


def replay(
    trace: Trace,
    *,
    time_scale: float | None = None,
    rate_rps: float | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    num_requests: int | None = None,
    seed: int = 0,
    api: str = "completions",
    prompt: str = "tokens",
    token_ids: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
    ignore_eos: bool = True,
    min_tokens: str = "max",
    session_mode: str = "wait",
) -> list[RequestSpec]:
    """The requests of one replay of `trace`, in arrival order.

    Time: `start_s` skips the trace's first seconds (trace time); the kept part is multiplied by a scale
    factor k — `time_scale` as given (0.5 replays twice as fast), or, when `rate_rps` is given, the k that
    makes the mean rate of the trace from `start_s` on equal `rate_rps` (every gap scaled alike, so bursts
    keep their shape); `duration_s` then keeps the arrivals in the first seconds of the *scaled* replay (run
    time, matching the runner's --duration); `num_requests` keeps the first N.

    Prompts, in order of preference: the trace's own when it is of the kind being sent (text for the chat
    API or `prompt="text"`, token ids otherwise; so ShareGPT's text goes out with chat, and a token-id
    replay of it sends ids of its word-count lengths instead); prompt blocks derived from Mooncake-style `hash_ids` (each id stands for `block_tokens` tokens whose ids are a
    deterministic function of the seed and the id, so requests sharing an id share those tokens, and a last
    partial block is a prefix of the full block); for a session's later turn, the previous turn's prompt
    grown by fresh tokens (the shared prefix a multi-turn chat has); else fresh random tokens of the
    trace's length. Prompt content is salted by the trace name and scale so that the runs of a sweep do not
    share prefixes across rates (see `slobench.workload.spec._salted`).

    Sessions: a session's requests are its turns, numbered; with `session_mode` "wait" (the default) each
    later turn waits for its predecessor's answer plus the trace's gap between them
    (`slobench.workload.trace_sessions`); "scheduled" sends every turn at its trace time.
    """
    scale = replay_scale(trace, start_s=start_s, time_scale=time_scale, rate_rps=rate_rps, duration_s=duration_s,
                         num_requests=num_requests)
    kept, times = _window(trace, start_s, scale, duration_s, num_requests)
    is_text = api == "chat" or prompt == "text"
    key = prompt_salt(trace.name, scale, seed)
    builder = PromptBuilder(trace.block_tokens, key, is_text, token_ids)
    prompts = [builder.one(e) for e in kept]
    plain = [i for i, p in enumerate(prompts) if p is None]
    # The common case (Azure, BurstGPT) in one batch: the fast path the synthetic workloads use.
    rng = np.random.default_rng(np.random.SeedSequence(key & ((1 << 63) - 1), spawn_key=(0x71,)))
    lengths = [kept[i].input_tokens for i in plain]
    batch: list[Any] = text_prompts(lengths, rng) if is_text else token_prompts(lengths, rng, id_range=token_ids)
    for i, p in zip(plain, batch, strict=True):
        prompts[i] = p
    pin = min_tokens == "max"
    specs = [request_spec(i, e, t, p, trace.name, pin, ignore_eos)  # type: ignore[arg-type]
             for i, (e, t, p) in enumerate(zip(kept, times, prompts, strict=True))]
    if not is_text:  # the batch's ids were drawn from the checked range (token_prompts): say so
        drawn = (int(token_ids[0]), int(token_ids[1]))
        for i in plain:
            with_drawn_ids(specs[i], drawn)
    if any(e.session_id is not None for e in kept):
        return list(session_turns(specs, session_mode, SHAREGPT_THINK_S * scale if trace.format == "sharegpt" else None))
    check_session_mode(session_mode)
    return specs


def request_spec(i: int, e: TraceEntry, t: float, p: str | tuple[int, ...], name: str, pin: bool,
                 ignore_eos: bool) -> RequestSpec:
    n_in = len(p) if isinstance(p, tuple) else (e.input_tokens if e.prompt is not None else len(p.split()))
    return RequestSpec(
        request_id=i, arrival_s=t, prompt=p, input_tokens=n_in, max_tokens=e.output_tokens,
        min_tokens=e.output_tokens if pin else None, ignore_eos=ignore_eos, tag=e.tag or name,
        session_id=e.session_id,
    )


class ReplaySpecs(list[RequestSpec]):
    """A replay's requests, carrying what became of the trace's rows: the runner puts `row_report()` in
    summary.json as `trace_rows` (sweeps and capacity searches get it per run, as a single run does)."""

    def __init__(self, specs: list[RequestSpec], rows: dict[str, Any]) -> None:
        super().__init__(specs)
        self._rows = rows

    def row_report(self) -> dict[str, Any]:
        return dict(self._rows)


@dataclass(frozen=True, slots=True)
class TraceReplay:
    """A trace plus how to replay it: what the CLI holds where a synthetic run holds a WorkloadSpec."""

    trace: Trace
    time_scale: float | None = None
    start_s: float = 0.0
    api: str = "completions"
    prompt: str = "tokens"
    token_ids: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
    ignore_eos: bool = True
    min_tokens: str = "max"  # min_tokens = max_tokens: the output is the trace's length even without ignore_eos
    session_mode: str = "wait"  # a session's later turn waits for the previous answer (`trace_sessions`)

    def __post_init__(self) -> None:
        if self.time_scale is not None:
            replay_scale(self.trace, time_scale=self.time_scale)  # validates it
        check_replay_fields(self.start_s, self.api, self.min_tokens)
        check_session_mode(self.session_mode)

    @classmethod
    def open(
        cls,
        path: str,
        fmt: str | None = None,
        *,
        seed: int = 0,
        time_scale: float | None = None,
        start_s: float = 0.0,
        api: str = "completions",
        warn: Callable[[str], None] | None = None,
        spread: bool = True,
        keep_zero: bool = False,
        min_tokens: str = "max",
        session_mode: str = "wait",
    ) -> TraceReplay:
        """Load a trace for replay; `warn` hears about skipped rows and what the loader did."""
        trace = load_trace(path, fmt, seed=seed, spread=spread, keep_zero=keep_zero)
        if warn is not None:
            if trace.problems:
                warn(f"warning: {trace.problem_summary()}")
            for note in trace.notes:
                warn(f"note: {note}")
        return cls(trace, time_scale=time_scale, start_s=start_s, api=api, min_tokens=min_tokens,
                   session_mode=session_mode)

    @property
    def name(self) -> str:
        return self.trace.name

    def specs(self, shape: RunShape = AS_IT_IS) -> ReplaySpecs:
        refuse_fixed_lengths(shape)
        return ReplaySpecs(replay(
            self.trace, time_scale=self.time_scale, rate_rps=shape.rate_rps, start_s=self.start_s,
            duration_s=shape.duration_s, num_requests=shape.num_requests, seed=shape.seed, api=shape.api or self.api,
            prompt=self.prompt, token_ids=self.token_ids, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens, session_mode=self.session_mode,
        ), self.trace.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace.describe(),
            "time_scale": self.time_scale,
            "start_s": self.start_s,
            "api": self.api,
            "prompt": self.prompt,
            "min_tokens": self.min_tokens,
        } | ({"session_mode": self.session_mode} if self.session_mode != "wait" else {})
