"""The run directory: its files' names, and the reader and writer of each (requests.jsonl's lines are
`slobench.run.records`').

  manifest.json        written at start: schema version, slobench version, workload, seed, target, SLO, clock anchor
  requests.jsonl       one record a line as each request finishes
  requests.parquet     written at the end: the same records as columns (`slobench.run.columnar`)
  server_metrics.jsonl optional: scraped Prometheus samples over time
  summary.json         written at the end (also after Ctrl-C): a `RunSummary`
A sweep directory adds sweep.json (its rates, their run directories and summaries, the headline); a capacity
search adds capacity.json (its probes, replicates and interval).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from orjson import loads as orjson_loads

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.errors import WRITE_FAILURES, ResultsNotWritten, SlobenchError, UsageError
from slobench.input_file import JSON_DOC, read_input_bytes
from slobench.input_file import SERVER_METRICS as SERVER_METRICS_FILE
from slobench.run.columnar import ParquetLog, read_parquet_records
from slobench.run.records import (
    REQUESTS,
    RequestRecord,
    read_jsonl,
    read_jsonl_every,
    read_records,
    write_records,
)
from slobench.run.run_reader import parquet_columns

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
SERVER_METRICS = "server_metrics.jsonl"
SWEEP = "sweep.json"
CAPACITY = "capacity.json"
BASELINE = "baseline.json"  # a gate baseline (`slobench.gate`), beside or instead of the results


def replace_whole(path: Path, write: Callable[[Path], object], kept: str = "") -> None:
    """`path` replaced by what `write` puts in a file beside it, or left as it was: ResultsNotWritten (exit 6)
    where the disk refuses, its message ending with `kept` (what the user still has)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno not in WRITE_FAILURES:
            raise
        raise ResultsNotWritten(f"{path}: cannot write ({e.strerror or e}){kept}") from None
    except BaseException:  # an interrupt or a bug while writing: no half file left beside the whole one
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """`path` replaced whole, or left as it was (`replace_whole`)."""
    # NaN and infinities are not JSON: an empty metric is null, so every reader can parse the file
    text = json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False) + "\n"
    replace_whole(path, lambda tmp: tmp.write_text(text))


