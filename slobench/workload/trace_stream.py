"""Streaming trace replay: rows are read as requests are taken and each prompt is built when its request
is, so a million-row trace starts at once and memory does not grow with its length.

`stream_entries` reads a file row by row into `TraceEntry`s in arrival order, with the loader's rules
(unreadable and zero-token rows, coarse stamps, session history; see `slobench.workload.traces`):
times are shifted by the earliest of the first `PREFIX_ROWS` rows, and the stamp grid is detected on
them. Rows come out through a heap that holds only what may still be overtaken: with coarse stamps,
the rows of the current bucket. A row earlier than one already given out (a file out of time order) is
given out at once, late, and counted. ShareGPT files (one JSON document, no timestamps) are read whole.

`StreamingReplay.specs` turns that stream into `RequestSpec`s lazily: a consumer that takes each request
just before sending it (the runner's open loop iterates so) holds one at a time. Each is handed out
already built; inside a running event loop the next one is built in the loop's next turn, after the
send the consumer has just started got its turn, so building a prompt never delays the send before it. With `rate_rps` the
window's rows are read first (the rate is the window's, as in `replay`): the first `num_requests`, or
rate × `duration_s` + 1, or with neither the whole trace (its entries, not its prompts).

Same rows, counts and unspread times as `load_trace` + `replay`; the spread draws and prompt tokens come
from other random streams (per row, in file order), so one seed gives other, equally distributed, values.
"""

from __future__ import annotations

import asyncio
import heapq
import lzma
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import SpecError, UsageError
from slobench.records import RequestSpec
from slobench.workload.prompts import DEFAULT_TOKEN_ID_RANGE
from slobench.workload.replay import _Prompts, _salt, rate_scale, request_spec, time_scale_factor
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

__all__ = ["PREFIX_ROWS", "StreamLog", "StreamingReplay", "stream_entries"]

PREFIX_ROWS = 4096  # rows read before the first is given out: the time origin and the stamp grid


@dataclass(slots=True)
class StreamLog:
    """What a stream has seen so far; complete once the stream is exhausted."""

    counts: RowCounts | None = None
    bucket_s: float | None = None  # the detected stamp grid, when rows were spread over it
    num_late: int = 0  # rows earlier than one already given out
    extra_notes: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        out = list(self.extra_notes)
        if self.bucket_s is not None:
            out.append(f"timestamps come in {self.bucket_s:g} s buckets (a regular grid in the first {PREFIX_ROWS} "
                       "rows): each request was spread uniformly over its bucket instead of firing the bucket at "
                       "once; --no-spread keeps the stamps")  # fmt: skip
        if self.num_late:
            out.append(f"{self.num_late} rows came earlier than rows before them in the file and were sent late")
        return out + (self.counts.notes() if self.counts is not None else [])


