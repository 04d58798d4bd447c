"""The one way slobench opens a file that a user or a repository supplies: baselines, a run directory's files,
workload and SLO TOMLs, traces, profiles, spec files, tokenizers.

Such a file is read only where it is a regular file once symlinks are resolved (a FIFO, a device such as
`/dev/zero`, a socket or a directory is refused by name), and no larger than its kind's cap, named in the
message. It is opened with O_NONBLOCK and checked with fstat on the open descriptor before any byte is read,
so a FIFO cannot hang the reader, and the checked file is the one read (no window between a check and an
open). A reader reads at most the cap and one byte more, so a file that grows while read (or a /proc file
that reports size 0) is held to the cap too. Every refusal is a UsageError (exit 2).
"""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from slobench.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class InputKind:
    """What a file is, for its messages, and the most bytes slobench reads of one."""

    name: str
    max_bytes: int

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1 (got {self.max_bytes!r})")


# A run's summary, manifest, sweep.json, capacity.json, a gate baseline: a sweep of a hundred rates is ~5 MB.
JSON_DOC = InputKind("JSON result file", 256 * MiB)
# requests.jsonl: 1.2 KB a record, a few KB with long answers; a ten-million-request run fits.
RECORDS = InputKind("request records file", 64 * GiB)
PARQUET = InputKind("requests.parquet", 32 * GiB)
SERVER_METRICS = InputKind("server metrics file", 8 * GiB)
# Hand-written settings: workload specs, SLO tables, profile and published-figure files, history lines.
SETTINGS = InputKind("settings file", 16 * MiB)
HISTORY = InputKind("history file", 1 * GiB)
TRACE = InputKind("trace", 256 * GiB)  # streamed row by row, never held whole; the cap is on the file as stored
TOKENIZER = InputKind("tokenizer.json", 1 * GiB)
PROFILE_TABLE = InputKind("profile table", 1 * GiB)  # a Vidur CSV of per-layer times

_WHAT = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refusal(path: Path, kind: InputKind, mode: int) -> str:
    what = next((w for test, w in _WHAT if test(mode)), "not a regular file")
    via = ""
    if path.is_symlink():
        via = f" (a symlink to {os.path.realpath(path)})"
    return f"{path}{via} is {what}, not a regular file (a {kind.name} must be one)"


def open_input(path: str | Path, kind: InputKind) -> IO[bytes]:
    """`path` opened for reading in binary, checked first (see the module doc). FileNotFoundError and other
    OSErrors of the open itself propagate for the caller to word (a missing run file, a missing trace)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(_refusal(path, kind, st.st_mode))
        if st.st_size > kind.max_bytes:
            raise UsageError(too_large(path, kind, st.st_size))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def too_large(path: Path | str, kind: InputKind, size: int | None = None) -> str:
    got = f"{size:,} bytes" if size is not None else "more"
    return f"{path}: {got}, over the {_size(kind.max_bytes)} a {kind.name} may hold; not read"


def _size(n: int) -> str:
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def read_input_bytes(path: str | Path, kind: InputKind) -> bytes:
    """The whole of `path` (`open_input`), at most `kind.max_bytes`."""
    with open_input(path, kind) as fh:
        size = os.fstat(fh.fileno()).st_size
        parts = [fh.read(size + 1)]
        num_read = len(parts[0])
        while num_read > size:  # it grew since, or its size is not what the kernel reports (/proc)
            more = fh.read(MiB)
            if not more:
                break
            parts.append(more)
            num_read += len(more)
            if num_read > kind.max_bytes:
                raise UsageError(too_large(path, kind))
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_input_text(path: str | Path, kind: InputKind) -> str:
    """`read_input_bytes` as UTF-8 text; UsageError naming the file and the byte where it is not UTF-8."""
    data = read_input_bytes(path, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start})") from None


def check_input(path: str | Path, kind: InputKind) -> Path:
    """`path`, checked as `open_input` checks it, for a library that opens the file itself (a tokenizer)."""
    with open_input(path, kind):
        return Path(path)

