"""Trace loaders: a file of real requests becomes a `Trace` (arrival times, token counts, and what else
the format carries), whatever its format: Azure, BurstGPT, Mooncake, ShareGPT or slobench's own JSONL,
compressed or not. `load_trace` says how each format is read and what becomes of unreadable rows,
zero-token rows, session turns and coarse timestamps."""

from __future__ import annotations

import bz2
import csv
import gzip
import importlib
import io
import json
import lzma
import math
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import SpecError, UsageError
from slobench.input_file import TRACE, open_input
from slobench.workload.bundled import list_traces, trace_path

__all__ = ["FORMATS", "MooncakeSessions", "RowProblem", "Trace", "TraceColumns", "TraceEntry", "compression", "detect_format",
           "load_trace", "may_hold_sessions", "stamp_grid"]

FORMATS = ("azure", "burstgpt", "mooncake", "sharegpt", "slobench")
MOONCAKE_BLOCK_TOKENS = 512
# ShareGPT has no timestamps: conversations start as a Poisson process at this rate, and a next turn comes
# after a think time plus a response estimate. `--rate` / `--time-scale` rescale the whole axis.
SHAREGPT_CONVERSATIONS_RPS = 1.0
SHAREGPT_THINK_S = 5.0
SHAREGPT_S_PER_OUTPUT_TOKEN = 0.02
_HUMAN = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "model"})
_MAX_SHOWN = 5
COARSE_REQUESTS_PER_STAMP = 2.0  # mean requests per distinct stamp from which stamps are read as buckets
_GRID_SHARE = 0.95  # share of gaps between distinct stamps that must be whole multiples of the grid


@dataclass(frozen=True, slots=True)
class TraceEntry:
    arrival_s: float  # trace seconds from the trace's first request, unscaled
    input_tokens: int
    output_tokens: int
    line: int  # where it came from: file line (CSV, JSONL) or item number (ShareGPT JSON), 1-based
    hash_ids: tuple[int, ...] = ()
    prompt: str | tuple[int, ...] | None = None
    session_id: int | None = None
    tag: str = ""


@dataclass(frozen=True, slots=True)
class RowProblem:
    line: int
    why: str
    unit: str = "line"

    def __str__(self) -> str:
        return f"{self.unit} {self.line}: {self.why}"


