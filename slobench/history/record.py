"""History lines: one JSON line per measured commit, a few hundred bytes, fine to commit or to keep.

    {"schema": 1, "commit": "3f2a9c1", "date": "2026-12-01T10:00:00+00:00", "verdict": "pass",
     "source": "capacity", "workload": {"name": "tiny", "hash": "49fb..."}, "slo": {...},
     "metrics": {"capacity": [20.1, 19.6, 20.6, 0.41, 5], "ttft.p99@12": [0.131, ...], ...}}

Each metric is [mean, interval low, interval high, replicate sd (null from one), replicates]: the capacity
search's own interval, else a 95% t-interval over replicates, or one run's bootstrap interval. Headline
metrics only: capacity, and attainment and TTFT/TPOT p50/p99 at fixed rates (a search's replicates sit at
bracket edges that move from commit to commit, so from a search only the capacity is kept).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from slobench.analysis.slo import t_interval
from slobench.errors import WRITE_FAILURES, ResultsNotWritten, UsageError
from slobench.gate import load_samples, rate_key, result_file, workload_identity
from slobench.input_file import HISTORY, read_input_bytes
from slobench.run.rundir import MANIFEST, SUMMARY, check_schema, read_json, read_manifest, read_summary

SCHEMA = 1
VERDICTS = ("pass", "fail", "inconclusive")
HEADLINE = ("attainment", "ttft.p50", "ttft.p99", "tpot.p50", "tpot.p99")
LEVEL = 0.95
_SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s", "target", "clock")


def parse_verdict(text: str | None) -> str | None:
    """pass, fail or inconclusive; the gate's own word "regression" is a fail."""
    if text is None:
        return None
    v = {"regression": "fail"}.get(text.strip().lower(), text.strip().lower())
    if v not in VERDICTS:
        raise UsageError(f"--verdict: expected pass, fail or inconclusive (got {text!r})")
    return v


def parse_date(text: str | None) -> str:
    """ISO 8601 (what `git show -s --format=%cI` prints); a date without a zone is taken as UTC."""
    if text is None:
        return datetime.now(UTC).isoformat(timespec="seconds")
    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--date: expected an ISO 8601 date such as 2026-12-01T10:00:00Z (got {text!r})") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return d.isoformat(timespec="seconds")


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.4g}")


def _metric(mean: float, lo: float | None, hi: float | None, sd: float | None, n: int) -> list[Any]:
    return [_round(mean), _round(lo), _round(hi), _round(sd), int(n)]


def _from_replicates(values: Sequence[float], *, is_fraction: bool = False) -> list[Any]:
    v = np.asarray(values, dtype=float)
    sd = float(v.std(ddof=1)) if len(v) > 1 else None
    lo, hi = t_interval(list(v), LEVEL) if len(v) > 1 else (None, None)
    if is_fraction and lo is not None and hi is not None:  # attainment: the interval stays inside [0, 1]
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return _metric(float(v.mean()), lo, hi, sd, len(v))


def _wanted(key: str, rates: Sequence[float] | None) -> bool:
    name, _, rate = key.partition("@")
    if not rate or name not in HEADLINE:
        return False
    return rates is None or any(math.isclose(float(rate), r, rel_tol=1e-6) for r in rates)


