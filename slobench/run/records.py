"""Request specs, request records, and the run directory: the one place that knows the file formats.

A run directory holds:
  manifest.json        written at start: schema version, slobench version, workload, seed, target, SLO, clock anchor
  requests.jsonl       one line per request as it finishes (failures and cancellations included)
  server_metrics.jsonl optional: scraped Prometheus samples over time
  summary.json         written at the end (also after Ctrl-C): a `slobench.analysis.summary.RunSummary`
A sweep directory adds sweep.json (its rates, their run directories and summaries, the headline); a capacity
search adds capacity.json (its probes, replicates and interval). Each file has its reader and writer here.
All times in a record are seconds since the run's origin on one monotonic clock (see `slobench.run.clock`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from orjson import loads as _loads  # 3-5x faster than json.loads on a record line

from slobench.errors import UsageError

if TYPE_CHECKING:
    from slobench.analysis.summary import RunSummary

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
SUMMARY = "summary.json"
SERVER_METRICS = "server_metrics.jsonl"
SWEEP = "sweep.json"
CAPACITY = "capacity.json"

Status = Literal["ok", "error", "timeout", "cancelled"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send and when. `prompt` is token ids (completions API) or text (chat or completions)."""

    request_id: int
    arrival_s: float  # scheduled send time, seconds from run start
    prompt: str | tuple[int, ...]
    input_tokens: int  # intended prompt length in tokens (the server's usage is the truth)
    max_tokens: int
    min_tokens: int | None = None
    ignore_eos: bool = True
    tag: str = ""  # request class / phase label, carried to the record
    session_id: int | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    # Set only by slobench.workload's generators (`with_drawn_ids`): every id of this token-id prompt is an
    # exact int drawn from [0, ids_below). Not an argument, so `replace(spec, prompt=...)` drops it.
    ids_below: int | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.arrival_s < 0:
            raise ValueError(f"arrival_s must be >= 0 (got {self.arrival_s!r})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (got {self.max_tokens!r})")


