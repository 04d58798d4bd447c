"""Streaming trace replay: rows are read as requests are taken and each prompt is built when its request
is, so a million-row trace starts at once and memory does not grow with its length (`stream_entries`,
`StreamingReplay`)."""

from __future__ import annotations

import asyncio
import heapq
import lzma
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import UsageError
from slobench.input_file import TRACE, open_input
from slobench.run.records import RequestSpec
from slobench.workload.base import AS_IT_IS, RunShape, refuse_fixed_lengths
from slobench.workload.bundled import trace_path
from slobench.workload.prompts import DEFAULT_TOKEN_ID_RANGE
from slobench.workload.replay import (
    PromptBuilder,
    check_replay_fields,
    prompt_salt,
    rate_scale,
    request_spec,
    time_scale_factor,
)
from slobench.workload.trace_sessions import session_turns
from slobench.workload.traces import (
    _STAMPED,
    FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    RowCounts,
    TraceEntry,
    _csv_rows,
    _jsonl_rows,
    _read_head,
    compression,
    detect_format,
    load_trace,
    stamp_grid,
)

__all__ = ["PREFIX_ROWS", "ReplayStream", "StreamLog", "StreamingReplay", "count_lines", "stream_entries"]

PREFIX_ROWS = 4096  # rows read before the first is given out: the time origin and the stamp grid
MAX_AHEAD = 256  # requests built ahead at most (~1.3 s at 200 req/s; a few MB of prompts)
BUILD_TIME_WEIGHT = 0.05  # the weight of the latest build in the running mean of build times
FILL_MARGIN_S = 0.0005  # slack left unused before a send, beyond two builds


@dataclass(slots=True)
class StreamLog:
    """What a stream has seen so far; complete once the stream is exhausted."""

    counts: RowCounts | None = None
    bucket_s: float | None = None  # the detected stamp grid, when rows were spread over it
    num_late: int = 0  # rows earlier than one already given out
    extra_notes: list[str] = field(default_factory=list)
    num_given: int = 0  # entries given out so far
    is_complete: bool = False  # the file was read to its end

    def reset(self) -> None:
        self.counts, self.bucket_s, self.num_late, self.extra_notes = None, None, 0, []
        self.num_given, self.is_complete = 0, False

    def report(self, path: str) -> dict[str, Any]:
        """What became of the rows read so far (see `RowCounts.report`)."""
        if self.counts is None:  # ShareGPT: read whole, counted by load_trace
            return {"path": path, "format": "sharegpt", "num_rows_read": None, "is_whole_file": self.is_complete,
                    "num_requests": self.num_given, "notes": self.notes()}
        return self.counts.report(path, self.num_given, self.notes(), is_whole_file=self.is_complete,
                                  spread_s=self.bucket_s, num_late=self.num_late)

    def notes(self) -> list[str]:
        out = list(self.extra_notes)
        if self.bucket_s is not None:
            out.append(f"timestamps come in {self.bucket_s:g} s buckets (a regular grid in the first {PREFIX_ROWS} "
                       "rows): each request was spread uniformly over its bucket instead of firing the bucket at "
                       "once; --no-spread keeps the stamps")
        if self.num_late:
            out.append(f"{self.num_late} rows came earlier than rows before them in the file and were sent late")
        return out + (self.counts.notes() if self.counts is not None else [])


