"""requests.parquet: a run's records as Apache Parquet, one row a request, beside requests.jsonl.

requests.jsonl stays the crash-safe log; the Parquet file is written when the run ends (`ParquetLog`, to a
temporary name renamed at the end) and read column by column into numpy (`read_columns`), with no Python
object per request. Readers fall back to the JSON lines when the Parquet file is absent, unreadable, or
was written from a requests.jsonl of another size (`parquet_problem`). Chunk times are a list column:
one `.values` array and its offsets give every inter-token gap in one numpy pass.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from slobench.errors import UsageError
from slobench.input_file import PARQUET as PARQUET_FILE
from slobench.input_file import check_input
from slobench.run.records import REQUESTS, RequestRecord, round_9

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

PARQUET = "requests.parquet"
ROW_GROUP = 1 << 16  # records buffered before a row group is written: bounds the writer's memory
ROW_GROUP_CHUNKS = 1 << 22  # or chunk times buffered (long answers): 32 MB of times, 16 MB of token counts
# float columns stored byte-plane by byte-plane, not dictionary-encoded (Arrow prefers a dictionary where both
# are asked for): zstd then finds the shared exponents of nearby times. A run's tens of millions of distinct
# chunk times read back ten times faster so than through a dictionary that overflows every page.
CHUNK_TIMES_LEAF = "chunk_times_s.list.element"  # the Parquet column holding every request's chunk times
BYTE_STREAM_SPLIT = ("scheduled_s", "sent_s", "first_token_s", "done_s", CHUNK_TIMES_LEAF)
JSONL_BYTES_KEY = b"slobench.requests_jsonl_bytes"  # the size of the requests.jsonl it was written beside
STATUS_COUNTS_KEY = b"slobench.status_counts"  # {status: records} as written: a file altered since disagrees

FLOATS = ("scheduled_s", "sent_s", "first_token_s", "done_s", "queued_s", "estimated_s", "first_reasoning_s",
          "first_answer_s")
INTS = ("request_id", "input_tokens", "prompt_tokens", "cached_tokens", "output_tokens", "usage_output_tokens",
        "max_tokens", "http_status", "replica", "session_id", "turn", "reasoning_tokens")
STRINGS = ("tag", "status", "error", "finish_reason", "output_tokens_source", "retried", "reasoning_tokens_source")
# columns added since requests.parquet was first written: a file without them (an older slobench's) is read
# from the Parquet all the same, each missing one as absent in every row
OPTIONAL = ("session_id", "turn", "estimated_s", "first_reasoning_s", "first_answer_s", "reasoning_tokens",
            "reasoning_tokens_source")
_NOT_NULL = frozenset({"request_id", "scheduled_s", "chunk_times_s", "chunk_tokens", "is_warmup"})


@cache
def schema() -> pa.Schema:
    """The columns in RequestRecord's field order, so a DuckDB `SELECT *` reads like a requests.jsonl line.
    pyarrow is imported here and in the functions that read or write, not with the module: a run's start-up
    (and `slobench run --help`) does not pay for it."""
    import pyarrow as pa

    types: dict[str, pa.DataType] = {**dict.fromkeys(FLOATS, pa.float64()), **dict.fromkeys(INTS, pa.int64()),
                                     **dict.fromkeys(STRINGS, pa.string()), "is_warmup": pa.bool_(),
                                     "chunk_times_s": pa.list_(pa.float64()), "chunk_tokens": pa.list_(pa.int32())}
    return pa.schema([pa.field(name, types[name], nullable=name not in _NOT_NULL)
                      for name in RequestRecord.__dataclass_fields__])


@dataclass(frozen=True, slots=True)
class Columns:
    """Records as numpy columns, in file order. Numbers are float64 with NaN where absent (integers are
    exact below 2**53), strings object arrays with None where absent; request i's chunk times are
    `chunk_times_s[chunk_offsets[i]:chunk_offsets[i + 1]]`."""

    values: dict[str, np.ndarray]
    chunk_times_s: np.ndarray
    chunk_offsets: np.ndarray
    steps: StepChunks | None = None  # the chunk times as slices of shared step times (chunk_times_s is empty)

    def __len__(self) -> int:
        return len(self.chunk_offsets) - 1

    def take(self, idx: np.ndarray) -> Columns:
        """The rows at indices `idx`, in that order."""
        starts, ends = self.chunk_offsets[idx], self.chunk_offsets[idx + 1]
        lengths = ends - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = {k: v[idx] for k, v in self.values.items()}
        if self.steps is not None:
            return Columns(values, self.chunk_times_s, offsets, self.steps.take(idx))
        return Columns(values, self.chunk_times_s[spans(starts, lengths)], offsets)


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices `starts[i]`, ..., `starts[i] + lengths[i] - 1` of every i, one after another."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.repeat(np.asarray(starts, dtype=np.int64) - offsets[:-1], lengths) + np.arange(offsets[-1])


@dataclass(frozen=True, slots=True)
class StepChunks:
    """Every record's chunk times as slices of one array (`pool`): a simulated replica's step end times, which
    every request decoding in a step shares, so a request's chunk times are mostly one slice of them (more
    where it was preempted), and times that are no replica's steps held as they came. Record i's slices are
    `starts[ends[i]:ends[i + 1]]` with their `lengths`: about one a record in place of ~150 times."""

    pool: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    ends: np.ndarray

    def take(self, idx: np.ndarray) -> StepChunks:
        first = self.ends[idx]
        count = self.ends[idx + 1] - first
        ends = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(count, out=ends[1:])
        pos = spans(first, count)
        return StepChunks(self.pool, self.starts[pos], self.lengths[pos], ends)

    def times(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The chunk times of records lo to hi (by default all), one record after another."""
        a, b = int(self.ends[lo]), int(self.ends[len(self.ends) - 1 if hi is None else hi])
        return self.pool[spans(self.starts[a:b], self.lengths[a:b])]