def with_drawn_ids(spec: RequestSpec, id_range: tuple[int, int]) -> RequestSpec:
    """`spec`, marked as holding a token-id prompt whose ids the generator drew from `id_range` (0 <= lo < hi,
    as Python ints): a simulator may then skip the protocol's per-id check when hi is within the vocabulary
    (~0.3 ms a 1k-token prompt). Only for prompts built by `slobench.workload.prompts` from a checked range."""
    lo, hi = id_range
    if not (type(spec.prompt) is tuple and type(lo) is int and type(hi) is int and 0 <= lo < hi):
        raise ValueError(f"with_drawn_ids: a token-id prompt and an id range 0 <= lo < hi (got {id_range!r})")
    object.__setattr__(spec, "ids_below", hi)
    return spec


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Filled in place by a target, so a cancelled send keeps its partial times."""

    request_id: int
    scheduled_s: float
    tag: str = ""
    sent_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each content chunk
    input_tokens: int = 0  # intended
    prompt_tokens: int | None = None  # from server usage when reported
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache, when it says
    output_tokens: int = 0  # server usage when reported and plausible, else counted chunks
    usage_output_tokens: int | None = None  # what the server's usage said, kept even when not believed
    max_tokens: int = 0
    status: Status = "ok"
    error: str | None = None
    http_status: int | None = None
    is_warmup: bool = False
    queued_s: float = 0.0  # time spent waiting for an in-flight cap / closed-loop slot before send
    replica: int | None = None  # which replica served it, when a fleet is routed (client-side or simulated)

    def fail(self, status: Status, error: str, now_s: float | None = None) -> None:
        self.status = status
        self.error = error
        if now_s is not None and self.done_s is None:
            self.done_s = now_s

    def to_json(self) -> str:
        # The same bytes as json.dumps(asdict(self)) with rounded chunk times, at a third of the cost: asdict
        # deep-copies every field, and this runs once per request on the event loop of a live run.
        d = {name: getattr(self, name) for name in _RECORD_FIELDS}
        d["chunk_times_s"] = [round(t, 9) for t in self.chunk_times_s]
        return _ENCODE(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    # NaN and infinities are not JSON: an empty metric is null, so every reader can parse the file
    tmp.write_text(json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False) + "\n")
    os.replace(tmp, path)


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
    ~0.7 ms that serialising a record takes."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        write_json_atomic(self.run_dir / MANIFEST, self.manifest)
        self._fh: IO[str] | None = open(self.run_dir / REQUESTS, "w", buffering=1 << 16)

    def update_manifest(self, extra: dict[str, Any]) -> None:
        self.manifest.update(extra)
        write_json_atomic(self.run_dir / MANIFEST, self.manifest)

    def write(self, rec: RequestRecord) -> None:
        assert self._fh is not None, "RunWriter already closed"
        self._fh.write(rec.to_json() + "\n")
        self._fh.flush()  # line by line: a crash can tear only the last line, which readers forgive

    def rewrite(self, records: Sequence[RequestRecord]) -> None:
        """Replace requests.jsonl with `records` (atomically), e.g. once the warm-up cut is known."""
        self.close()
        path = self.run_dir / REQUESTS
        tmp = path.with_suffix(".jsonl.tmp")
        write_records(tmp, records)
        os.replace(tmp, path)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def finish(self, summary: Any) -> None:
        """Close requests.jsonl and write summary.json (`write_summary`)."""
        self.close()
        write_summary(self.run_dir, summary)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass(slots=True)
class Run:
    """A run directory read back."""

    run_dir: Path
    manifest: dict[str, Any]
    records: list[RequestRecord]
    summary: RunSummary | None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: missing (is this a slobench run directory?)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's manifest, checked: a directory, valid JSON, the schema version this slobench reads."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory")
    manifest = _read_json(run_dir / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("schema_version") != SCHEMA_VERSION:
        got = manifest.get("schema_version") if isinstance(manifest, dict) else manifest
        raise UsageError(f"{run_dir / MANIFEST}: schema_version {got!r}, this slobench reads {SCHEMA_VERSION}")
    return manifest


def write_summary(run_dir: str | Path, summary: Any) -> None:
    """summary.json: a `slobench.analysis.summary.RunSummary` (or its dict) with the schema version."""
    doc = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)
    write_json_atomic(Path(run_dir) / SUMMARY, {"schema_version": SCHEMA_VERSION, **doc})


def read_summary(run_dir: str | Path) -> RunSummary | None:
    """A run directory's summary.json as a `RunSummary`, or None where the run has none yet (a run cut off
    before its end)."""
    from slobench.analysis.summary import RunSummary

    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None
    try:
        return RunSummary.from_dict(_read_json(path))
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None


def read_jsonl(path: Path, what: str, check: Callable[[Any], bool], loads: Callable[[str], Any] = _loads) -> list[Any]:
    """A JSON-lines file written as it goes (requests.jsonl, server_metrics.jsonl). A torn *final* line (a
    crash mid-write) is forgiven: it loses at most the line being written; any other line that is not
    JSON, or that `check` refuses, is corruption and named by its line number."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows: list[Any] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = loads(line)
            if not check(d):
                raise TypeError(f"not a {what} object")
        except (json.JSONDecodeError, TypeError) as e:
            if lineno == len(lines):
                break
            raise UsageError(f"{path}:{lineno}: bad {what} ({e})") from None
        rows.append(d)
    return rows


def read_record_dicts(path: Path) -> list[dict[str, Any]]:
    """requests.jsonl as parsed objects (`read_jsonl`'s torn-line rule)."""
    return read_jsonl(path, "request record",
                      lambda d: isinstance(d, dict) and "request_id" in d and "scheduled_s" in d)


def _is_scrape(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("t_s"), int | float) and not isinstance(d.get("t_s"), bool)
            and isinstance(d.get("samples"), dict)
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in d["samples"].values()))


def read_server_metrics(path: str | Path) -> list[dict[str, Any]]:
    """server_metrics.jsonl (the file, or the run directory holding it): one `{"t_s": run seconds, "samples":
    {series: value}}` a scrape."""
    p = Path(path)
    p = p / SERVER_METRICS if p.is_dir() else p
    # json.loads: a Prometheus value may be NaN, which the standard library reads and orjson refuses
    return read_jsonl(p, "server metrics line", _is_scrape, json.loads)