def stream_entries(path: str | Path, fmt: str | None = None, *, seed: int = 0, spread: bool = True,
                   keep_zero: bool = False, log: StreamLog | None = None) -> Iterator[TraceEntry]:  # fmt: skip
    """The trace's entries in arrival order, read as they are taken (see the module doc)."""
    path = Path(path)
    fmt = detect_format(path) if fmt is None else fmt
    if fmt not in FORMATS:
        raise UsageError(f"--trace-format: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    _read_head(path)
    log = StreamLog() if log is None else log
    if fmt == "sharegpt":
        trace = load_trace(path, fmt, seed=seed, spread=spread, keep_zero=keep_zero)
        log.extra_notes += trace.notes
        yield from trace.entries
        return
    counts = log.counts = RowCounts(fmt, keep_zero)
    parsed = _csv_rows(path, fmt) if fmt in ("azure", "burstgpt") else _jsonl_rows(path, fmt)
    rows = (e for e in map(counts.admit, parsed) if e is not None)
    try:
        yield from _ordered(rows, fmt, seed, spread, log, path)
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise UsageError(f"{path}: cannot read the {compression(path)}-compressed file: {e}") from None


def _ordered(rows: Iterator[TraceEntry], fmt: str, seed: int, spread: bool, log: StreamLog,
             path: Path) -> Iterator[TraceEntry]:  # fmt: skip
    head = list(islice(rows, PREFIX_ROWS))
    counts = log.counts
    assert counts is not None
    if not head:
        raise UsageError(f"{path}: no usable requests in {counts.num_rows} rows"
                         + (f"; {len(counts.problems)} unreadable: {counts.problems[0]}" if counts.problems else ""))  # fmt: skip
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


def _built_ahead(specs: Iterator[RequestSpec]) -> Iterator[RequestSpec]:
    """`specs`, each built one step ahead: in a running event loop the next is built by a callback queued
    when one is handed out, so it runs after the send task the consumer spawns at once (FIFO), while the
    consumer sleeps to its next send time."""
    ready: deque[RequestSpec] = deque()
    failed: list[BaseException] = []
    done = False

    def build() -> None:
        nonlocal done
        if ready or done or failed:
            return
        try:
            ready.append(next(specs))
        except StopIteration:
            done = True
        except Exception as e:  # raised to the consumer on its next take, not lost in the loop's handler
            failed.append(e)

    while True:
        build()
        if failed:
            raise failed[0]
        if not ready:
            return
        spec = ready.popleft()
        try:
            asyncio.get_running_loop().call_soon(build)
        except RuntimeError:  # no loop: the next is built when it is taken
            pass
        yield spec


@dataclass(frozen=True, slots=True)
class StreamingReplay:
    """A trace file and how to replay it, read as the run goes (see the module doc)."""

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
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise SpecError("start", self.start_s, "must be a finite number >= 0 (trace seconds)")
        if self.min_tokens not in ("max", "none"):
            raise SpecError("min_tokens", self.min_tokens, "must be 'max' or 'none'")

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def specs(self, *, rate_rps: float | None = None, duration_s: float | None = None,
              num_requests: int | None = None, seed: int = 0, api: str | None = None) -> Iterator[RequestSpec]:  # fmt: skip
        """The run's requests in arrival order, each built when it is taken."""
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise SpecError("duration_s", duration_s, "must be a finite number > 0")
        if num_requests is not None and num_requests < 1:
            raise SpecError("num_requests", num_requests, "must be >= 1")
        entries = stream_entries(self.path, self.fmt, seed=seed, spread=self.spread, keep_zero=self.keep_zero,
                                 log=self.log)  # fmt: skip
        start = self.start_s
        after: Iterator[TraceEntry] = (e for e in entries if e.arrival_s >= start)
        if rate_rps is None:
            scale = time_scale_factor(self.time_scale)
        else:
            if not (math.isfinite(rate_rps) and rate_rps > 0):
                raise SpecError("rate_rps", rate_rps, "must be a finite number > 0")
            if num_requests is not None:
                window = list(islice(after, max(num_requests, 2)))
            elif duration_s is not None:
                window = list(islice(after, max(2, round(rate_rps * duration_s)) + 1))
            else:
                window = list(after)
            t = np.array([e.arrival_s for e in window])
            scale = rate_scale(t, self.path, start_s=start, rate_rps=rate_rps, duration_s=duration_s,
                               num_requests=num_requests)  # fmt: skip
            after = chain(window, after)
        return _built_ahead(self._requests(after, scale, duration_s, num_requests, seed, api or self.api))

    def _requests(self, entries: Iterator[TraceEntry], scale: float, duration_s: float | None,
                  num_requests: int | None, seed: int, api: str) -> Iterator[RequestSpec]:  # fmt: skip
        is_text = api == "chat" or self.prompt == "text"
        name = self.name
        builder = _Prompts(MOONCAKE_BLOCK_TOKENS, _salt(name, scale, seed), is_text, self.token_ids)
        pin = self.min_tokens == "max"
        for i, e in enumerate(entries):
            t = (e.arrival_s - self.start_s) * scale
            if (duration_s is not None and t >= duration_s) or (num_requests is not None and i >= num_requests):
                return
            p = builder.one(e)
            if p is None:
                p = builder.finish(builder.fresh(e.input_tokens))
            yield request_spec(i, e, t, p, name, pin, self.ignore_eos)

    def to_dict(self) -> dict[str, Any]:
        return {"trace": {"path": self.path, "format": self.fmt, "streamed": True, "notes": self.log.notes()},
                "time_scale": self.time_scale, "start_s": self.start_s, "api": self.api, "prompt": self.prompt,
                "min_tokens": self.min_tokens}  # fmt: skip