def columns_of_rows(rows: Sequence[Any], get: Callable[[Any, str], Any]) -> Columns:
    """Records in memory (`get=getattr`) or parsed requests.jsonl lines (`get=dict.get`) as `Columns`."""
    n = len(rows)
    nan = float("nan")
    values: dict[str, np.ndarray] = {}
    for key in (*FLOATS, *INTS):
        values[key] = np.fromiter((nan if (v := get(r, key)) is None else float(v) for r in rows), float, n)
    for key in STRINGS:
        values[key] = np.array([None if (v := get(r, key)) is None else str(v) for r in rows], dtype=object)
    values["is_warmup"] = np.fromiter((bool(get(r, "is_warmup")) for r in rows), bool, n)
    chunks = [get(r, "chunk_times_s") or () for r in rows]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, chunks), np.int64, n), out=offsets[1:])
    flat = np.fromiter((t for c in chunks for t in c), float, int(offsets[-1]))
    return Columns(values, flat, offsets)


_NUMBERS = attrgetter(*FLOATS, *INTS)
_STRINGS = attrgetter(*STRINGS)
_NAN = float("nan")


class StepTimes:
    """Each replica's step end times, in order, as a simulator steps (`table(replica)`, appended to): the
    times its requests' chunks come at. `shift_s` is added to every time a record reports after its send."""

    def __init__(self, shift_s: float = 0.0) -> None:
        self.shift_s = shift_s
        self.tables: list[array[float]] = []

    def table(self, replica: int) -> array[float]:
        while len(self.tables) <= replica:
            self.tables.append(array("d"))
        return self.tables[replica]

    def shifted(self, replica: int, start: int = 0) -> np.ndarray:
        """A replica's step times from the start-th on, as its records report them (a copy)."""
        t = np.array(self.table(replica)[start:], dtype=float)
        return t + self.shift_s if self.shift_s else t


FOLD_TIMES = 1 << 20  # chunk times gathered before they are matched to step times (8 MB: its temporary arrays
# stay below the size from which each is mapped afresh, page by page)