def _finite(o: Any) -> Any:
    if hasattr(o, "to_dict") and not isinstance(o, dict):  # a RunSummary (or any typed section): its JSON form
        return _finite(o.to_dict())
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and not hasattr(o, "__len__"):  # a numpy scalar
        return _finite(o.item())
    return o


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalar
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class RunWriter:
    """Writes a run directory as the run goes: each record reaches the file (the OS's page cache) when it
    finishes, so a SIGKILL loses only the requests in flight. Flushing per line costs ~7 us a record
    (100k records of 1.2 KB: 0.95 s flushed against 0.21 s through a 64 KiB buffer), small beside the
    ~0.7 ms that serialising a record takes. The records also go to requests.parquet (`ParquetLog`), moved
    into place by `finish`."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any],
                 on_error: Callable[[ResultsNotWritten], None] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        self.on_error = on_error  # told once, at the first record that cannot be written (the runner stops)
        self.error: ResultsNotWritten | None = None
        self.num_written = 0  # records in requests.jsonl: the first `num_written` the run finished
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.run_dir / MANIFEST, self.manifest)
            self._fh: IO[str] | None = open(self.run_dir / REQUESTS, "w", buffering=1 << 16)
        except OSError as e:
            if e.errno not in WRITE_FAILURES:
                raise
            raise ResultsNotWritten(f"{self.run_dir}: cannot write ({e.strerror or e}); nothing was sent") from None
        self._parquet = ParquetLog(self.run_dir)

    def update_manifest(self, extra: dict[str, Any]) -> None:
        self.manifest.update(extra)
        write_json_atomic(self.run_dir / MANIFEST, self.manifest)

    def write(self, rec: RequestRecord) -> None:
        if self.error is not None:
            return  # past a failed write nothing more is written: the run is stopping
        assert self._fh is not None, "RunWriter already closed"
        try:
            self._fh.write(rec.to_json() + "\n")
            self._fh.flush()  # line by line: a crash can tear only the last line, which readers forgive
        except OSError as e:
            if e.errno not in WRITE_FAILURES:
                raise
            self._failed(e)
            return
        self.num_written += 1
        self._parquet.add(rec)

    def _failed(self, e: OSError) -> None:
        self.error = ResultsNotWritten(
            f"{self.run_dir / REQUESTS}: cannot write ({e.strerror or e}): the run stopped sending; the "
            f"{self.num_written} records written before are kept")
        with contextlib.suppress(OSError):  # the buffer cannot reach the disk either: the file is closed
            if self._fh is not None:
                self._fh.close()
        self._fh = None
        self._parquet.abort()  # requests.jsonl holds what was written; a Parquet copy is not made of it here
        if self.on_error is not None:
            self.on_error(self.error)

    def rewrite(self, records: Sequence[RequestRecord]) -> None:
        """Replace requests.jsonl with `records` (atomically), e.g. once the warm-up cut is known."""
        self._close_jsonl()
        replace_whole(self.run_dir / REQUESTS, lambda tmp: write_records(tmp, records), "; it is kept as written")
        self._parquet.abort()
        self._parquet = ParquetLog(self.run_dir)
        for rec in records:
            self._parquet.add(rec)

    def flush(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
            except OSError as e:
                if e.errno not in WRITE_FAILURES:
                    raise
                self._failed(e)

    def finish(self, summary: RunSummary | Mapping[str, Any]) -> None:
        """`close`, then write summary.json (`write_summary`)."""
        self.close()
        write_summary(self.run_dir, summary)

    def close(self) -> None:
        """Close requests.jsonl and move requests.parquet into place: the records are final, and
        `read_columns(run_dir)` reads them column by column (a summary made from the files on disk)."""
        self._close_jsonl()
        if not self._parquet.closed:
            self._parquet.close((self.run_dir / REQUESTS).stat().st_size)

    def _close_jsonl(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as e:
                if e.errno not in WRITE_FAILURES:
                    raise
                self._fh = None
                self._failed(e)
            self._fh = None


@dataclass(slots=True)
class Run:
    """A run directory read back."""

    run_dir: Path
    manifest: dict[str, Any]
    records: list[RequestRecord]
    summary: RunSummary | None


def read_json(path: Path) -> Any:
    """A JSON file slobench wrote, parsed; UsageError (exit 2) naming the file and what is wrong with it:
    missing, not a regular file or over its cap (`slobench.input_file`), unreadable, not UTF-8, not JSON
    (truncated, garbage), nested past reason."""
    try:
        return json.loads(read_input_bytes(path, JSON_DOC).decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except FileNotFoundError:
        raise UsageError(f"{path}: missing (is this a slobench run directory?)") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); not a file slobench wrote") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    except RecursionError:
        raise UsageError(f"{path}: not valid JSON (nested too deep)") from None
    except ValueError as e:  # json.JSONDecodeError, and an integer of more than 4,300 digits
        raise UsageError(f"{path}: not valid JSON ({e}); is it truncated?") from None


# slobench writes no NaN or infinity (write_json_atomic) and no integer past 64 bits: such a value is damage
MAX_INT = 2**63


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:20]} out of range")
    return v


def _bounded_int(text: str) -> int:
    v = int(text)
    if not -MAX_INT <= v < MAX_INT:
        raise ValueError(f"integer {text[:20]}... out of range")
    return v


def check_schema(path: Path | str, doc: Any, key: str = "schema_version") -> dict[str, Any]:
    """A result file's top level checked: a JSON object whose `key` is the schema version this slobench
    reads (manifest, summary, sweep, capacity and baseline files; history lines say `schema`)."""
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object at the top, got {_json_type(doc)}")
    if key not in doc:
        raise UsageError(f"{path}: no {key} (a file slobench did not write?); this slobench reads {key} "
                         f"{SCHEMA_VERSION}")
    v = doc[key]
    if type(v) is not int or v != SCHEMA_VERSION:
        newer = " (written by a newer slobench?)" if type(v) is int and v > SCHEMA_VERSION else ""
        raise UsageError(f"{path}: {key} {v!r}{newer}, this slobench reads {SCHEMA_VERSION}")
    return doc


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(v), "a number")


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's manifest, checked: a directory, valid JSON, the schema version this slobench reads."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory")
    return check_manifest(run_dir / MANIFEST, check_schema(run_dir / MANIFEST, read_json(run_dir / MANIFEST)))


# What the readers of a manifest take from it (the gate, the history, summarize, the report), by type.
_MANIFEST_OBJECTS = ("slo", "options", "target", "clock", "trace_rows", "clock_sync")
_MANIFEST_TEXTS = ("workload_name", "slobench_version")


def check_manifest(where: Path | str, m: Any) -> dict[str, Any]:
    """A run's manifest (manifest.json, or the one a sweep.json or capacity.json holds) checked field by
    field where its readers rely on a type; UsageError naming the file and the field otherwise."""
    if not isinstance(m, dict):
        raise UsageError(f"{where}: the manifest must be a JSON object (got {_json_type(m)})")
    problem = None
    for key in _MANIFEST_OBJECTS:
        if m.get(key) is not None and not isinstance(m[key], dict):
            problem = f"{key} must be an object (got {m[key]!r:.40})"
    for key in _MANIFEST_TEXTS:
        if m.get(key) is not None and not isinstance(m[key], str):
            problem = f"{key} must be text (got {m[key]!r:.40})"
    if m.get("workload") is not None and not isinstance(m["workload"], dict | str):
        problem = f"workload must be an object (got {m['workload']!r:.40})"
    seed = m.get("seed")
    if seed is not None and (type(seed) is not int or seed < 0):
        problem = f"seed must be an integer >= 0 (got {seed!r:.40})"
    rate = m.get("rate_rps")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0):
        problem = f"rate_rps must be a number > 0 (got {rate!r:.40})"
    if problem is None and m.get("slo") is not None:
        try:
            SLO.from_dict(m["slo"])
        except (SlobenchError, TypeError, ValueError, KeyError, AttributeError) as e:
            problem = f"slo: {e}"
    if problem is not None:
        raise UsageError(f"{where}: manifest {problem}")
    return m


def write_summary(run_dir: str | Path, summary: RunSummary | Mapping[str, Any]) -> None:
    """summary.json: a `RunSummary` (or its dict) with the schema version."""
    doc = summary.to_dict() if isinstance(summary, RunSummary) else dict(summary)
    write_json_atomic(Path(run_dir) / SUMMARY, {"schema_version": SCHEMA_VERSION, **doc})


def read_summary(run_dir: str | Path) -> RunSummary | None:
    """A run directory's summary.json as a `RunSummary`, or None where the run has none yet (a run cut off
    before its end)."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None
    doc = check_schema(path, read_json(path))
    try:
        return RunSummary.from_dict(doc)
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None


