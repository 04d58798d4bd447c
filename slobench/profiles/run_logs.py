"""Request logs as measured runs: per request its arrival, prompt and answer lengths, TTFT and TPOT.

Three kinds of log are read into `slobench.fleet.published.Run`:
- the shared run format (one JSON object a line: `start_s`, `prompt_len`, `output_len`, `ttft_ms`, `tpot_ms`);
- a slobench run directory (its requests.jsonl: ok, non-warmup records; TTFT from the send);
- any CSV or JSONL with a column mapping (`ColumnMap`: `arrival=ts,prompt=in_tokens,output=out_tokens,
  ttft=ttft_ms,tpot=tpot_ms`; a key may carry its unit, `ttft_s=...`, `arrival_ms=...`; `latency` instead of
  `tpot` derives TPOT as (latency - TTFT) / (output - 1)).
Every problem is a SpecError naming the file, the line or column, and what is wrong.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import SpecError
from slobench.fleet.published import Run, read_run
from slobench.run.records import read_records

# the keys of a column mapping, each with its default unit and the units it may be given in
_KEYS = {"arrival": "s", "prompt": "", "output": "", "ttft": "ms", "tpot": "ms", "latency": "ms"}
_TO_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3}


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which column of a CSV/JSONL holds each quantity, and its unit (s, ms or us for times)."""

    columns: tuple[tuple[str, str, str], ...]  # (key, column, unit)

    def __post_init__(self) -> None:
        keys = {k for k, _, _ in self.columns}
        need = {"arrival", "prompt", "output", "ttft"}
        if need - keys:
            raise SpecError("--columns", self.text, f"lacks {', '.join(sorted(need - keys))} (needs arrival, prompt, "
                            "output, ttft, and tpot or latency)")
        if not keys & {"tpot", "latency"}:
            raise SpecError("--columns", self.text, "needs tpot=COLUMN or latency=COLUMN")

    @property
    def text(self) -> str:
        return ",".join(f"{k}{'_' + u if u and u != _KEYS[k] else ''}={c}" for k, c, u in self.columns)

    @classmethod
    def parse(cls, text: str) -> ColumnMap:
        """`arrival=ts,prompt=in_tokens,output=out_tokens,ttft_s=ttft,tpot=tpot_ms` (times in ms unless a key
        says `_s`, `_ms` or `_us`; arrival in s unless it says)."""
        out = []
        for part in text.split(","):
            key, eq, col = part.partition("=")
            key, col = key.strip(), col.strip()
            base, _, unit = key.partition("_")
            if not eq or not col or base not in _KEYS:
                raise SpecError("--columns", text, f"{part!r} is not KEY=COLUMN with KEY one of {', '.join(_KEYS)}")
            if _KEYS[base] == "" and unit or unit and unit not in _TO_MS:
                raise SpecError("--columns", text, f"{key!r}: a unit is s, ms or us, and only for times")
            out.append((base, col, unit or _KEYS[base]))
        return cls(tuple(out))


def _num(v: Any, where: str, col: str, integer: bool) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise SpecError("request log", where, f"column {col!r} is {v!r}: not a number") from None
    if not math.isfinite(x) or x < 0 or integer and (x != int(x) or x < 1):
        raise SpecError("request log", where, f"column {col!r} is {v!r}: needs "
                        + ("an integer >= 1" if integer else "a finite number >= 0"))
    return x


def read_mapped(path: Path, columns: ColumnMap) -> Run:
    """A CSV (by its header) or JSONL (by its keys) log through `columns`."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError("request log", str(path), f"cannot be read: {e}") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        header = reader.fieldnames or []
        missing = [c for _, c, _ in columns.columns if c not in header]
        if missing:
            raise SpecError("request log", str(path), f"has no column {', '.join(map(repr, missing))} (its header: "
                            f"{', '.join(header) or 'none'})")
        rows: list[tuple[str, dict[str, Any]]] = [(f"{path.name}:{i}", r) for i, r in enumerate(reader, 2)]
    else:
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if not isinstance(obj, dict):
                    raise SpecError("request log", f"{path.name}:{i}", "is not a JSON object")
                rows.append((f"{path.name}:{i}", obj))
    cols: dict[str, list[float]] = {k: [] for k in _KEYS}
    for where, row in rows:
        for key, col, unit in columns.columns:
            if col not in row:
                raise SpecError("request log", where, f"has no column {col!r} (for {key})")
            x = _num(row[col], where, col, key in ("prompt", "output"))
            cols[key].append(x * (_TO_MS[unit] / 1e3 if key == "arrival" else _TO_MS.get(unit, 1.0)))
    if not rows:
        raise SpecError("request log", str(path), "holds no requests")
    prompt, output = np.asarray(cols["prompt"], int), np.asarray(cols["output"], int)
    ttft = np.asarray(cols["ttft"])
    if cols["tpot"]:
        tpot = np.asarray(cols["tpot"])
    else:
        tpot = np.where(output > 1, (np.asarray(cols["latency"]) - ttft) / np.maximum(output - 1, 1), 0.0)
    return _ordered(path.stem, np.asarray(cols["arrival"]), prompt, output, ttft, tpot)


def _ordered(name: str, start_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, ttft_ms: np.ndarray,
             tpot_ms: np.ndarray) -> Run:
    o = np.argsort(start_s, kind="stable")
    return Run(name, start_s[o] - start_s[o][0], prompt[o], output[o], ttft_ms[o], tpot_ms[o])


def read_run_dir(path: Path) -> Run:
    """A slobench run directory: its ok, non-warmup requests (lengths as the server counted them)."""
    recs = [r for r in read_records(path / "requests.jsonl") if r.status == "ok" and not r.is_warmup
            and r.sent_s is not None and r.first_token_s is not None and r.done_s is not None and r.output_tokens]
    if not recs:
        raise SpecError("request log", str(path), "holds no completed requests")
    start = np.array([r.sent_s for r in recs], float)
    first = np.array([r.first_token_s for r in recs], float)
    done = np.array([r.done_s for r in recs], float)
    prompt = np.array([r.prompt_tokens or r.input_tokens for r in recs], int)
    output = np.array([r.output_tokens for r in recs], int)
    ttft = (first - start) * 1e3
    tpot = np.where(output > 1, (done - first) * 1e3 / np.maximum(output - 1, 1), 0.0)
    if (prompt < 1).any():
        raise SpecError("request log", str(path), "has a request without its prompt length")
    return _ordered(path.name, start, prompt, output, ttft, tpot)


def read_log(path: str | Path, columns: ColumnMap | None = None) -> Run:
    """One log: a run directory, a CSV/JSONL through `columns`, or (no mapping) the shared run format."""
    p = Path(path)
    if p.is_dir():
        if not (p / "requests.jsonl").is_file():
            raise SpecError("request log", str(p), "is a folder without requests.jsonl (not a slobench run)")
        return read_run_dir(p)
    if not p.is_file():
        raise SpecError("request log", str(p), "no such file")
    if columns is not None:
        return read_mapped(p, columns)
    if p.suffix.lower() == ".csv":
        raise SpecError("request log", str(p), "a CSV needs --columns (e.g. arrival=ts,prompt=in,output=out,"
                        "ttft=ttft_ms,tpot=tpot_ms)")
    return read_run(p)