class RecordBuffer:
    """Records in compact arrays, none kept (a row group's; a simulated run's, for its summary): a record's
    numbers one row of `numbers`, its chunk times and token counts appended to flat arrays with their
    running ends. About a third of what serialising the record's JSON line costs.

    steps: the run's step times (a simulated run's summary): every FOLD_TIMES chunk times, each record's are
    matched to slices of its replica's step times and dropped (`columns` then holds `StepChunks`); times no
    step has are kept as they came. A million requests' 157 million chunk times become ~1 slice each."""

    def __init__(self, *, tokens: bool = True, steps: StepTimes | None = None) -> None:
        self.keep_tokens = tokens  # False: chunk token counts are not kept (`columns` has none)
        self.numbers = array("d")
        self.strings: list[tuple[str | None, ...]] = []
        self.is_warmup = array("b")
        self.times, self.times_end = array("d"), array("q", [0])
        self.tokens, self.tokens_end = array("i"), array("q", [0])
        self.steps = steps
        self.folded = 0  # records whose chunk times were matched to step times (and left `times`)
        self.times_base = 0  # how many chunk times those records had
        self.replicas = array("q")  # the replica of each record not yet folded
        # per fold: each slice's table (-1: `raw`), start and length, and the slices of each record
        self.slices: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.raw = array("d")

    def __len__(self) -> int:
        return len(self.is_warmup)

    def add(self, rec: RequestRecord) -> None:
        self.numbers.extend([_NAN if v is None else v for v in _NUMBERS(rec)])
        self.strings.append(_STRINGS(rec))
        self.is_warmup.append(rec.is_warmup)
        self.times.extend(rec.chunk_times_s)
        self.times_end.append(self.times_base + len(self.times))
        if self.keep_tokens:
            self.tokens.extend(rec.chunk_tokens)
            self.tokens_end.append(len(self.tokens))
        if self.steps is not None:
            self.replicas.append(rec.replica or 0)
            if len(self.times) >= FOLD_TIMES:
                self._fold()

    def _fold(self) -> None:
        """Match the chunk times of the records added since the last fold to slices of step times, and drop
        them. A record's times are one slice where its first time starts a slice of its replica's step times
        equal to them all (checked time by time); else they are cut where they skip steps, or kept in `raw`
        where some time is no step's."""
        assert self.steps is not None
        n0, n1 = self.folded, len(self)
        num = n1 - n0
        ends = np.array(self.times_end[n0:n1 + 1], dtype=np.int64) - self.times_base
        x = np.array(self.times, dtype=float)
        lengths, starts = np.diff(ends), ends[:-1]
        reps = np.array(self.replicas, dtype=np.int64)
        one = np.zeros(num, dtype=bool)  # the record's times are one slice: (table, first) ...
        first = np.zeros(num, dtype=np.int64)
        cuts: dict[int, list[tuple[int, int, int]]] = {}  # ... else its slices
        nonempty = int(np.count_nonzero(lengths))
        for r in np.unique(reps[lengths > 0]).tolist():
            recs = np.flatnonzero((reps == r) & (lengths > 0))
            ln, st = lengths[recs], starts[recs]
            # the step times from the earliest these records have on (a fold's records came late in the run)
            base = max(bisect_left(self.steps.table(r), float(x[st].min()) - self.steps.shift_s) - 1, 0)
            t = self.steps.shifted(r, base)
            if not len(t):
                t = np.full(1, np.nan)  # (no step: every time is kept as it came)
            i0 = np.searchsorted(t, x[st])
            fits = i0 + ln <= len(t)
            i0 = np.where(fits, i0, 0)
            at = spans(i0, ln)
            np.minimum(at, len(t) - 1, out=at)
            xs = x if len(recs) == nonempty else x[spans(st, ln)]  # (one replica: every time gathered)
            wrong = np.flatnonzero(xs != t[at])
            same = fits.copy()
            same[np.searchsorted(np.cumsum(ln), wrong, side="right")] = False
            one[recs[same]], first[recs[same]] = True, base + i0[same]
            for j in np.flatnonzero(~same).tolist():  # preempted (skipped steps), or times no step has
                mine = x[st[j]:st[j] + ln[j]]
                at = np.minimum(np.searchsorted(t, mine), len(t) - 1)
                if (t[at] == mine).all():
                    cut = np.flatnonzero(np.diff(at) != 1) + 1
                    bounds = [0, *cut.tolist(), len(at)]
                    cuts[int(recs[j])] = [(r, base + int(at[a]), b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
                else:
                    cuts[int(recs[j])] = [(-1, len(self.raw), len(mine))]
                    self.raw.extend(mine.tolist())
        count = one.astype(np.int64)
        for k, c in cuts.items():
            count[k] = len(c)
        per = np.zeros(num + 1, dtype=np.int64)
        np.cumsum(count, out=per[1:])
        s_table, s_start, s_len = np.empty(per[-1], dtype=np.int64), np.empty(per[-1], dtype=np.int64), np.empty(per[-1], dtype=np.int64)
        at1 = per[:-1][one]
        s_table[at1], s_start[at1], s_len[at1] = reps[one], first[one], lengths[one]
        for k, c in cuts.items():
            for j, (r, a, n) in enumerate(c):
                s_table[per[k] + j], s_start[per[k] + j], s_len[per[k] + j] = r, a, n
        self.slices.append((s_table, s_start, s_len, count))
        self.folded, self.times_base = n1, self.times_base + len(self.times)
        self.times, self.replicas = array("d"), array("q")

    def columns(self) -> Columns:
        """The records added, as `Columns`: what `columns_of_rows(records, getattr)` makes of them, without
        holding the records (a simulated run's summary; with `steps`, its chunk times as `StepChunks`)."""
        n = len(self)
        numbers = np.frombuffer(self.numbers, dtype=float).reshape(n, len(FLOATS) + len(INTS))
        values = {k: np.ascontiguousarray(numbers[:, j]) for j, k in enumerate((*FLOATS, *INTS))}
        for j, k in enumerate(STRINGS):
            values[k] = np.array([row[j] for row in self.strings], dtype=object)
        values["is_warmup"] = np.frombuffer(self.is_warmup, dtype=np.int8).astype(bool)
        offsets = np.frombuffer(self.times_end, dtype=np.int64)
        if self.steps is None:
            return Columns(values, np.frombuffer(self.times, dtype=float), offsets)
        self._fold()
        base = np.cumsum([0] + [len(t) for t in self.steps.tables])  # each table's start in the pool; then `raw`
        if len(self.steps.tables) == 1 and not self.raw and not self.steps.shift_s:
            pool = np.frombuffer(self.steps.tables[0], dtype=float)  # (no copy: the table takes no more times)
        else:
            pool = np.concatenate([*(self.steps.shifted(r) for r in range(len(self.steps.tables))),
                                   np.frombuffer(self.raw, dtype=float)])
        s_table = np.concatenate([f[0] for f in self.slices])
        s_start = np.concatenate([f[1] for f in self.slices])
        ends = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.concatenate([f[3] for f in self.slices]), out=ends[1:])
        return Columns(values, np.zeros(0), offsets.copy(),
                       StepChunks(pool, base[s_table] + s_start, np.concatenate([f[2] for f in self.slices]), ends))

    def table(self) -> pa.Table:
        import pyarrow as pa

        cols: dict[str, pa.Array] = {}
        numbers = np.frombuffer(self.numbers, dtype=float).reshape(len(self), len(FLOATS) + len(INTS))
        for j, k in enumerate((*FLOATS, *INTS)):
            x = np.ascontiguousarray(numbers[:, j])
            absent = np.isnan(x)
            mask = absent if absent.any() else None
            cols[k] = pa.array(np.where(absent, 0, x).astype(np.int64) if k in INTS else x, mask=mask)
        for k, words in zip(STRINGS, zip(*self.strings, strict=True) if self.strings else [()] * len(STRINGS),
                            strict=True):
            cols[k] = pa.array(words, pa.string())
        cols["is_warmup"] = pa.array(np.frombuffer(self.is_warmup, dtype=np.int8).astype(bool))
        for name, flat, ends in (("chunk_times_s", round_9(np.frombuffer(self.times, dtype=float)), self.times_end),
                                 ("chunk_tokens", np.frombuffer(self.tokens, dtype=np.int32), self.tokens_end)):
            offsets = pa.array(np.frombuffer(ends, dtype=np.int64), pa.int32())
            cols[name] = pa.ListArray.from_arrays(offsets, pa.array(flat))
        return pa.table([cols[f.name] for f in schema()], schema=schema())


WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd", "write_statistics": False, "use_byte_stream_split": list(BYTE_STREAM_SPLIT),
    "use_dictionary": [c for c in (*FLOATS, *INTS, *STRINGS, "is_warmup", CHUNK_TIMES_LEAF,
                                   "chunk_tokens.list.element") if c not in BYTE_STREAM_SPLIT],
}