def _is_scrape(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("t_s"), int | float) and not isinstance(d.get("t_s"), bool)
            and isinstance(d.get("samples"), dict)
            and set(map(type, d["samples"].values())) <= _NUMBER_TYPES)  # type(): a bool is no number here


_NUMBER_TYPES = {int, float}


def read_server_metrics(path: str | Path) -> list[dict[str, Any]]:
    """server_metrics.jsonl (the file, or the run directory holding it): one `{"t_s": run seconds, "samples":
    {series: value}}` a scrape."""
    p = Path(path)
    p = p / SERVER_METRICS if p.is_dir() else p
    return read_jsonl(p, "server metrics line", _is_scrape, _loads_scrape, SERVER_METRICS_FILE)


def read_server_metrics_every(path: str | Path, at_most: int) -> tuple[list[dict[str, Any]], int]:
    """Every k-th scrape of server_metrics.jsonl, at most `at_most` of them, and how many it holds
    (`records.read_jsonl_every`: only the scrapes returned are parsed)."""
    p = Path(path)
    p = p / SERVER_METRICS if p.is_dir() else p
    return read_jsonl_every(p, "server metrics line", _is_scrape, _loads_scrape, at_most, SERVER_METRICS_FILE)


def _loads_scrape(line: str) -> Any:
    try:
        return orjson_loads(line)
    except ValueError:  # a Prometheus value may be NaN, which orjson refuses and the standard library reads
        return json.loads(line)


