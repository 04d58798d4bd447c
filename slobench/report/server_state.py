"""The server's own state over a run, from server_metrics.jsonl (written by slobench.scrape).

Samples are summed over label sets per metric name (a server with several engines or models reports one
line each), except fractions, which are averaged. Names follow vLLM; SGLang's equivalents are accepted.
Counters become rates from consecutive scrapes; a counter that goes down (server restart) counts as zero.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slobench.errors import UsageError

MAX_POINTS = 2000  # scrapes beyond this are thinned by stride (a 1 s interval gives 33 minutes in full)

WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
_FRACTIONS = frozenset(KV_USAGE)


@dataclass(frozen=True, slots=True)
class ServerSamples:
    t_s: np.ndarray
    by_name: dict[str, np.ndarray]  # metric name (labels aggregated) -> value per scrape, NaN where absent
    num_scrapes: int  # before thinning


@dataclass(frozen=True, slots=True)
class ServerSeries:
    label: str
    color: str  # fixed per quantity, so every run's timeline reads the same
    t_s: np.ndarray
    values: np.ndarray


def load_server_metrics(path: Path) -> ServerSamples | None:
    lines = path.read_text().splitlines()
    rows: list[tuple[float, dict[str, float]]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            rows.append((float(d["t_s"]), {str(k): float(v) for k, v in d["samples"].items()}))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            if lineno == len(lines):  # a torn last line after a crash
                break
            raise UsageError(f"{path}:{lineno}: bad server metrics line ({type(e).__name__}: {e})") from None
    if not rows:
        return None
    num_scrapes = len(rows)
    if len(rows) > MAX_POINTS:
        rows = rows[:: -(-len(rows) // MAX_POINTS)]
    t = np.array([r[0] for r in rows])
    wanted = set(WAITING + RUNNING + KV_USAGE + PREEMPTIONS + PREFIX_HITS + PREFIX_QUERIES)
    acc: dict[str, np.ndarray] = {}
    cnt: dict[str, np.ndarray] = {}
    for i, (_, samples) in enumerate(rows):
        for key, v in samples.items():
            name = key.split("{", 1)[0]
            if name not in wanted:
                continue
            if name not in acc:
                acc[name] = np.zeros(len(rows))
                cnt[name] = np.zeros(len(rows))
            acc[name][i] += v
            cnt[name][i] += 1
    by_name: dict[str, np.ndarray] = {}
    for name, total in acc.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            agg = total / cnt[name] if name in _FRACTIONS else total.copy()
        agg[cnt[name] == 0] = np.nan
        by_name[name] = agg
    return ServerSamples(t, by_name, num_scrapes)


def _first(s: ServerSamples, names: tuple[str, ...]) -> np.ndarray | None:
    for n in names:
        if n in s.by_name:
            return s.by_name[n]
    return None


def _rate(t: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dt = np.diff(t)
    dv = np.clip(np.diff(counter), 0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        return t[1:], np.where(dt > 0, dv / dt, np.nan)


def server_series(s: ServerSamples) -> dict[str, list[ServerSeries]]:
    """Panels -> series: 'requests' (running, waiting), 'cache' (KV usage %, prefix hit %), 'preemptions'."""
    out: dict[str, list[ServerSeries]] = {"requests": [], "cache": [], "preemptions": []}
    if (v := _first(s, RUNNING)) is not None:
        out["requests"].append(ServerSeries("running (server)", "#ff7f0e", s.t_s, v))
    if (v := _first(s, WAITING)) is not None:
        out["requests"].append(ServerSeries("waiting (server queue)", "#9467bd", s.t_s, v))
    if (v := _first(s, KV_USAGE)) is not None:
        out["cache"].append(ServerSeries("KV cache usage", "#17becf", s.t_s, 100 * v))
    hits, queries = _first(s, PREFIX_HITS), _first(s, PREFIX_QUERIES)
    if hits is not None and queries is not None and len(s.t_s) > 1:
        dh, dq = np.clip(np.diff(hits), 0, None), np.clip(np.diff(queries), 0, None)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(dq > 0, 100 * dh / dq, np.nan)
        out["cache"].append(ServerSeries("prefix-cache hit rate", "#bcbd22", s.t_s[1:], ratio))
    if (v := _first(s, PREEMPTIONS)) is not None and len(s.t_s) > 1:
        t, r = _rate(s.t_s, v)
        out["preemptions"].append(ServerSeries("preemptions", "#8c564b", t, r))
    return out