class ParquetLog:
    """requests.parquet written as records come: every ROW_GROUP records a row group is converted and
    compressed on a worker thread (on a live run's event loop it would stall the sends for a fraction of a
    second) into requests.parquet.tmp, renamed when `close` is given requests.jsonl's final size. A failure
    (a full disk) drops the Parquet file with a note and never touches requests.jsonl, which stays the
    record."""

    def __init__(self, run_dir: Path) -> None:

        self.path = Path(run_dir) / PARQUET
        self.tmp = self.path.with_name(PARQUET + ".tmp")
        self._buffer = RecordBuffer()
        self._writer: pq.ParquetWriter | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self.failed: str | None = None
        self.closed = False
        self.status_counts: dict[str, int] = {}

    def add(self, rec: RequestRecord) -> None:
        if self.failed is None:
            self.status_counts[rec.status] = self.status_counts.get(rec.status, 0) + 1
            self._buffer.add(rec)
            if len(self._buffer) >= ROW_GROUP or len(self._buffer.times) >= ROW_GROUP_CHUNKS:
                full, self._buffer = self._buffer, RecordBuffer()
                self._guard(lambda: self._hand_off(full))

    def close(self, jsonl_bytes: int) -> None:
        """Write what is buffered and move the file into place, recording requests.jsonl's size in bytes."""
        def finish() -> None:
            self._wait()
            self._write(self._buffer)
            self._buffer = RecordBuffer()
            assert self._writer is not None
            self._writer.add_key_value_metadata({JSONL_BYTES_KEY: str(jsonl_bytes).encode(),
                                                 STATUS_COUNTS_KEY: json.dumps(self.status_counts).encode()})
            self._writer.close()
            self._writer = None
            os.replace(self.tmp, self.path)

        self._guard(finish)
        self._stop_pool()
        self.closed = True

    def abort(self) -> None:
        """Drop the file being written (the records are being replaced, or writing failed)."""
        import pyarrow as pa

        try:
            self._wait()
        except (OSError, pa.ArrowException):
            pass
        self._stop_pool()
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, pa.ArrowException):
                pass
            self._writer = None
        self.tmp.unlink(missing_ok=True)
        self._buffer = RecordBuffer()
        self.closed = True  # nothing more is written: `close` has nothing to move into place

    def _hand_off(self, full: RecordBuffer) -> None:
        self._wait()  # one row group in flight: bounded memory, and the last one's error surfaces here
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="slobench-parquet")
        self._pending = self._pool.submit(self._write, full)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _write(self, buffer: RecordBuffer) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self.path.unlink(missing_ok=True)  # a previous run's file must not outlive this run's requests.jsonl
            self._writer = pq.ParquetWriter(self.tmp, schema(), **WRITE_OPTIONS)
        if len(buffer):
            self._writer.write_table(buffer.table(), row_group_size=ROW_GROUP)

    def _guard(self, step: Callable[[], None]) -> None:
        import pyarrow as pa

        if self.failed is not None:
            return
        try:
            step()
        except (OSError, pa.ArrowException) as e:
            self.failed = f"{type(e).__name__}: {e}"
            self._buffer = RecordBuffer()
            self.abort()
            print(f"slobench: note: {self.path.name} not written ({self.failed}); {REQUESTS} holds every record",
                  file=sys.stderr)