class TraceColumns(Sequence[TraceEntry]):
    """A loaded trace's entries as numpy columns (times, counts, lines, hash ids flattened), with the rare
    fields (own prompts, sessions, tags) kept only where set: a million Mooncake rows cost tens of MB, not
    the ~1 GB of a TraceEntry each. Indexing builds the entry; `slobench.workload.replay` windows the
    columns and builds only the entries it sends."""

    def __init__(self, arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                 line: np.ndarray, hash_offsets: np.ndarray, hash_ids: np.ndarray, rare: dict[int, tuple[Any, ...]]) -> None:
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.line = line
        self.hash_offsets = hash_offsets  # entry i's hash ids: hash_ids[hash_offsets[i]:hash_offsets[i + 1]]
        self.hash_ids = hash_ids
        self.rare = rare  # entry index -> (prompt, session_id, tag), only where one is set

    def __len__(self) -> int:
        return len(self.arrival_s)

    def entry(self, i: int) -> TraceEntry:
        lo, hi = self.hash_offsets[i], self.hash_offsets[i + 1]
        prompt, session, tag = self.rare.get(i, (None, None, ""))
        return TraceEntry(float(self.arrival_s[i]), int(self.input_tokens[i]), int(self.output_tokens[i]),
                          int(self.line[i]), tuple(self.hash_ids[lo:hi].tolist()), prompt, session, tag)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self.entry(k) for k in range(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"trace entry {i} out of range ({n} entries)")
        return self.entry(i % n)

    def __iter__(self) -> Iterator[TraceEntry]:
        return (self.entry(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


class _Columns:
    """Entries appended one by one into compact arrays (what `load_trace` reads a file into)."""

    def __init__(self) -> None:
        self.arrival_s = array("d")
        self.input_tokens = array("q")
        self.output_tokens = array("q")
        self.line = array("q")
        self.hash_offsets = array("q", [0])
        self.hash_ids = array("q")
        self.rare: dict[int, tuple[Any, ...]] = {}

    def add(self, e: TraceEntry) -> None:
        if e.prompt is not None or e.session_id is not None or e.tag:
            self.rare[len(self.arrival_s)] = (e.prompt, e.session_id, e.tag)
        self.arrival_s.append(e.arrival_s)
        self.input_tokens.append(e.input_tokens)
        self.output_tokens.append(e.output_tokens)
        self.line.append(e.line)
        self.hash_ids.extend(e.hash_ids)
        self.hash_offsets.append(len(self.hash_ids))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def ordered(self, order: np.ndarray, arrival_s: np.ndarray) -> TraceColumns:
        """The entries in `order` (indices into what was added), with their times `arrival_s` (in that order)."""
        offsets = np.frombuffer(self.hash_offsets, dtype=np.int64)
        ids = np.frombuffer(self.hash_ids, dtype=np.int64)
        lengths = np.diff(offsets)[order]
        new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if len(ids):
            starts = offsets[:-1][order]
            pick = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(int(new_offsets[-1]))
            ids = ids[pick]
        if len(ids) and ids.min() >= np.iinfo(np.int32).min and ids.max() <= np.iinfo(np.int32).max:
            ids = ids.astype(np.int32)
        where = np.empty(len(order), dtype=np.int64)
        where[order] = np.arange(len(order))
        return TraceColumns(np.asarray(arrival_s, dtype=np.float64),
                            np.frombuffer(self.input_tokens, dtype=np.int64)[order],
                            np.frombuffer(self.output_tokens, dtype=np.int64)[order],
                            np.frombuffer(self.line, dtype=np.int64)[order], new_offsets, np.array(ids),
                            {int(where[k]): v for k, v in self.rare.items()})


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    format: str
    entries: Sequence[TraceEntry]  # sorted by arrival (stable, so ties keep file order); loaded: TraceColumns
    problems: tuple[RowProblem, ...] = ()
    notes: tuple[str, ...] = ()  # what the loader did that a reader should know (kept in the manifest)
    num_rows: int = 0
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per hash id, when entries carry hash_ids
    num_zero_dropped: int = 0  # readable rows with 0 input or 0 output tokens, left out
    num_zero_kept: int = 0  # such rows kept with their zero counts raised to 1 (keep_zero=True)
    rows: dict[str, Any] = field(default_factory=dict, compare=False)  # RowCounts.report: dropped / altered

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise SpecError("format", self.format, f"must be one of {list(FORMATS)}")
        if not self.entries:
            dropped = (f"; {self.num_zero_dropped} with 0 input or output tokens dropped (--keep-zero-rows "
                       "keeps them)") if self.num_zero_dropped else ""
            raise UsageError(f"{self.path}: no usable requests in {self.num_rows} rows{self._problem_tail()}{dropped}")

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def arrival_s(self) -> np.ndarray:
        if isinstance(self.entries, TraceColumns):
            return self.entries.arrival_s.copy()
        return np.fromiter((e.arrival_s for e in self.entries), np.float64, len(self.entries))

    @property
    def input_tokens(self) -> np.ndarray:
        if isinstance(self.entries, TraceColumns):
            return self.entries.input_tokens.copy()
        return np.fromiter((e.input_tokens for e in self.entries), np.int64, len(self.entries))

    @property
    def output_tokens(self) -> np.ndarray:
        if isinstance(self.entries, TraceColumns):
            return self.entries.output_tokens.copy()
        return np.fromiter((e.output_tokens for e in self.entries), np.int64, len(self.entries))

    @property
    def span_s(self) -> float:
        return self.entries[-1].arrival_s - self.entries[0].arrival_s

    def _first_problems(self) -> str:
        shown = "; ".join(str(p) for p in self.problems[:_MAX_SHOWN])
        more = f" (and {len(self.problems) - _MAX_SHOWN} more)" if len(self.problems) > _MAX_SHOWN else ""
        return shown + more

    def _problem_tail(self) -> str:
        return f"; {len(self.problems)} unreadable: {self._first_problems()}" if self.problems else ""

    def problem_summary(self) -> str:
        """One line for stderr: how many rows could not be read and the first few with their line numbers."""
        if not self.problems:
            return ""
        return (f"{self.path}: skipped {len(self.problems)} unreadable of {self.num_rows} rows: "
                f"{self._first_problems()}")

    def describe(self) -> dict[str, Any]:
        """What a manifest records about the trace."""
        return {
            "path": self.path,
            "format": self.format,
            "num_requests": len(self.entries),
            "num_rows": self.num_rows,
            "num_unreadable": len(self.problems),
            "unreadable_first": [str(p) for p in self.problems[:_MAX_SHOWN]],
            "num_zero_dropped": self.num_zero_dropped,
            "num_zero_kept": self.num_zero_kept,
            "span_s": self.span_s,
            "notes": list(self.notes),
        }


# ---- detection ----------------------------------------------------------------------------------------


def detect_format(path: str | Path) -> str:
    """The trace format, from the first bytes of the file (a CSV header or the first JSON object)."""
    head = _read_head(Path(path))
    stripped = head.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        return "sharegpt"
    if stripped.startswith("{"):
        first = stripped.split("\n", 1)[0]
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            if "conversations" in obj:
                return "sharegpt"
            if "arrival_s" in obj:  # first: converted Mooncake traces keep their hash_ids
                return "slobench"
            if "timestamp" in obj and ("hash_ids" in obj or "input_length" in obj):
                return "mooncake"
    else:
        header = stripped.split("\n", 1)[0].lower()
        if "contexttokens" in header and "generatedtokens" in header:
            return "azure"
        if "request tokens" in header and "response tokens" in header:
            return "burstgpt"
    raise UsageError(
        f"{path}: cannot tell the trace format from its first line; name it with --trace-format "
        f"(one of {', '.join(FORMATS)})"
    )


def may_hold_sessions(path: str | Path, fmt: str | None = None) -> bool:
    """Whether a trace's first rows show a conversation's fields (ShareGPT's conversations, BurstGPT's
    `Session ID` column, a JSONL row's `session_id`, `chat_id` or `parent_chat_id`): a replay whose sessions
    wait for the server then loads it whole. A UsageError where the file cannot be read."""
    file = trace_path(path)
    head = _read_head(file)
    fmt = detect_format(file) if fmt is None else fmt
    if fmt == "sharegpt":
        return True
    if fmt in ("azure", "burstgpt"):
        return "session id" in head.lstrip("\ufeff").split("\n", 1)[0].lower()
    return any(f'"{key}"' in head for key in ("session_id", "chat_id", "parent_chat_id"))


def _read_head(path: Path) -> str:
    try:
        with _open_text(path) as fh:
            return fh.read(65536)
    except FileNotFoundError:
        raise UsageError(f"{path}: trace file not found (bundled samples, named without a path: "
                         f"{', '.join(list_traces()) or 'none'})") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a trace file") from None
    except (OSError, EOFError, lzma.LZMAError) as e:  # a damaged compressed file
        raise UsageError(f"{path}: cannot read the {compression(path)}-compressed file: {e}") from None


_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"PK\x03\x04", "zip"))


