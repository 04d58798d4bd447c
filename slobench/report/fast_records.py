"""requests.jsonl straight into `RecordArrays` columns, without a RequestRecord per line.

Why: the report must read 100,000 records in well under 10 s. Going through `load_run` builds a
dataclass per line (`from_dict` looks its fields up every time) and `from_records` then runs `np.diff`
once per request; together they cost more than the JSON parsing itself. Here each parsed line goes into
plain column lists; ITL gaps come from `metrics.chunk_gaps`, as for `from_records`. `tests/test_report.py` checks the result equals
`RecordArrays.from_records(load_run(dir).records)` column for column, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import UsageError
from slobench.metrics import RecordArrays, chunk_gaps
from slobench.records import REQUESTS, read_record_dicts
from slobench.summary import error_kinds, lengths_of


@dataclass(frozen=True, slots=True)
class RunColumns:
    arrays: RecordArrays
    error_counts: dict[str, int]
    lengths: dict[str, Any] | None = None  # asked vs delivered lengths (slobench.summary.lengths_of)


def _nan(v: Any) -> float:
    return float("nan") if v is None else float(v)


def read_columns(run_dir: Path) -> RunColumns:
    path = run_dir / REQUESTS
    rows = [d for d in read_record_dicts(path) if not d.get("is_warmup", False)]
    errors = error_kinds(str(d["error"]) for d in rows if d.get("error"))
    try:
        rows = [rows[i] for i in _order(rows)]
        arrays = _columns(rows)
    except (TypeError, ValueError, KeyError) as e:
        raise UsageError(f"{path}: bad value in a request record ({type(e).__name__}: {e})") from None
    lengths = lengths_of((str(d.get("status", "ok")), False, int(d.get("max_tokens") or 0),
                          int(d.get("output_tokens") or 0), int(d.get("input_tokens") or 0), d.get("prompt_tokens"),
                          d.get("usage_output_tokens")) for d in rows)
    return RunColumns(arrays, errors, lengths)


def _order(rows: list[dict[str, Any]]) -> np.ndarray:
    """Arrival order, ties by request id (as RecordArrays.from_records sorts); stable like Python's sort."""
    sched = np.array([float(d["scheduled_s"]) for d in rows], dtype=float)
    rid = np.array([int(d["request_id"]) for d in rows], dtype=np.int64)
    return np.lexsort((rid, sched))


def _columns(rows: list[dict[str, Any]]) -> RecordArrays:
    """`rows` already in arrival order."""
    n = len(rows)

    def col(key: str) -> np.ndarray:
        return np.fromiter((_nan(d.get(key)) for d in rows), float, n)

    status = np.array([d.get("status", "ok") for d in rows], dtype=object)
    is_ok = status == "ok"
    gaps, owners = chunk_gaps([d.get("chunk_times_s") or [] for d in rows], is_ok)
    return RecordArrays(
        request_id=np.fromiter((int(d["request_id"]) for d in rows), np.int64, n),
        scheduled_s=col("scheduled_s"),
        sent_s=col("sent_s"),
        first_token_s=col("first_token_s"),
        done_s=col("done_s"),
        queued_s=np.fromiter((float(d.get("queued_s", 0.0)) for d in rows), float, n),
        output_tokens=np.fromiter((int(d.get("output_tokens", 0)) for d in rows), np.int64, n),
        prompt_tokens=np.fromiter(
            (int(d["prompt_tokens"]) if d.get("prompt_tokens") is not None else int(d.get("input_tokens", 0)) for d in rows),
            np.int64, n,
        ),
        cached_tokens=col("cached_tokens"),
        replica=np.fromiter((-1 if d.get("replica") is None else int(d["replica"]) for d in rows), np.int64, n),
        tag=np.array([str(d.get("tag", "")) for d in rows], dtype=object),
        is_ok=np.asarray(is_ok, dtype=bool),
        status=status,
        itl_s=gaps,
        itl_owner=owners,
    )
