"""One request: what to send and when (`RequestSpec`), what happened to it (`RequestRecord`), and
requests.jsonl, where a run keeps one record a line as each request finishes (failures and cancellations
included). All times in a record are seconds since the run's origin on one monotonic clock (see
`slobench.run.clock`). The rest of a run directory is `slobench.run.rundir`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal

import numpy as np
from orjson import OPT_SERIALIZE_NUMPY
from orjson import dumps as orjson_dumps
from orjson import loads as orjson_loads  # 3-5x faster than json.loads on a record line

from slobench.errors import UsageError
from slobench.input_file import RECORDS, InputKind, read_input_bytes

REQUESTS = "requests.jsonl"

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
    # A session's turn (0-based) and, in the waiting mode, the think or tool time after the previous turn's
    # answer ends: a turn with `think_s` set is sent that long after its predecessor ended, not at `arrival_s`
    # (then the precomputed estimate, kept on its record as `estimated_s`). None: sent at `arrival_s`.
    turn: int | None = None
    think_s: float | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    # Set only by slobench.workload's generators (`with_drawn_ids`): every id of this token-id prompt is an
    # exact int drawn from [0, ids_below). Not an argument, so `replace(spec, prompt=...)` drops it.
    ids_below: int | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.arrival_s < 0:
            raise ValueError(f"arrival_s must be >= 0 (got {self.arrival_s!r})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (got {self.max_tokens!r})")
        if self.think_s is not None and not (self.think_s >= 0 and self.turn and self.session_id is not None):
            raise ValueError(f"think_s needs a session's later turn and must be >= 0 (got {self.think_s!r})")


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
    # Written only when set (targets that read a server's answers set them; the engine and the simulator
    # count exactly and leave them None). `finish_reason`: the server's last one. `output_tokens_source`:
    # where `output_tokens` came from: "usage", "max_tokens" (finish_reason "length"), "tokenizer", or
    # "events" (counted from the stream: token ids where sent, else one a token-carrying event; an estimate).
    finish_reason: str | None = None
    output_tokens_source: str | None = None
    # Written only when set: why the request was sent a second time, on a new connection (the server had
    # closed the kept-alive one as it left); `sent_s` is still the first send's.
    retried: str | None = None
    # Written only when set: the session and turn (0-based) a request belongs to, and for a turn sent when its
    # predecessor's answer ended (the waiting session mode), the send time the precomputed schedule estimated.
    session_id: int | None = None
    turn: int | None = None
    estimated_s: float | None = None
    # Written only when the stream carried a reasoning channel (chat `reasoning_content`/`reasoning` deltas,
    # the Responses API's reasoning events): when its first reasoning and first answer token arrived
    # (`first_answer_s` None: the request ended with reasoning only, no answer), how many of `output_tokens`
    # were reasoning, and where that count came from: "usage" (completion_tokens_details.reasoning_tokens)
    # or "events" (counted from the stream, an estimate). `first_token_s` stays the first of either.
    first_reasoning_s: float | None = None
    first_answer_s: float | None = None
    reasoning_tokens: int | None = None
    reasoning_tokens_source: str | None = None

    def fail(self, status: Status, error: str, now_s: float | None = None) -> None:
        self.status = status
        self.error = error
        if now_s is not None and self.done_s is None:
            self.done_s = now_s

    def to_json(self) -> str:
        # The same bytes as json.dumps(asdict(self)) with rounded chunk times. This runs once per request on
        # the event loop of a live run: orjson writes the record where its output is json's to the byte
        # (`_orjson_safe`), json the rest (~4x slower: Python's float repr, and asdict's deep copies avoided).
        d = dict(zip(_RECORD_FIELDS, _FIELD_VALUES(self), strict=True))
        for name in _WRITTEN_WHEN_SET:
            if d[name] is None:
                del d[name]
        times = self.chunk_times_s
        # a long answer's chunk times rounded at numpy's speed (a Python round per chunk was a fifth of a
        # simulated run), and written by orjson from the array: the same bytes as from the list
        if len(times) > 32 and set(map(type, times)) == _FLOATS:
            rounded = _round_9_plain(np.fromiter(times, dtype=float, count=len(times)))
            if rounded is not None:
                d["chunk_times_s"] = rounded
                if _orjson_safe(self, []):
                    try:
                        return orjson_dumps(d, option=OPT_SERIALIZE_NUMPY).decode()
                    except TypeError:  # a value orjson does not take as json does (an int past 64 bits)
                        pass
                d["chunk_times_s"] = rounded.tolist()
                return _ENCODE(d)
            d["chunk_times_s"] = times = round_9(np.array(times, dtype=float)).tolist()
        else:
            d["chunk_times_s"] = times = list(map(round, times, _NINES))
        if _orjson_safe(self, times):
            try:
                return orjson_dumps(d).decode()
            except TypeError:  # a value orjson does not take as json does (an int past 64 bits, a numpy scalar)
                pass
        return _ENCODE(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def round_9(x: np.ndarray) -> np.ndarray:
    """Python's `round(v, 9)` of every v (how requests.jsonl writes chunk times), vectorised: rint(v * 1e9) / 1e9
    is that wherever the product's own rounding cannot have moved it across a half; the few values where it
    could are rounded by Python."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = x * 1e9
        out = np.rint(p) / 1e9
        # p is within half a unit in the last place of v * 1e9; NaN and infinities are unsure too
        unsure = np.flatnonzero(~(np.abs(p - np.floor(p) - 0.5) > np.spacing(np.abs(p))))
    out[unsure] = [round(v, 9) for v in x[unsure].tolist()]
    return out