def compression(path: str | Path) -> str | None:
    """The compression of a file, from its first bytes: gzip, bz2, xz, zstd, zip, or None."""
    with open_input(path, TRACE) as fh:
        head = fh.read(6)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


class _OwningText(io.TextIOWrapper):
    """Text over a decompressor that also closes the checked file under it: gzip, bz2 and lzma leave the
    file object they are handed open when they close."""

    def __init__(self, raw: Any, source: Any, newline: str | None) -> None:
        super().__init__(raw, encoding="utf-8", errors="replace", newline=newline)
        self._source = source

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source.close()


def _open_text(path: Path, newline: str | None = None) -> io.TextIOBase:
    """The file as text, decompressed on the fly when it is compressed."""
    kind = compression(path)
    if kind not in (None, "gzip", "bz2", "xz", "zstd"):
        raise UsageError(f"{path}: the file is a {kind} archive, not a trace; extract the trace file from it")
    zstandard: Any = None
    if kind == "zstd":
        try:
            zstandard = importlib.import_module("zstandard")
        except ImportError:
            raise UsageError(
                f"{path}: the file is zstd-compressed; reading it needs the `zstandard` package "
                f"(pip install zstandard), or decompress it first (zstd -d {path})"
            ) from None
    source = open_input(path, TRACE)
    raw: Any
    if kind is None:
        raw = source
    elif kind == "gzip":
        raw = gzip.GzipFile(fileobj=source, mode="rb")
    elif kind == "bz2":
        raw = bz2.BZ2File(source, "rb")
    elif kind == "xz":
        raw = lzma.LZMAFile(source, "rb")
    else:
        raw = zstandard.ZstdDecompressor().stream_reader(source, closefd=True)
    return _OwningText(raw, source, newline)


# ---- loading ------------------------------------------------------------------------------------------