def stream_entries(path: str | Path, fmt: str | None = None, *, seed: int = 0, spread: bool = True,
                   keep_zero: bool = False, log: StreamLog | None = None) -> Iterator[TraceEntry]:
    """The trace's entries in arrival order, read row by row as they are taken, with the loader's rules
    (unreadable and zero-token rows, coarse stamps, session history; see `slobench.workload.traces`):
    times are shifted by the earliest of the first `PREFIX_ROWS` rows, and the stamp grid is detected on
    them. Rows come out through a heap that holds only what may still be overtaken: with coarse stamps,
    the rows of the current bucket. A row earlier than one already given out (a file out of time order) is
    given out at once, late, and counted. ShareGPT files (one JSON document, no timestamps) are read whole.
    """
    path = Path(path)
    fmt = detect_format(path) if fmt is None else fmt
    if fmt not in FORMATS:
        raise UsageError(f"--trace-format: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    _read_head(path)
    log = StreamLog() if log is None else log
    if fmt == "sharegpt":
        trace = load_trace(path, fmt, seed=seed, spread=spread, keep_zero=keep_zero)
        log.extra_notes += trace.notes
        for e in trace.entries:
            log.num_given += 1
            yield e
        log.is_complete = True
        return
    counts = log.counts = RowCounts(fmt, keep_zero)
    parsed = _csv_rows(path, fmt) if fmt in ("azure", "burstgpt") else _jsonl_rows(path, fmt)
    rows = (e for e in map(counts.admit, parsed) if e is not None)
    try:
        for e in _ordered(rows, fmt, seed, spread, log, path):
            log.num_given += 1
            yield e
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise UsageError(f"{path}: cannot read the {compression(path)}-compressed file: {e}") from None
    log.is_complete = True


def _ordered(rows: Iterator[TraceEntry], fmt: str, seed: int, spread: bool, log: StreamLog,
             path: Path) -> Iterator[TraceEntry]:
    head = list(islice(rows, PREFIX_ROWS))
    counts = log.counts
    assert counts is not None
    if not head:
        raise UsageError(f"{path}: no usable requests in {counts.num_rows} rows"
                         + (f"; {len(counts.problems)} unreadable: {counts.problems[0]}" if counts.problems else ""))
    t0 = min(e.arrival_s for e in head)
    width = stamp_grid(np.array([e.arrival_s for e in head])) if spread and fmt in _STAMPED else None
    log.bucket_s = width
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x6D6F6F6E, 1)))
    heap: list[tuple[float, int, TraceEntry]] = []
    released = newest = -math.inf
    for seq, e in enumerate(chain(head, rows)):
        raw = e.arrival_s - t0
        t = max(0.0, raw + (float(rng.random()) * width if width else 0.0))
        newest = max(newest, raw)
        while heap and heap[0][0] < newest:  # nothing still to come can land before these
            released, _, ready = heapq.heappop(heap)
            yield counts.with_history(ready)
        if t < released:
            log.num_late += 1
            yield counts.with_history(replace(e, arrival_s=released))
        else:
            heapq.heappush(heap, (t, seq, replace(e, arrival_s=t)))
    while heap:
        _, _, ready = heapq.heappop(heap)
        yield counts.with_history(ready)


class ReplayStream(Iterator[RequestSpec]):
    """A streamed replay's requests, built ahead of their takes. At least one is always ready: when a take
    empties the buffer, the next is built by a callback queued then, so it runs after the send task the
    consumer spawns at once (FIFO), while the consumer sleeps to its next send time. A consumer that knows
    its slack (the runner, sleeping to a send time) calls `fill(slack_s)` to build more, one at a time, up
    to `MAX_AHEAD`, only while a build fits the slack: so the build after a send does not land in a short
    gap (a Poisson trace at 200 req/s has a quarter of its gaps under 1.5 ms).

    The first is built on creation, so a file that yields no request fails before anything is sent. For
    the runner: `row_report()` (what the rows read became, summary.json's `trace_rows`) and
    `count_hint()` (an estimate of its length)."""

    def __init__(self, specs: Iterator[RequestSpec], path: str, log: StreamLog,
                 count_hint: Callable[[], int | None]) -> None:
        self._specs = specs
        self._ready: deque[RequestSpec] = deque()
        self._failed: list[BaseException] = []
        self._done = False
        self._build_s = 0.0  # a build's recent mean duration (exponentially weighted)
        self.path = path
        self.log = log
        self._count_hint = count_hint
        self._build()
        if self._failed:
            raise self._failed.pop()

    def _build(self) -> None:
        """Build the next request when none is ready (the take path)."""
        if not self._ready:
            self._build_one()

    def _build_one(self) -> None:
        if self._done or self._failed:
            return
        t0 = time.perf_counter()
        try:
            self._ready.append(next(self._specs))
        except StopIteration:
            self._done = True
        except Exception as e:  # raised to the consumer on its next take, not lost in the loop's handler
            self._failed.append(e)
        dt = time.perf_counter() - t0
        self._build_s = dt if self._build_s == 0.0 else self._build_s + BUILD_TIME_WEIGHT * (dt - self._build_s)

    def fill(self, slack_s: float) -> bool:
        """Build one more request ahead when it fits in `slack_s` seconds (twice a build's recent mean and
        FILL_MARGIN_S) and fewer than MAX_AHEAD are ready; whether one was built. The mean, not the
        slowest: on a busy machine a build is sometimes preempted, and waiting for slack that fits such a
        build would leave the buffer empty, so that every next request is built right after a send."""
        if len(self._ready) >= MAX_AHEAD or self._done or self._failed or slack_s < 2 * self._build_s + FILL_MARGIN_S:
            return False
        self._build_one()
        return True

    def __iter__(self) -> ReplayStream:
        return self

    def __next__(self) -> RequestSpec:
        self._build()
        if self._failed:
            raise self._failed.pop()
        if not self._ready:
            raise StopIteration
        spec = self._ready.popleft()
        if not self._ready:
            try:
                asyncio.get_running_loop().call_soon(self._build)
            except RuntimeError:  # no loop: the next is built when it is taken
                pass
        return spec

    @property
    def is_empty(self) -> bool:
        return self._done and not self._ready

    def row_report(self) -> dict[str, Any]:
        return self.log.report(self.path)

    def count_hint(self) -> int | None:
        return self._count_hint()