def write_sweep(out_dir: str | Path, doc: dict[str, Any]) -> None:
    """sweep.json: `{"kind": "sweep", "manifest", "runs": [{"rate_rps", "run_dir", "summary"}], "headline"}`
    (summaries as `RunSummary` or their dicts), written whole and atomically after every rate."""
    write_json_atomic(Path(out_dir) / SWEEP, {"schema_version": SCHEMA_VERSION, "kind": "sweep", **doc})


def read_sweep(sweep_dir: str | Path) -> dict[str, Any]:
    """sweep.json checked: each run with a numeric rate and a run directory (its summary as a dict)."""
    path = Path(sweep_dir) / SWEEP
    doc = _read_json(path)
    rows = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "rate_rps" in r and "run_dir" in r for r in rows):
        raise UsageError(f"{path}: expected {{'runs': [{{'rate_rps': ..., 'run_dir': ...}}, ...]}}")
    for r in rows:
        if isinstance(r["rate_rps"], bool) or not isinstance(r["rate_rps"], int | float):
            raise UsageError(f"{path}: rate_rps {r['rate_rps']!r} is not a number")
    if not isinstance(doc.get("manifest", {}), dict):
        raise UsageError(f"{path}: 'manifest' must be an object")
    return doc


def write_capacity(out_dir: str | Path, doc: dict[str, Any]) -> None:
    """capacity.json: a capacity search's document (`slobench.experiments.capacity.capacity_document`)."""
    write_json_atomic(Path(out_dir) / CAPACITY, {"schema_version": SCHEMA_VERSION, **doc})


def read_capacity(search_dir: str | Path) -> dict[str, Any]:
    """capacity.json checked: every probe with its rate, seed and run directory."""
    path = Path(search_dir) / CAPACITY
    doc = _read_json(path)
    try:
        for r in doc["probes"]:
            float(r["rate_rps"]), int(r["seed"]), str(r["run_dir"])
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: expected probes with rate_rps, seed and run_dir ({type(e).__name__}: {e})") from None
    return doc  # type: ignore[no-any-return]


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    req_path = run_dir / REQUESTS
    records = []
    for lineno, d in enumerate(read_record_dicts(req_path), 1):
        problem = record_problem(d)
        if problem is not None:
            raise UsageError(f"{req_path}: record {lineno}: {problem}")
        try:
            records.append(RequestRecord.from_dict(d))
        except TypeError as e:
            raise UsageError(f"{req_path}: record {lineno}: bad request record ({e})") from None
    return Run(run_dir, manifest, records, read_summary(run_dir))


_NUMBER_FIELDS = ("scheduled_s", "sent_s", "first_token_s", "done_s", "queued_s")
_INT_FIELDS = ("request_id", "input_tokens", "prompt_tokens", "cached_tokens", "output_tokens",
               "usage_output_tokens", "max_tokens", "http_status", "replica")
_REQUIRED = ("request_id", "scheduled_s")


def record_problem(d: Any) -> str | None:
    """What is wrong with one record's types, or None: a hand-edited or foreign file is told apart from a
    slobench bug (`"scheduled_s": "x"` used to end in a TypeError deep in the metrics)."""
    if not isinstance(d, dict):
        return f"not a JSON object ({type(d).__name__})"
    for k in _REQUIRED:
        if k not in d:
            return f"missing {k!r}"
    for k in _NUMBER_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            return f"{k} must be a finite number (got {v!r})"
    for k in _INT_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{k} must be an integer (got {v!r})"
    for k, kind in (("chunk_times_s", (int, float)), ("chunk_tokens", (int,))):
        v = d.get(k, [])
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
            return f"{k} must be a list of numbers"
    if d.get("status", "ok") not in ("ok", "error", "timeout", "cancelled"):
        return f"status must be ok, error, timeout or cancelled (got {d.get('status')!r})"
    return None


def write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    with open(path, "w") as fh:
        for r in records:
            fh.write(r.to_json() + "\n")