def load_trace(path: str | Path, fmt: str | None = None, *, seed: int = 0, spread: bool = True,
               keep_zero: bool = False) -> Trace:
    """Read a trace. `seed` drives what the file leaves open: the spread within a coarse stamp and
    ShareGPT's synthetic arrival times. `spread=False` keeps coarse stamps as they are (every request of a
    stamp at once); `keep_zero=True` keeps rows with 0 input or output tokens.

    Formats (detected from the content, or named):
      azure     Azure LLM inference trace CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`
      burstgpt  BurstGPT CSV: `Timestamp` (seconds), `Model`, `Request tokens`, `Response tokens`, ..., and in
                BurstGPT_3 a `Session ID`: the rows of one session are the turns of one conversation
      mooncake  Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one per 512-token
                block; requests sharing an id share those prompt tokens), and where a row is a conversation's
                turn, `session_id`, or `chat_id` / `parent_chat_id` as Alibaba's Mooncake-style traces link
                turns (`MooncakeSessions`)
      sharegpt  ShareGPT-style JSON: a list of `{"conversations": [{"from": "human"|"gpt", "value": text}]}`;
                one request per human turn, its prompt the conversation so far; lengths counted in words
      slobench  slobench's own JSONL (`slobench workload convert` writes it): one object per line with
                `arrival_s`, `input_tokens`, `max_tokens` and optionally `prompt`, `tag`, `session_id`, `hash_ids`

    Files may be gzip-, bz2- or xz-compressed (read through the standard library) or zstd-compressed (read
    when the `zstandard` package is installed); the compression is told from the first bytes, not the name.

    A row that cannot be read (a missing column, a count that is not a number) is skipped and recorded as a
    `RowProblem` with its line number, so one bad line in a million does not stop a replay; a trace with no
    usable row at all is a `UsageError` (exit 2). A row with 0 input or 0 output tokens is readable but not a
    request as it stands (BurstGPT marks a failed request with 0 response tokens; Azure and Mooncake have
    zero-token rows too): it is dropped and counted, or with `keep_zero=True` kept as the closest request
    that loads the server (0 output tokens -> max_tokens 1, 0 input tokens -> a 1-token prompt), and counted.
    Either way a note says how many.

    Sessions: a later turn of a conversation sends the conversation so far. When a turn's input count is at
    least the previous turn's, it is taken to include that history (replay grows the previous prompt to it);
    when it is smaller it cannot, and the turn is sent with the history: its input becomes the previous
    turn's input + that turn's output + its own count (a note says how many turns and tokens).

    Coarse stamps: when the trace is stamped on a grid much coarser than its requests (at least
    `COARSE_REQUESTS_PER_STAMP` requests per distinct stamp on average, and the distinct stamps on a regular
    grid), each request is spread uniformly (seeded) over its stamp's grid cell instead of firing the cell at
    once; `spread=False` turns that off. A few duplicated stamps in a finely stamped trace are left alone.
    Times in a `Trace` are trace seconds from its first request, unscaled; `slobench.workload.replay` scales,
    windows and turns them into requests.

    `path` may name a bundled sample trace instead (`azure-code-sample`: `slobench.workload.bundled`).
    """
    path = trace_path(path)
    fmt = detect_format(path) if fmt is None else fmt
    if fmt not in FORMATS:
        raise UsageError(f"--trace-format: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    _read_head(path)  # the same not-found / directory messages for every format
    rows = _Columns()
    notes: list[str] = []
    spread_s: float | None = None
    if fmt in ("azure", "burstgpt"):
        parsed: Iterable[TraceEntry | RowProblem] = _csv_rows(path, fmt)
    elif fmt == "sharegpt":
        parsed = _sharegpt_rows(path, seed, notes)
    else:
        parsed = _jsonl_rows(path, fmt)
    counts = RowCounts(fmt, keep_zero)
    try:
        for item in parsed:
            e = counts.admit(item)
            if e is not None:
                rows.add(e)
    except (OSError, EOFError, lzma.LZMAError) as e:  # a damaged compressed file
        raise UsageError(f"{path}: cannot read the {compression(path)}-compressed file: {e}") from None
    none = np.zeros(0, np.int64)
    entries = TraceColumns(np.zeros(0), none, none, none, np.zeros(1, np.int64), none, {})
    if len(rows):
        t = np.frombuffer(rows.arrival_s, dtype=np.float64)
        t = t - t.min()
        order = np.argsort(t, kind="stable")  # ties keep file order
        t = t[order]
        if spread and fmt in _STAMPED:
            t, again, spread_s = _spread_buckets(t, seed, notes)
            order, t = order[again], t[again]
        entries = rows.ordered(order, t)
        del rows
        for i, (prompt, session, _) in sorted(entries.rare.items()):  # sessions' later turns, in arrival order
            if session is not None and prompt is None:
                entries.input_tokens[i] = counts.with_history(entries.entry(i)).input_tokens
    notes += counts.notes()
    report = counts.report(str(path), len(entries), notes, is_whole_file=True, spread_s=spread_s)
    return Trace(str(path), fmt, entries, tuple(counts.problems), tuple(notes), counts.num_rows,
                 num_zero_dropped=0 if keep_zero else counts.num_zero,
                 num_zero_kept=counts.num_zero if keep_zero else 0, rows=report)


_STAMPED = ("azure", "burstgpt", "mooncake")  # slobench JSONL times are exact; ShareGPT's are made up


@dataclass(slots=True)
class RowCounts:
    """A loader's row-by-row bookkeeping, the source of its notes: unreadable rows, zero-token rows (left
    out or raised to 1), and session turns sent with their history (see `load_trace`)."""

    fmt: str
    keep_zero: bool = False
    num_rows: int = 0
    problems: list[RowProblem] = field(default_factory=list)
    num_zero: int = 0
    zero_in: int = 0
    zero_out: int = 0
    last_turn: dict[int, tuple[int, int]] = field(default_factory=dict)  # session -> (input, output)
    num_turns: int = 0
    num_grown: int = 0
    tokens_added: int = 0

    def admit(self, item: TraceEntry | RowProblem) -> TraceEntry | None:
        """The entry to keep for a parsed row, or None (unreadable, or zero tokens and not kept)."""
        self.num_rows += 1
        if isinstance(item, RowProblem):
            self.problems.append(item)
            return None
        if item.input_tokens and item.output_tokens:
            return item
        self.num_zero += 1
        self.zero_in += item.input_tokens == 0
        self.zero_out += item.output_tokens == 0
        if not self.keep_zero:
            return None
        return replace(item, input_tokens=max(item.input_tokens, 1), output_tokens=max(item.output_tokens, 1))

    def with_history(self, e: TraceEntry) -> TraceEntry:
        """`e`, a session's later turn whose count is below the conversation so far, grown to hold it
        (entries in arrival order)."""
        sid = e.session_id
        if sid is None or e.prompt is not None:
            return e
        prev = self.last_turn.get(sid)
        self.num_turns += prev is not None
        if prev is not None and e.input_tokens < prev[0]:
            n_in = prev[0] + prev[1] + e.input_tokens
            self.num_grown += 1
            self.tokens_added += n_in - e.input_tokens
            e = replace(e, input_tokens=n_in)
        self.last_turn[sid] = (e.input_tokens, e.output_tokens)
        return e

    def report(self, path: str, num_requests: int, notes: list[str], *, is_whole_file: bool,
               spread_s: float | None = None, num_late: int = 0) -> dict[str, Any]:
        """What became of the rows read, for summary.json's `trace_rows`: counts of rows dropped and of
        requests altered by kind, and the notes that say why (never "malformed": a row is unreadable, or
        readable but not a request as it stands)."""
        kept = self.num_zero if self.keep_zero else 0
        dropped = {"unreadable": len(self.problems), "zero_tokens": self.num_zero - kept}
        altered = {"zero_tokens_raised_to_1": kept, "sent_with_session_history": self.num_grown,
                   "spread_over_stamp_bucket": num_requests if spread_s else 0,
                   "sent_late_out_of_file_order": num_late}
        return {
            "path": path, "format": self.fmt, "num_rows_read": self.num_rows, "is_whole_file": is_whole_file,
            "num_requests": num_requests, "num_dropped": sum(dropped.values()),
            "num_altered": kept + self.num_grown + altered["spread_over_stamp_bucket"] + num_late,
            "dropped": dropped, "altered": altered,
            "zero_tokens": {"zero_output": self.zero_out, "zero_input": self.zero_in},
            "unreadable_first": [str(p) for p in self.problems[:_MAX_SHOWN]], "notes": list(notes),
        }

    def notes(self) -> list[str]:
        out = []
        if self.num_zero:
            out.append(_zero_note(self.fmt, self.num_rows, self.num_zero, self.zero_in, self.zero_out,
                                  self.keep_zero))
        if self.num_grown:
            out.append(
                f"{self.num_grown} of {self.num_turns} later session turns had fewer input tokens than the "
                "conversation so far: each is sent with the history (previous input + previous output + its "
                f"own), {self.tokens_added} tokens added"
            )
        return out


def _zero_note(fmt: str, num_rows: int, num_zero: int, zero_in: int, zero_out: int, keep: bool) -> str:
    failed = " (failed requests)" if fmt == "burstgpt" else ""
    parts = [f"{zero_out} with 0 output tokens{failed}"] if zero_out else []
    parts += [f"{zero_in} with 0 input tokens"] if zero_in else []
    if keep:
        return (f"kept {num_zero} of {num_rows} rows with zero tokens ({', '.join(parts)}): 0 output tokens are "
                "sent as max_tokens 1, 0 input tokens as a 1-token prompt")
    return (f"left out {num_zero} of {num_rows} rows with zero tokens ({', '.join(parts)}); "
            "--keep-zero-rows sends them as 1-token requests")


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _parse_time(text: str) -> float:
    """Seconds: a plain number, or an ISO date-time (naive ones read as UTC; fractions past µs dropped)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    dt = datetime.fromisoformat(_FRACTION.sub(r"\1", text))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _count(text: object, name: str, *, minimum: int) -> int:
    """A token count from a CSV cell or JSON value: an integer (1234 or "1234" or 1234.0) >= minimum."""
    if isinstance(text, bool):
        raise ValueError(f"{name} is not a number ({text!r})")
    if isinstance(text, str):
        text = text.strip()
        if not text:
            raise ValueError(f"{name} is empty")
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} is not a number ({text!r})") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{name} is not an integer ({text!r})")
    if value < minimum:
        raise ValueError(f"{name} is {int(value)}, must be >= {minimum}")
    return int(value)


_CSV_COLUMNS = {
    # format: (time, input, output, tag or None, session or None)
    "azure": ("timestamp", "contexttokens", "generatedtokens", None, None),
    "burstgpt": ("timestamp", "request tokens", "response tokens", "model", "session id"),
}


def _csv_rows(path: Path, fmt: str) -> Iterator[TraceEntry | RowProblem]:
    t_col, in_col, out_col, tag_col, session_col = _CSV_COLUMNS[fmt]
    sessions: dict[str, int] = {}  # session id text -> int, in order of first appearance
    with _open_text(path, newline="") as fh:
        reader = csv.reader(fh)  # type: ignore[arg-type]
        header = next(reader, None)
        if header is None:
            return
        index = {h.strip().lstrip("\ufeff").lower(): i for i, h in enumerate(header)}
        missing = [c for c in (t_col, in_col, out_col) if c not in index]
        if missing:
            raise UsageError(f"{path}: line 1: {fmt} header lacks column(s) {missing} (got {header})")
        ti, ii, oi = index[t_col], index[in_col], index[out_col]
        gi = index.get(tag_col) if tag_col else None
        si = index.get(session_col) if session_col else None
        width = max(ti, ii, oi, gi or 0, si or 0) + 1
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < width:
                yield RowProblem(line, f"{len(row)} columns, expected at least {width}")
                continue
            try:
                t = _parse_time(row[ti])
                if not math.isfinite(t):
                    raise ValueError(f"time is not finite ({row[ti]!r})")
                n_in = _count(row[ii], header[ii].strip(), minimum=0)
                n_out = _count(row[oi], header[oi].strip(), minimum=0)
            except ValueError as e:
                yield RowProblem(line, str(e))
                continue
            sid = None if si is None or not row[si].strip() else sessions.setdefault(row[si].strip(), len(sessions))
            yield TraceEntry(t, n_in, n_out, line, session_id=sid, tag="" if gi is None else row[gi].strip())


def _jsonl_rows(path: Path, fmt: str) -> Iterator[TraceEntry | RowProblem]:
    sessions = MooncakeSessions()
    with _open_text(path) as fh:
        for line, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
                yield sessions.of(obj, _mooncake_entry(obj, line)) if fmt == "mooncake" else _slobench_entry(obj, line)
            except json.JSONDecodeError as e:
                yield RowProblem(line, f"not JSON ({e.msg} at column {e.colno})")
            except ValueError as e:
                yield RowProblem(line, str(e))


def _hash_ids(obj: dict[str, Any]) -> tuple[int, ...]:
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError(f"hash_ids must be a list of integers (got {str(ids)[:60]})")
    return tuple(ids)


def _mooncake_entry(obj: dict[str, Any], line: int) -> TraceEntry:
    for key in ("timestamp", "input_length", "output_length"):
        if key not in obj:
            raise ValueError(f"missing {key!r}")
    t_ms = obj["timestamp"]
    if isinstance(t_ms, bool) or not isinstance(t_ms, int | float) or not math.isfinite(t_ms):
        raise ValueError(f"timestamp is not a number ({t_ms!r})")
    n_in = _count(obj["input_length"], "input_length", minimum=0)
    n_out = _count(obj["output_length"], "output_length", minimum=0)
    return TraceEntry(t_ms / 1000.0, n_in, n_out, line, _hash_ids(obj))


class MooncakeSessions:
    """The conversation a Mooncake-style row belongs to: its `session_id` (an integer or a string), or, as
    Alibaba's Mooncake-style traces link turns, the conversation of its `parent_chat_id` (a row whose parent is
    -1 or absent, and which others name as parent by its `chat_id`, starts one). Sessions are numbered in order
    of first appearance; the turns of one are its rows in arrival order. A row with neither field is no
    session's (Mooncake's own traces)."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}  # session id text or number -> session
        self.of_chat: dict[Any, int] = {}  # chat_id -> its conversation's session

    def of(self, obj: dict[str, Any], e: TraceEntry) -> TraceEntry:
        sid = obj.get("session_id")
        chat, parent = obj.get("chat_id"), obj.get("parent_chat_id")
        for name, v in (("session_id", sid), ("chat_id", chat), ("parent_chat_id", parent)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | str)):
                raise ValueError(f"{name} must be an integer or a string (got {v!r})")
        if sid is not None:
            session = self.ids.setdefault(sid, len(self.ids))
        elif parent is not None and parent != -1 and str(parent) != "-1":
            if parent not in self.of_chat:  # its first turn left out (unreadable, or before the file)
                self.of_chat[parent] = self.ids.setdefault(("chat", parent), len(self.ids))
            session = self.of_chat[parent]
        elif chat is not None:
            session = self.ids.setdefault(("chat", chat), len(self.ids))
        else:
            return e
        if chat is not None:
            self.of_chat[chat] = session
        return replace(e, session_id=session)