def write_sweep(out_dir: str | Path, doc: dict[str, Any]) -> None:
    """sweep.json: `{"kind": "sweep", "manifest", "runs": [{"rate_rps", "run_dir", "summary"}], "headline"}`
    (summaries as `RunSummary` or their dicts), written whole and atomically after every rate."""
    write_json_atomic(Path(out_dir) / SWEEP, {"schema_version": SCHEMA_VERSION, "kind": "sweep", **doc})


def read_sweep(sweep_dir: str | Path) -> dict[str, Any]:
    """sweep.json read and checked (`check_sweep`)."""
    path = Path(sweep_dir) / SWEEP
    return check_sweep(path, check_schema(path, read_json(path)))


def check_sweep(path: Path, doc: dict[str, Any], *, run_dirs: bool = True) -> dict[str, Any]:
    """sweep.json's fields checked: each run with a rate > 0, its run directory (unless `run_dirs` is False:
    the gate reads only the summaries) and its summary an object, and the manifest (`check_manifest`)."""
    rows = doc.get("runs")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "rate_rps" in r and ("run_dir" in r or not run_dirs)
                                             for r in rows):
        raise UsageError(f"{path}: expected {{'runs': [{{'rate_rps': ..., 'run_dir': ...}}, ...]}}")
    for r in rows:
        if isinstance(r["rate_rps"], bool) or not isinstance(r["rate_rps"], int | float) or not r["rate_rps"] > 0:
            raise UsageError(f"{path}: rate_rps {r['rate_rps']!r} is not a number > 0")
        if not isinstance(r.get("summary", {}), dict) or not isinstance(r.get("run_dir", ""), str):
            raise UsageError(f"{path}: a run's summary must be an object and its run_dir a name")
    check_manifest(path, doc.get("manifest", {}))
    return doc


def write_capacity(out_dir: str | Path, doc: dict[str, Any]) -> None:
    """capacity.json: a capacity search's document (`slobench.experiments.capacity.capacity_document`)."""
    write_json_atomic(Path(out_dir) / CAPACITY, {"schema_version": SCHEMA_VERSION, **doc})


def read_capacity(search_dir: str | Path) -> dict[str, Any]:
    """capacity.json read and checked (`check_capacity`)."""
    path = Path(search_dir) / CAPACITY
    return check_capacity(path, check_schema(path, read_json(path)))


def check_capacity(path: Path, doc: dict[str, Any], *, run_dirs: bool = True) -> dict[str, Any]:
    """capacity.json's fields checked: every probe with its rate, seed and (unless `run_dirs` is False: the
    gate reads none) run directory; the capacity, its interval and replicates numbers; the manifest's."""
    try:
        for r in doc["probes"]:
            float(r["rate_rps"]), int(r["seed"]), str(r["run_dir"]) if run_dirs else None
        for r in doc.get("replicates") or []:
            int(r["seed"])
            _num_or_none(r.get("capacity_rps"))
        _num_or_none(doc.get("capacity_rps"))
        interval = doc.get("interval_rps")
        if interval is not None and not (isinstance(interval, list) and len(interval) == 2):
            raise TypeError(f"interval_rps must be [low, high] (got {interval!r:.40})")
        for v in interval or ():
            _num_or_none(v)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise UsageError(f"{path}: expected probes with rate_rps, seed and run_dir, and numbers for the capacity "
                         f"({type(e).__name__}: {e})") from None
    check_manifest(path, doc.get("manifest", {}))
    return doc


def _num_or_none(v: Any) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise TypeError(f"expected a number (got {v!r:.40})")


def load_run(run_dir: str | Path) -> Run:
    """A run directory read back: its manifest (checked), its records (from requests.parquet where it is
    sound, else requests.jsonl checked line by line) and its summary."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    records = None
    if parquet_columns(run_dir) is not None:  # sound, within the rules, agreeing with requests.jsonl
        try:
            records = read_parquet_records(run_dir)
        except OSError as e:  # a damaged page the footer did not show
            print(f"slobench: note: {e}; reading {REQUESTS}", file=sys.stderr)
    if records is None:
        records = read_records(run_dir / REQUESTS)
    return Run(run_dir, manifest, records, read_summary(run_dir))


def rate_dir_name(rate_rps: float) -> str:
    """A sweep point's run directory inside its sweep's."""
    return f"rate-{rate_rps:g}"