def _round_9_plain(x: np.ndarray) -> np.ndarray | None:
    """`round_9(x)` when every v is within [1e-4, 1e16) (which json and orjson write alike) and none is near
    enough a half at the ninth decimal to need Python's round: a few whole-array operations, no error state
    to set (no product can overflow). None otherwise (the caller takes `round_9` and the checks)."""
    hi = x.max()
    if not (1e-4 <= x.min() and hi < 1e16):  # (a NaN fails both)
        return None
    p = x * 1e9
    out = np.rint(p)
    np.subtract(p, out, out=p)
    # the largest |v * 1e9 - rint| is further from a half than any element's spacing (the largest product's,
    # with room for the rounding of these differences): round_9 would find no value unsure
    if not 0.5 - float(np.abs(p, out=p).max()) > math.ulp(float(hi) * 1e9) + 1e-15:
        return None
    out /= 1e9
    return out


def _orjson_safe(r: RequestRecord, times: list[float]) -> bool:
    """Whether orjson writes this record to the same bytes as json.dumps: every float one neither of them
    writes with an exponent (Python's repr does below 1e-4 and from 1e16; orjson spells exponents its own
    way), every text printable ASCII (json escapes the rest as \\uXXXX, orjson writes UTF-8); ints and bools
    are alike, and an int orjson refuses raises. It runs once a request on a live run's event loop: a loop,
    no call a field."""
    # (a numpy float among them: orjson raises; a NaN, which orjson writes as null, makes the sum NaN)
    if times and not (1e-4 <= min(times) and max(times) < 1e16 and math.isfinite(sum(times))):
        return False
    for v in (r.scheduled_s, r.sent_s, r.first_token_s, r.done_s, r.queued_s, r.estimated_s, r.first_reasoning_s,
              r.first_answer_s):
        if v is not None and (type(v) is not float or not (v == 0.0 or 1e-4 <= abs(v) < 1e16)):
            return False
    for t in (r.tag, r.status, r.error, r.finish_reason, r.output_tokens_source, r.retried,
              r.reasoning_tokens_source):
        if t is not None and (type(t) is not str or not (t.isascii() and t.isprintable())):
            return False
    return True


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
_FIELD_VALUES = attrgetter(*_RECORD_FIELDS)  # a record's values in field order, in one call
_NINES = repeat(9)  # chunk times are written rounded to the nanosecond
_FLOATS = {float}
# absent, the line is as it always was
_WRITTEN_WHEN_SET = ("finish_reason", "output_tokens_source", "retried", "session_id", "turn", "estimated_s",
                     "first_reasoning_s", "first_answer_s", "reasoning_tokens", "reasoning_tokens_source")
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def read_jsonl(path: Path, what: str, check: Callable[[Any], bool], loads: Callable[[str], Any] = orjson_loads,
               kind: InputKind = RECORDS) -> list[Any]:
    """A JSON-lines file written as it goes (requests.jsonl, server_metrics.jsonl). A torn *final* line (a
    crash mid-write) is forgiven: it loses at most the line being written; any other line that is not
    JSON, or that `check` refuses, is corruption and named by its line number."""
    lines = _text_lines(path, kind)
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