def _slobench_entry(obj: dict[str, Any], line: int) -> TraceEntry:
    if "arrival_s" not in obj:
        raise ValueError("missing 'arrival_s'")
    t = obj["arrival_s"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not (math.isfinite(t) and t >= 0):
        raise ValueError(f"arrival_s must be a number >= 0 (got {t!r})")
    prompt = obj.get("prompt")
    if isinstance(prompt, list):
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in prompt):
            raise ValueError("prompt as a list must hold token ids (integers >= 0)")
        prompt = tuple(prompt)
    elif prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"prompt must be a list of token ids or a string (got {type(prompt).__name__})")
    if "input_tokens" in obj:
        n_in = _count(obj["input_tokens"], "input_tokens", minimum=0)
    elif isinstance(prompt, tuple):
        n_in = len(prompt)
    elif isinstance(prompt, str):
        n_in = len(prompt.split())
    else:
        raise ValueError("missing 'input_tokens' (and no prompt to count)")
    out_key = "max_tokens" if "max_tokens" in obj else "output_tokens"
    if out_key not in obj:
        raise ValueError("missing 'max_tokens'")
    n_out = _count(obj[out_key], out_key, minimum=0)
    session = obj.get("session_id")
    if session is not None and (isinstance(session, bool) or not isinstance(session, int)):
        raise ValueError(f"session_id must be an integer (got {session!r})")
    tag = obj.get("tag", "")
    if not isinstance(tag, str):
        raise ValueError(f"tag must be a string (got {tag!r})")
    return TraceEntry(float(t), n_in, n_out, line, _hash_ids(obj), prompt, session, tag)