def count_lines(path: str | Path) -> int | None:
    """The data lines of an uncompressed newline-delimited trace (a CSV's header left out); None for a
    compressed file, whose lines cost as much to count as to read."""
    path = Path(path)
    if compression(path) is not None:
        return None
    n = 0
    last = b"\n"
    with open_input(path, TRACE) as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    n += last != b"\n"  # a last line without its newline
    return n - (detect_format(path) in ("azure", "burstgpt"))


@dataclass(frozen=True, slots=True)
class StreamingReplay:
    """A trace file and how to replay it, read as the run goes.

    `specs` turns `stream_entries` into `RequestSpec`s lazily: a consumer that takes each request just
    before sending it (the runner's open loop iterates so) holds one at a time. Each is handed out already
    built; inside a running event loop the next one is built in the loop's next turn, after the send the
    consumer has just started got its turn, so building a prompt never delays the send before it. With a
    rate the window's rows are read first (the rate is the window's, as in `replay`): the first `num_requests`, or
    rate × `duration_s` + 1, or with neither the whole trace (its entries, not its prompts).

    Same rows, counts and unspread times as `load_trace` + `replay`; the spread draws and prompt tokens come
    from other random streams (per row, in file order), so one seed gives other, equally distributed, values.
    """

    path: str
    fmt: str | None = None
    time_scale: float | None = None
    start_s: float = 0.0
    api: str = "completions"
    prompt: str = "tokens"
    token_ids: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
    ignore_eos: bool = True
    min_tokens: str = "max"
    spread: bool = True
    keep_zero: bool = False
    log: StreamLog = field(default_factory=StreamLog, compare=False)

    def __post_init__(self) -> None:
        if self.time_scale is not None:
            time_scale_factor(self.time_scale)  # validates it
        check_replay_fields(self.start_s, self.api, self.min_tokens)

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @classmethod
    def open(cls, path: str, fmt: str | None = None, **kwargs: Any) -> StreamingReplay:
        """A replay of `path` (or of the bundled sample trace it names), its format checked now (a missing
        file or an unknown format is a UsageError here, before any connection); nothing else is read until
        `specs`."""
        file = trace_path(path)
        fmt = detect_format(file) if fmt is None else fmt
        if fmt not in FORMATS:
            raise UsageError(f"--trace-format: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        _read_head(file)
        return cls(str(file), fmt, **kwargs)

    def specs(self, shape: RunShape = AS_IT_IS) -> ReplayStream:
        """The run's requests in arrival order, each built when it is taken (the first now). `self.log`
        follows the latest call's stream."""
        refuse_fixed_lengths(shape)
        rate_rps, duration_s, num_requests, seed = shape.rate_rps, shape.duration_s, shape.num_requests, shape.seed
        self.log.reset()
        start = self.start_s
        after = self._after(start, seed, self.log)
        if rate_rps is None:
            scale = time_scale_factor(self.time_scale)
        else:
            if num_requests is not None or duration_s is not None:
                n = max(num_requests, 2) if num_requests is not None else max(2, round(rate_rps * (duration_s or 0))) + 1
                window = list(islice(after, n))
                t = np.array([e.arrival_s for e in window])
            else:  # the whole rest: one pass for its count and span (memory flat), then the stream afresh
                window = []
                n, first, last = self._count_span(start, seed)
                t = np.array([first, last]) if n >= 2 else np.empty(0)
                self.log.reset()
                after = self._after(start, seed, self.log)
            scale = rate_scale(t, self.path, start_s=start, rate_rps=rate_rps, duration_s=duration_s,
                               num_requests=num_requests)
            if not window:  # rate_scale saw the span as two times: it holds n - 1 gaps, not 1
                scale *= n - 1
            after = chain(window, after)
        made = self._requests(after, scale, duration_s, num_requests, seed, shape.api or self.api)
        stream = ReplayStream(session_turns(made, "scheduled"),  # each session's turns numbered, sent at their times
                              self.path, self.log, lambda: self._count_hint(rate_rps, duration_s, num_requests))
        if stream.is_empty:
            raise UsageError(f"{self.path}: the window (--start {start:g} s, --duration {duration_s} s at scale "
                             f"{scale:g}) holds no request")
        return stream

    def _after(self, start: float, seed: int, log: StreamLog) -> Iterator[TraceEntry]:
        entries = stream_entries(self.path, self.fmt, seed=seed, spread=self.spread, keep_zero=self.keep_zero,
                                 log=log)
        return (e for e in entries if e.arrival_s >= start)

    def _count_span(self, start: float, seed: int) -> tuple[int, float, float]:
        """How many requests the rest of the trace holds, its first and its last arrival time."""
        n, first, last = 0, math.nan, math.nan
        for e in self._after(start, seed, StreamLog()):
            first = e.arrival_s if n == 0 else first
            last = e.arrival_s
            n += 1
        return n, first, last

    def _count_hint(self, rate_rps: float | None, duration_s: float | None, num_requests: int | None) -> int | None:
        """About how many requests the run will send, for the progress line: the asked number, the rate
        times the duration, or the file's lines (rows left out and --start not subtracted)."""
        if num_requests is not None:
            return num_requests
        if duration_s is not None:
            return round(rate_rps * duration_s) if rate_rps is not None else None
        return count_lines(self.path) if self.fmt != "sharegpt" else None

    def _requests(self, entries: Iterator[TraceEntry], scale: float, duration_s: float | None,
                  num_requests: int | None, seed: int, api: str) -> Iterator[RequestSpec]:
        is_text = api == "chat" or self.prompt == "text"
        name = self.name
        builder = PromptBuilder(MOONCAKE_BLOCK_TOKENS, prompt_salt(name, scale, seed), is_text, self.token_ids)
        pin = self.min_tokens == "max"
        if num_requests is not None:
            entries = islice(entries, max(num_requests, 0))  # not one row more: the log counts what was given
        for i, e in enumerate(entries):
            t = (e.arrival_s - self.start_s) * scale
            if duration_s is not None and t >= duration_s:
                self.log.num_given -= 1  # read to find the window's end, not sent
                return
            p = builder.one(e)
            if p is None:
                p = builder.finish(builder.fresh(e.input_tokens))
            yield request_spec(i, e, t, p, name, pin, self.ignore_eos)

    def to_dict(self) -> dict[str, Any]:
        """What a manifest records before the run; what the rows became is only known after it (the
        runner adds it to the manifest and summary.json as `trace_rows`)."""
        return {"trace": {"path": self.path, "format": self.fmt, "streamed": True},
                "time_scale": self.time_scale, "start_s": self.start_s, "api": self.api, "prompt": self.prompt,
                "min_tokens": self.min_tokens}