def write_parquet(run_dir: Path, records: Iterable[RequestRecord]) -> bool:
    """requests.parquet from `records` (e.g. an older run's requests.jsonl read back); True when written."""
    log = ParquetLog(run_dir)
    for rec in records:
        log.add(rec)
    jsonl = Path(run_dir) / REQUESTS
    log.close(jsonl.stat().st_size if jsonl.exists() else 0)
    return log.failed is None


def parquet_problem(run_dir: Path) -> str | None:
    """Why requests.parquet cannot stand for requests.jsonl (None: it can): unreadable (cut short by a crash
    or a copy), or written beside a requests.jsonl of another size (appended to or replaced since)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(run_dir) / PARQUET
    try:
        check_input(path, PARQUET_FILE)  # a FIFO or a device is not opened by Arrow (it would hang or fill memory)
        meta = pq.read_metadata(path)
    except UsageError as e:
        return str(e).removeprefix(f"{path}: ").removeprefix(f"{path} ")
    except (OSError, pa.ArrowException) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    written = _written_int(meta, JSONL_BYTES_KEY)
    if written is None and JSONL_BYTES_KEY in (meta.metadata or {}):
        return f"its metadata's {JSONL_BYTES_KEY.decode()} is not a size"
    jsonl = Path(run_dir) / REQUESTS
    if jsonl.exists() and (written is None or written != jsonl.stat().st_size):
        return f"written beside a {REQUESTS} of {written or -1:,} bytes, which now has {jsonl.stat().st_size:,}"
    arrow_schema = meta.schema.to_arrow_schema()
    if not arrow_schema.equals(file_schema(arrow_schema.names)):
        return "not the columns this slobench writes"
    return None


def _written_int(meta: Any, key: bytes) -> int | None:
    text = (meta.metadata or {}).get(key, b"")
    return int(text) if text.isdigit() and len(text) < 20 else None  # ASCII digits only, never past 64 bits


def written_status_counts(run_dir: Path) -> dict[str, int] | None:
    """The records a requests.parquet's writer put in it, by status (None: an older file that does not say,
    or metadata that is not a {status: count} object)."""
    import pyarrow.parquet as pq

    text = (pq.read_metadata(Path(run_dir) / PARQUET).metadata or {}).get(STATUS_COUNTS_KEY)
    try:
        d = json.loads(text) if text is not None else None
    except ValueError:
        return None
    ok = isinstance(d, dict) and all(isinstance(k, str) and type(n) is int for k, n in d.items())
    return d if ok else None


def file_schema(names: Sequence[str]) -> pa.Schema:
    """The schema a file holding the columns `names` must have: this slobench's, less the `OPTIONAL` columns
    it lacks (an older writer's file)."""
    full = schema()
    present = set(names)
    missing = [i for i, f in enumerate(full) if f.name in OPTIONAL and f.name not in present]
    for i in reversed(missing):
        full = full.remove(i)
    return full


def use_parquet(run_dir: Path) -> bool:
    """Whether readers take requests.parquet: present and sound; a file that is not says so in a note."""
    if not (Path(run_dir) / PARQUET).exists():
        return False
    problem = parquet_problem(run_dir)
    if problem is not None:
        print(f"slobench: note: {Path(run_dir) / PARQUET}: {problem}; reading {REQUESTS}", file=sys.stderr)
    return problem is None


def read_table(run_dir: Path, columns: Sequence[str] | None = None) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(run_dir) / PARQUET
    try:
        present = file_schema(pq.read_schema(path).names)
        wanted = list(schema().names if columns is None else columns)
        table = pq.read_table(path, schema=present, columns=[c for c in wanted if c in present.names])
    except (OSError, pa.ArrowException) as e:
        raise OSError(f"{path}: unreadable ({type(e).__name__}: {e})") from e
    for name in wanted:  # an older file's missing optional columns, all absent
        if name not in present.names:
            field = schema().field(name)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(wanted)


COLUMNS_READ = (*FLOATS, *INTS, *STRINGS, "is_warmup", "chunk_times_s")  # `Columns` has no chunk token counts


def table_columns(table: pa.Table) -> Columns:
    """A table of requests.parquet's columns (`read_table`) as `Columns`, as `read_parquet_columns` reads
    the file."""
    times = sum(len(c.flatten()) for c in table.column("chunk_times_s").chunks)
    return _columns_of_tables([table], table.num_rows, times)


def read_parquet_columns(run_dir: Path) -> Columns:
    """requests.parquet as `Columns`, read a row group at a time (`parquet_problem` has checked its schema):
    its chunk times go straight into one numpy array, so the run's tens of millions of them are held once,
    not also as Arrow arrays being joined. On one thread: on a busy machine Arrow's pool of threads waits
    for cores far longer than the decoding takes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(run_dir) / PARQUET
    try:
        have = set(pq.read_schema(path).names)  # (an older file lacks the OPTIONAL columns)
        f = pq.ParquetFile(path, read_dictionary=[k for k in STRINGS if k in have])  # a run's few distinct strings
        meta = f.metadata
        leaf = next(j for j in range(meta.num_columns) if meta.schema.column(j).path == CHUNK_TIMES_LEAF)
        # the leaf's count of values is one per chunk time plus one per empty list: a bound on the times
        bound = sum(meta.row_group(i).column(leaf).num_values for i in range(meta.num_row_groups))
        groups = (f.read_row_group(i, columns=[c for c in COLUMNS_READ if c in have], use_threads=False)
                  for i in range(meta.num_row_groups))
        return _columns_of_tables(groups, meta.num_rows, bound)
    except (OSError, pa.ArrowException, StopIteration) as e:
        raise OSError(f"{path}: unreadable ({type(e).__name__}: {e})") from e


def _columns_of_tables(tables: Iterable[pa.Table], num_rows: int, num_times: int) -> Columns:
    """`Columns` of tables of requests.parquet's columns, one after another, copied into arrays made once
    (chunk by chunk, straight from Arrow's buffers: no array of a row group's column in between):
    `num_rows` rows in all, and at least `num_times` chunk times. Strings go through their few distinct
    values (`strings_into`)."""
    values = {**{k: np.full(num_rows, np.nan) if k in OPTIONAL else np.empty(num_rows) for k in (*FLOATS, *INTS)},
              **{k: np.empty(num_rows, dtype=object) for k in STRINGS}, "is_warmup": np.empty(num_rows, dtype=bool)}
    flat = np.empty(num_times)
    ends = [np.zeros(1, dtype=np.int64)]
    row = at = 0
    for table in tables:
        for k in (*FLOATS, *INTS, "is_warmup"):
            if k not in table.column_names:  # an OPTIONAL column an older file lacks: left NaN
                continue
            at_row = row
            for chunk in table.column(k).chunks:  # nulls become NaN
                values[k][at_row:at_row + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
                at_row += len(chunk)
        for k in STRINGS:
            if k in table.column_names:  # (an OPTIONAL one an older file lacks stays None)
                strings_into(table.column(k), values[k][row:row + table.num_rows])
        row += table.num_rows
        for chunk in table.column("chunk_times_s").chunks:
            # the list's values through its offsets (flatten() would import pyarrow.compute: 0.1 s)
            offsets = chunk.offsets.to_numpy().astype(np.int64)
            times = chunk.values.to_numpy()[offsets[0]:offsets[-1]]
            if at + len(times) > len(flat):
                raise OSError(f"more chunk times than the file's metadata counts ({at + len(times):,})")
            flat[at:at + len(times)] = times
            ends.append(offsets[1:] - offsets[0] + at)
            at += len(times)
    if row != num_rows:
        raise OSError(f"{row:,} rows where the file's metadata counts {num_rows:,}")
    return Columns(values, flat[:at], np.concatenate(ends))


def strings_into(col: pa.ChunkedArray, out: np.ndarray) -> None:
    """A string column (read as a dictionary or not) into `out`, an object array of Nones, through the
    column's few distinct values."""
    import pyarrow as pa

    if col.null_count == len(col):  # most text columns of most runs (error, finish_reason): nothing to encode
        return
    at = 0
    for chunk in col.chunks:
        encoded = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
        words = np.array(encoded.dictionary.to_pylist() + [None], dtype=object)
        index = encoded.indices.to_numpy(zero_copy_only=False)  # floats, NaN for a null, where there are any
        if index.dtype.kind == "f":
            index = np.where(np.isnan(index), len(words) - 1, index).astype(np.intp)
        np.take(words, index, out=out[at:at + len(chunk)], mode="clip")  # every index is in range
        at += len(chunk)


def read_parquet_records(run_dir: Path) -> list[RequestRecord]:
    """requests.parquet as records (the Python API's `load_run`); the schema checked the types
    (`parquet_problem`)."""
    return [RequestRecord(**d) for d in read_table(run_dir).to_pylist()]