def stamp_grid(t: np.ndarray) -> float | None:
    """The width of the buckets a coarsely stamped trace comes in, or None when it is not coarse.

    Coarse: at least `COARSE_REQUESTS_PER_STAMP` requests per distinct stamp on average, and the gaps
    between distinct stamps whole multiples of one width (the most common gap) for `_GRID_SHARE` of them.
    A finely stamped trace with a few duplicates, or a bursty file whose equal stamps are not on a grid,
    is not coarse: its equal stamps are sent at once, as written."""
    distinct = np.unique(t)
    if len(distinct) < 2 or len(t) < COARSE_REQUESTS_PER_STAMP * len(distinct):
        return None
    gaps = np.diff(distinct)
    values, counts = np.unique(np.round(gaps, 6), return_counts=True)
    width = float(values[np.argmax(counts)])
    if width <= 0:
        return None
    ratio = gaps / width
    on_grid = np.abs(ratio - np.round(ratio)) <= 1e-3 * np.maximum(ratio, 1.0)
    return width if on_grid.mean() >= _GRID_SHARE else None


def _spread_buckets(t: np.ndarray, seed: int, notes: list[str]) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Spread requests that share a coarse stamp uniformly (seeded) over their bucket: the new times (in
    the order given), the order that sorts them (stable), and the bucket width (None: not coarse, times
    as they were).

    Some traces stamp arrivals in coarse buckets (seconds apart); firing a whole bucket in one
    instant would be a burst the real system never saw. A request at stamp t moves to t + U[0, width)."""
    width = stamp_grid(t)
    if width is None:
        return t, np.arange(len(t)), None
    num_stamps = len(np.unique(t))
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x6D6F6F6E,)))
    new_t = t + rng.random(len(t)) * width
    notes.append(
        f"timestamps come in {width:g} s buckets (a regular grid; {len(t)} requests on {num_stamps} stamps, "
        f"{len(t) / num_stamps:.1f} per stamp): each request was spread uniformly over its bucket (seed {seed}) "
        "instead of firing the bucket at once; --no-spread keeps the stamps"
    )
    spread = t + (new_t - t)  # each time moved by its draw, as a shift by the difference
    return spread, np.argsort(spread, kind="stable"), width


# ---- ShareGPT -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    prompt: str
    input_words: int
    output_words: int


@dataclass(slots=True)
class _Conversation:
    item: int
    turns: list[_Turn] = field(default_factory=list)


def _load_json_items(path: Path) -> list[Any]:
    with _open_text(path) as fh:
        text = fh.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        # JSONL of conversations: one per line; a bad line is one malformed item.
        items: list[Any] = []
        for line, t in enumerate(text.splitlines(), 1):
            if t.strip():
                try:
                    items.append(json.loads(t))
                except json.JSONDecodeError as e:
                    items.append(RowProblem(line, f"not JSON ({e.msg})"))
        return items
    return doc if isinstance(doc, list) else [doc]


def _conversation(obj: Any, item: int) -> _Conversation:
    if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
        raise ValueError("expected an object with a 'conversations' list")
    conv = _Conversation(item)
    history: list[str] = []
    pending: str | None = None
    for msg in obj["conversations"]:
        if not isinstance(msg, dict) or not isinstance(msg.get("value"), str):
            raise ValueError("each message needs 'from' and a string 'value'")
        who = str(msg.get("from", msg.get("role", ""))).lower()
        if who in _HUMAN:
            pending = msg["value"]
        elif who in _ASSISTANT and pending is not None:
            prompt = "\n".join([*history, pending])
            n_out = len(msg["value"].split())
            conv.turns.append(_Turn(prompt, len(prompt.split()), n_out))
            history += [pending, msg["value"]]
            pending = None
        elif who not in _ASSISTANT and who not in ("system",):
            raise ValueError(f"unknown speaker {who!r}")
    usable = [t for t in conv.turns if t.input_words >= 1 and t.output_words >= 1]
    if not usable:
        raise ValueError("no human turn followed by a non-empty answer")
    conv.turns = usable
    return conv


def _sharegpt_rows(path: Path, seed: int, notes: list[str]) -> Iterator[TraceEntry | RowProblem]:
    items = _load_json_items(path)
    convs: list[_Conversation] = []
    for i, obj in enumerate(items, 1):
        if isinstance(obj, RowProblem):
            yield obj
            continue
        try:
            convs.append(_conversation(obj, i))
        except ValueError as e:
            yield RowProblem(i, str(e), unit="item")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x73676174,)))
    starts = np.cumsum(rng.standard_exponential(len(convs)) / SHAREGPT_CONVERSATIONS_RPS)
    for sid, (conv, t) in enumerate(zip(convs, starts.tolist(), strict=True)):
        for turn in conv.turns:
            yield TraceEntry(t, turn.input_words, turn.output_words, conv.item, prompt=turn.prompt,
                             session_id=sid)
            t += SHAREGPT_THINK_S + SHAREGPT_S_PER_OUTPUT_TOKEN * turn.output_words
    if convs:
        notes.append(
            f"ShareGPT has no timestamps: conversations start as a Poisson process at "
            f"{SHAREGPT_CONVERSATIONS_RPS:g}/s (seed {seed}); each next turn comes "
            f"{SHAREGPT_THINK_S:g} s + {SHAREGPT_S_PER_OUTPUT_TOKEN * 1e3:g} ms per answer word after the "
            "previous one. Token counts are word counts (no tokenizer)."
        )