def read_jsonl_every(path: Path, what: str, check: Callable[[Any], bool], loads: Callable[[str], Any],
                     at_most: int, kind: InputKind = RECORDS) -> tuple[list[Any], int]:
    """`read_jsonl(...)[::k]`, k the least step leaving at most `at_most` rows, and how many rows there are
    in all, parsing only the rows returned (and the final line, for the torn-line rule): a chart that draws
    2,000 of a day's 86,400 scrapes reads 2,000. The lines not returned are checked by shape only, each one
    JSON object (`{` to `}`): a line cut short is still named, a bad value inside one is not."""
    lines = _text_lines(path, kind)
    numbered = [(lineno, line) for lineno, line in enumerate(lines, 1) if line.strip()]
    if numbered and numbered[-1][0] == len(lines) and _refused(numbered[-1][1], check, loads):
        numbered.pop()  # torn: forgiven, as read_jsonl forgives it
    for lineno, line in numbered:
        text = line.strip()
        if text[0] != "{" or text[-1] != "}":
            raise UsageError(f"{path}:{lineno}: bad {what} (not one JSON object: {text[:60]!r})")
    rows: list[Any] = []
    for lineno, line in numbered[:: max(1, -(-len(numbered) // at_most))]:
        try:
            d = loads(line)
            if not check(d):
                raise TypeError(f"not a {what} object")
        except (json.JSONDecodeError, TypeError) as e:
            raise UsageError(f"{path}:{lineno}: bad {what} ({e})") from None
        rows.append(d)
    return rows, len(numbered)


def _refused(line: str, check: Callable[[Any], bool], loads: Callable[[str], Any]) -> bool:
    try:
        return not check(loads(line))
    except (json.JSONDecodeError, TypeError):
        return True


def _text_lines(path: Path, kind: InputKind) -> list[str]:
    try:
        return read_input_bytes(path, kind).decode("utf-8").splitlines()
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); not a file slobench wrote") from None
    except OSError as e:  # no permission
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None


def read_record_dicts(path: Path) -> list[dict[str, Any]]:
    """requests.jsonl as parsed objects (`read_jsonl`'s torn-line rule)."""
    return read_jsonl(path, "request record",
                      lambda d: isinstance(d, dict) and "request_id" in d and "scheduled_s" in d)


def read_records(path: Path) -> list[RequestRecord]:
    """requests.jsonl as records, each line's types checked (`record_problem`)."""
    records = []
    for lineno, d in enumerate(read_record_dicts(path), 1):
        problem = record_problem(d)
        if problem is not None:
            raise UsageError(f"{path}: record {lineno}: {problem}")
        try:
            records.append(RequestRecord.from_dict(d))
        except TypeError as e:
            raise UsageError(f"{path}: record {lineno}: bad request record ({e})") from None
    return records


_NUMBER_FIELDS = ("scheduled_s", "sent_s", "first_token_s", "done_s", "queued_s", "first_reasoning_s",
                  "first_answer_s")
_INT_FIELDS = ("request_id", "input_tokens", "prompt_tokens", "cached_tokens", "output_tokens",
               "usage_output_tokens", "max_tokens", "http_status", "replica", "reasoning_tokens")
_REQUIRED = ("request_id", "scheduled_s")
_TEXT_FIELDS = ("tag", "error", "finish_reason", "output_tokens_source", "retried", "reasoning_tokens_source")


def record_problem(d: Any) -> str | None:
    """What is wrong with one record's types, or None: a hand-edited or foreign file is told apart from a
    slobench bug (`"scheduled_s": "x"` would otherwise end in a TypeError deep in the metrics)."""
    if not isinstance(d, dict):
        return f"not a JSON object ({type(d).__name__})"
    for k in _REQUIRED:
        if d.get(k) is None:
            return f"missing {k!r}"
    for k in _NUMBER_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            return f"{k} must be a finite number (got {v!r})"
    for k in _INT_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{k} must be an integer (got {v!r})"
        if v is not None and v < 0 and k != "http_status":
            return f"{k} must be >= 0 (got {v!r})"
    for k, kind in (("chunk_times_s", (int, float)), ("chunk_tokens", (int,))):
        v = d.get(k, [])
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
            return f"{k} must be a list of numbers"
    for k in _TEXT_FIELDS:
        if d.get(k) is not None and not isinstance(d[k], str):
            return f"{k} must be text (got {d[k]!r:.40})"
    if not isinstance(d.get("is_warmup", False), bool):
        return f"is_warmup must be true or false (got {d['is_warmup']!r:.40})"
    if d.get("status", "ok") not in ("ok", "error", "timeout", "cancelled"):
        return f"status must be ok, error, timeout or cancelled (got {d.get('status')!r})"
    return None


def write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    with open(path, "w") as fh:
        for r in records:
            fh.write(r.to_json() + "\n")