def entry_from_results(
    paths: Sequence[str | Path], *, commit: str, date: str | None = None, verdict: str | None = None,
    rates: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The history line of a capacity result, sweeps (one per seed), a baseline file or one run directory."""
    if not commit or not commit.strip() or len(commit) > 100:
        raise UsageError(f"--commit: expected a commit id (got {commit!r})")
    if not paths:
        raise UsageError("history add: give a capacity, sweep or run directory")
    first = Path(paths[0])
    if len(paths) == 1 and first.is_dir() and (first / SUMMARY).is_file() and (first / MANIFEST).is_file():
        source, workload, slo, metrics = _from_run(first, rates)
    else:
        samples = load_samples(paths)
        doc = read_json(result_file(first))
        source = str(doc.get("kind"))
        workload = {"name": samples.workload.get("name"), "hash": samples.workload.get("hash")}
        slo = samples.slo
        metrics = {}
        if doc.get("kind") == "capacity" and doc.get("capacity_rps") is not None:
            reps = [float(r["capacity_rps"]) for r in doc.get("replicates") or [] if r.get("capacity_rps") is not None]
            iv = doc.get("interval_rps") or (None, None)
            sd = float(np.std(reps, ddof=1)) if len(reps) > 1 else None
            metrics["capacity"] = _metric(float(doc["capacity_rps"]), iv[0], iv[1], sd, max(len(reps), 1))
        elif "capacity" in samples.metrics:
            metrics["capacity"] = _from_replicates(list(samples.metrics["capacity"].values()))
        is_search = doc.get("kind") == "capacity" and doc.get("mode", "search") == "search"
        for key in sorted(samples.metrics, key=_sort_key):
            if _wanted(key, rates) and not is_search:
                metrics[key] = _from_replicates([v for _, v in sorted(samples.metrics[key].items())],
                                                is_fraction=key.startswith("attainment@"))
    if not metrics:
        raise UsageError(f"{', '.join(map(str, paths))}: no headline metric (capacity, or attainment/TTFT/TPOT "
                         f"at a fixed rate{' among --rates' if rates else ''}) to record")
    return {
        "schema": SCHEMA, "commit": commit.strip(), "date": parse_date(date), "verdict": parse_verdict(verdict),
        "source": source, "workload": workload,
        "slo": {k: slo.get(k) for k in _SLO_KEYS} if isinstance(slo, dict) else None, "metrics": metrics,
    }


def _from_run(p: Path, rates: Sequence[float] | None) -> tuple[str, dict[str, Any], Any, dict[str, list[Any]]]:
    manifest = read_manifest(p)
    summary = read_summary(p)
    try:
        if summary is None:
            raise ValueError("no summary.json")
        rate = float(manifest["rate_rps"])
    except (UsageError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{p}: not a readable run directory with an offered rate ({type(e).__name__}: {e})") from None
    ident = workload_identity(manifest)
    flat = summary.flat_metrics()
    dists = {"ttft": summary.ttft, "ttft_sched": summary.ttft_from_scheduled, "tpot": summary.tpot,
             "itl": summary.itl, "e2e": summary.e2e}
    metrics: dict[str, list[Any]] = {}
    for name in HEADLINE:
        key = rate_key(name, rate)
        if name not in flat or not _wanted(key, rates):
            continue
        lo = hi = None
        if name == "attainment":
            if summary.attainment is not None:
                lo, hi = summary.attainment.ci_low, summary.attainment.ci_high
        else:
            family, stat = name.split(".")
            dist = dists.get(family)
            if dist is not None and dist.ci and stat in dist.ci:
                lo, hi = dist.ci[stat]
        metrics[key] = _metric(flat[name], lo, hi, None, 1)
    return "run", {"name": ident.get("name"), "hash": ident.get("hash")}, manifest.get("slo"), metrics


def _sort_key(key: str) -> tuple[float, str]:
    name, _, rate = key.partition("@")
    return (float(rate) if rate else -1.0, name)


# --- the file -------------------------------------------------------------------------------------------


def read_history(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    try:
        text = read_input_bytes(p, HISTORY).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{p}: no such history file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: cannot read ({e})") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise UsageError(f"{p}: line {i}: not valid JSON ({e})") from None
        check_schema(f"{p}: line {i}", d, key="schema")
        if problem := _line_problem(d):
            raise UsageError(f"{p}: line {i}: {problem}")
        out.append(d)
    return out


def _line_problem(d: dict[str, Any]) -> str | None:
    """What is wrong with one history line's fields, or None: the page and the change points read them all."""
    if not isinstance(d.get("commit"), str) or not d["commit"].strip():
        return "not a history line (needs a commit id)"
    if not isinstance(d.get("metrics"), dict):
        return "not a history line (needs metrics)"
    for k, m in d["metrics"].items():
        if not (isinstance(m, list) and len(m) == 5 and all(_is_num(x) for x in m[:4] if x is not None)
                and m[0] is not None and math.isfinite(m[0]) and type(m[4]) is int and m[4] >= 1):
            return f"metric {k!r} is not [mean, low, high, sd, n] (finite numbers or null, n a count)"
    for key in ("workload", "slo"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            return f"{key} must be an object (got {d[key]!r})"
    if d.get("date") is not None and not isinstance(d["date"], str):
        return f"date must be text (got {d['date']!r})"
    if d.get("verdict") not in (None, *VERDICTS):
        return f"verdict must be one of {', '.join(VERDICTS)} or null (got {d['verdict']!r})"
    return None


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def identity_mismatch(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between two lines' workload or SLO (their commits are then not comparable), or None."""
    diffs = []
    wa, wb = a.get("workload") or {}, b.get("workload") or {}
    if wa.get("name") != wb.get("name") or wa.get("hash") != wb.get("hash"):
        diffs.append(f"workload {wa.get('name')!r} ({wa.get('hash')}) vs {wb.get('name')!r} ({wb.get('hash')})")
    if (a.get("slo") or None) != (b.get("slo") or None):
        diffs.append(f"SLO {a.get('slo')} vs {b.get('slo')}")
    return "; ".join(diffs) or None


def append_entry(path: str | Path, entry: dict[str, Any]) -> int:
    """Append one line (refusing a workload or SLO the history did not measure); returns its size in bytes."""
    p = Path(path)
    if os.path.lexists(p):  # read through the one opener: a FIFO, a device or a directory is refused by name
        previous = read_history(p)
        if previous and (diff := identity_mismatch(previous[-1], entry)):
            raise UsageError(f"{p}: refusing to append: the history measured another {diff}; its commits would "
                             f"not be comparable. Start a new history file for the new workload or SLO")
    line = json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "ab+") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:  # a file edited by hand may have lost its last newline
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")
            fh.write(line.encode())
    except OSError as e:
        if e.errno in WRITE_FAILURES:
            raise ResultsNotWritten(f"{p}: cannot write ({e.strerror or e})") from None
        raise UsageError(f"--history {p}: cannot write there ({e.strerror or e})") from None
    return len(line.encode())
