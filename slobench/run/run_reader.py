"""The one reader of a run directory's records, and the rules they meet however they are read.

requests.parquet is read where it is sound and agrees with requests.jsonl beside it, else requests.jsonl,
with a note naming what is wrong with the Parquet file. Both are held to the same rules (`columns_problem`,
whole columns at once: tens of milliseconds for a million records): every record with a request id and a
scheduled time, every time finite, no negative count, a status slobench writes. A run with no readable
record is an error naming the file, never a summary of nothing.

Whether the Parquet file agrees with the JSON lines is checked without parsing the JSON lines whole (that
would cost more than the Parquet saves): requests.jsonl's size as the writer recorded it (`parquet_problem`),
the records by status as the writer counted them, and requests.jsonl's first and last records against the
Parquet file's first and last rows.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from orjson import loads as orjson_loads

from slobench.errors import UsageError
from slobench.input_file import RECORDS, open_input
from slobench.run.columnar import (
    FLOATS,
    PARQUET,
    Columns,
    columns_of_rows,
    parquet_problem,
    read_parquet_columns,
    written_status_counts,
)
from slobench.run.records import REQUESTS, read_record_dicts, record_problem

STATUSES = ("ok", "error", "timeout", "cancelled")
COUNTS = ("request_id", "input_tokens", "prompt_tokens", "cached_tokens", "output_tokens", "usage_output_tokens",
          "max_tokens", "replica")
MAX_LINE_BYTES = 64 << 20  # an end record longer than this is not compared (a record is ~1 KB, ~2 MB at most)
COMPARED = ("request_id", "scheduled_s", "status", "output_tokens")  # what an end record and row must share


def read_run_columns(run_dir: Path) -> Columns:
    """A run directory's records as `Columns`: requests.parquet where it is sound and agrees with
    requests.jsonl (`parquet_columns`), else requests.jsonl's lines (its torn-last-line rule); UsageError (exit
    2) naming requests.jsonl and the record where it breaks a rule, or where it holds no record."""
    run_dir = Path(run_dir)
    c = parquet_columns(run_dir)
    if c is not None and len(c):  # none: requests.jsonl says why (empty, cut short)
        return c
    path = run_dir / REQUESTS
    rows = read_record_dicts(path)
    if not rows:
        raise UsageError(f"{path}: {'no' if path.exists() else 'missing, so no'} readable request record (empty, or "
                         "one line cut short): nothing to summarise")
    try:
        c = columns_of_rows(rows, dict.get)
    except (TypeError, ValueError, OverflowError):
        c = None
    if c is None or (problem := columns_problem(c)) is not None:
        for i, d in enumerate(rows, 1):  # the line's own words where they name it better (types)
            if (line_problem := record_problem(d)) is not None:
                raise UsageError(f"{path}: record {i}: {line_problem}")
        if c is None:
            raise UsageError(f"{path}: a request record's values do not make columns")
        raise UsageError(f"{path}: {problem}")
    return c


def parquet_columns(run_dir: Path) -> Columns | None:
    """requests.parquet as `Columns` where it is present, sound, meets the rules and agrees with
    requests.jsonl; else None, with a note naming the problem where the file is there."""
    path = Path(run_dir) / PARQUET
    if not os.path.lexists(path):
        return None
    problem = parquet_problem(run_dir)
    c = None
    if problem is None:
        try:
            c = read_parquet_columns(run_dir)
        except OSError as e:  # a damaged page the footer did not show
            problem = str(e).removeprefix(f"{path}: ")
    if c is not None:
        counts = status_counts(c)
        problem = columns_problem(c, counts) or parquet_disagreement(run_dir, c, counts)
    if problem is None:
        return c
    print(f"slobench: note: {path}: {problem}; reading {REQUESTS}", file=sys.stderr)
    return None


def columns_problem(c: Columns, counts: dict[str, int] | None = None) -> str | None:
    """The first rule a record of `c` breaks, as "record N: ..." (N from 1, in file order), or None.
    `counts`: `status_counts(c)` where the caller has them."""
    v = c.values
    for k in ("request_id", "scheduled_s"):
        if (bad := np.flatnonzero(np.isnan(v[k]))).size:
            return f"record {bad[0] + 1}: missing {k!r}"
    for k in FLOATS:
        if not np.isfinite(np.nansum(v[k])) and (bad := np.flatnonzero(np.isinf(v[k]))).size:
            return f"record {bad[0] + 1}: {k} must be a finite number (got {v[k][bad[0]]})"
    for k in COUNTS:
        if (bad := np.flatnonzero(v[k] < 0)).size:
            return f"record {bad[0] + 1}: {k} must be >= 0 (got {_num(v[k][bad[0]])})"
    times = c.chunk_times_s
    if not np.isfinite(times.sum()):
        at = int(np.flatnonzero(~np.isfinite(times))[0])
        i = int(np.searchsorted(c.chunk_offsets, at, side="right")) - 1
        return f"record {i + 1}: chunk_times_s must be finite numbers (got {times[at]})"
    if unknown := [s for s in counts or status_counts(c) if s not in STATUSES]:
        i = int(np.flatnonzero(v["status"] == unknown[0])[0])
        return f"record {i + 1}: status must be one of {', '.join(STATUSES)} (got {unknown[0]!r:.40})"
    return None


def status_counts(c: Columns) -> dict[str, int]:
    """Records by status (an absent status is "ok", as the readers take it)."""
    counts = Counter(c.values["status"].tolist())
    if None in counts:
        counts["ok"] += counts.pop(None)
    return dict(counts)


def parquet_disagreement(run_dir: Path, c: Columns, counts: dict[str, int]) -> str | None:
    """Where requests.parquet's records `c` (`counts` of them by status) and requests.jsonl beside it
    disagree (see the module doc), or None."""
    written = written_status_counts(run_dir)
    if written is not None and written != counts:
        return f"holds {_said(counts)} where its writer wrote {_said(written)}"
    jsonl = Path(run_dir) / REQUESTS
    if not jsonl.exists():
        return None  # the Parquet file alone: nothing to compare
    ends = _end_records(jsonl)
    if ends is None:
        return None
    if not len(c):
        return f"holds no record where {REQUESTS} holds some" if ends else None
    if not ends:
        return f"holds {len(c):,} records where {REQUESTS} holds none"
    for which, row, d in (("first", 0, ends[0]), ("last", len(c) - 1, ends[-1])):
        for k in COMPARED:
            mine, theirs = c.values[k][row], d.get(k)
            if not _same(mine, theirs, k):
                return f"its {which} record's {k} is {_num(mine)!r:.40} where {REQUESTS}'s is {theirs!r:.40}"
    return None


def _same(mine: Any, theirs: Any, key: str) -> bool:
    if key == "status":
        return (mine or "ok") == (theirs or "ok")
    if theirs is None or isinstance(theirs, bool) or not isinstance(theirs, int | float):
        return theirs is None and bool(np.isnan(mine))
    return float(mine) == float(theirs)


def _end_records(path: Path) -> list[dict[str, Any]] | None:
    """requests.jsonl's first and last records ([] where it holds none; None where a line is too long to
    compare or is not a record: the full reader says so where it matters)."""
    with open_input(path, RECORDS) as fh:
        first = fh.readline(MAX_LINE_BYTES)
        size = os.fstat(fh.fileno()).st_size
        tail = b""
        at = size
        while at > 0 and tail.count(b"\n") < 2 and len(tail) < MAX_LINE_BYTES:
            step = min(at, 1 << 16)
            at -= step
            fh.seek(at)
            tail = fh.read(step) + tail
    lines = [x for x in (first, *tail.splitlines()[-1:]) if x.strip()]
    if not lines:
        return []
    try:
        ds = [orjson_loads(x) for x in lines]
    except ValueError:
        return None
    return ds if all(isinstance(d, dict) for d in ds) else None


def _num(x: Any) -> Any:
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _said(counts: dict[str, int]) -> str:
    return ", ".join(f"{s} {n:,}" for s, n in sorted(counts.items())) or "no records"
