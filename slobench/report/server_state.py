"""The server's own state over a run, from server_metrics.jsonl (written by slobench.run.scrape).

Four servers' metric names (vLLM, SGLang, TGI, llama.cpp; the table above `WAITING`) are mapped onto the
same panels: requests (running, waiting), cache (KV usage, prefix-cache hit rate) and preemptions. A panel
reads the first of its names that the run's server exported, so a server exporting an old and a new
spelling of one quantity (vLLM 0.9) is read once. Samples are summed over label sets per metric name (one
line per engine, data-parallel rank or replica), fractions averaged; of SGLang's ranks sharing one batch
only the lowest is read. Counters become rates between scrapes (one that goes down, a restart, counts as
zero); a negative hit-rate gauge (vLLM's "disabled") is drawn as absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slobench.run.rundir import read_server_metrics_every

MAX_POINTS = 2000  # scrapes beyond this are thinned by stride (a 1 s interval gives 33 minutes in full)

# Series that are one metric's samples with given values of one label (SGLang splits its token counter by
# mode): series name -> (metric name, label, label values). The series name is this module's, not a server's.
_SELECTED: dict[str, tuple[str, str, frozenset[str]]] = {
    "sglang:realtime_tokens_total{mode=prefill_cache}": (
        "sglang:realtime_tokens_total", "mode", frozenset({"prefill_cache"})),
    "sglang:realtime_tokens_total{mode=prefill_cache|prefill_compute}": (
        "sglang:realtime_tokens_total", "mode", frozenset({"prefill_cache", "prefill_compute"})),
}

# Where each server's names come from (the file that defines them):
# vLLM V1 (vllm/v1/metrics/loggers.py) and V0 (vllm/engine/metrics.py)
#     waiting      vllm:num_requests_waiting
#     running      vllm:num_requests_running
#     KV usage     vllm:kv_cache_usage_perc (V1 since 0.9), vllm:gpu_cache_usage_perc (V0; V1 until 0.10)
#     preemptions  vllm:num_preemptions_total (V0 names the counter so; V1's vllm:num_preemptions is
#                  exposed with the _total suffix)
#     prefix hits  vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (V1 since 0.9),
#                  vllm:gpu_prefix_cache_hits_total / vllm:gpu_prefix_cache_queries_total (V1 before),
#                  else the gauge vllm:gpu_prefix_cache_hit_rate (V0; -1 when prefix caching is off)
# SGLang (python/sglang/srt/metrics/collector.py)
#     waiting      sglang:num_queue_reqs
#     running      sglang:num_running_reqs
#     KV usage     sglang:token_usage (used / max_total_num_tokens of the KV pool)
#     preemptions  sglang:num_retracted_requests_total (SGLang retracts where vLLM preempts)
#     prefix hits  sglang:realtime_tokens_total{mode="prefill_cache"} over {mode="prefill_cache"} +
#                  {mode="prefill_compute"} (scheduler, each log interval), else sglang:cached_tokens_total
#                  over sglang:prompt_tokens_total (tokenizer, as requests finish), else the gauge
#                  sglang:cache_hit_rate (the last prefill batch's cached share of its prompt tokens)
# TGI (backends/v3/src/queue.rs, backends/v3/src/backend.rs; docs/source/reference/metrics.md)
#     waiting      tgi_queue_size
#     running      tgi_batch_current_size
#     TGI exports no KV-cache, prefix-cache or preemption metric.
# llama.cpp server (tools/server/server-context.cpp, before it tools/server/server.cpp and
# examples/server/server.cpp)
#     waiting      llamacpp:requests_deferred (tasks waiting for a free slot)
#     running      llamacpp:requests_processing (slots busy)
#     KV usage     llamacpp:kv_cache_usage_ratio (builds before mid-2025, ggml-org/llama.cpp#13660 removed it)
#     llama.cpp exports no prefix-cache or preemption metric.
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size", "llamacpp:requests_deferred")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size",
           "llamacpp:requests_processing")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio")
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions", "sglang:num_retracted_requests_total")
# Prefix-cache counters, in pairs: PREFIX_HITS[i] is read with PREFIX_QUERIES[i].
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
               "sglang:realtime_tokens_total{mode=prefill_cache}", "sglang:cached_tokens_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                  "sglang:realtime_tokens_total{mode=prefill_cache|prefill_compute}", "sglang:prompt_tokens_total")
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")  # gauges, 0-1; read without counters
_FRACTIONS = frozenset(KV_USAGE + PREFIX_HIT_RATE)
_WANTED = frozenset(WAITING + RUNNING + KV_USAGE + PREEMPTIONS + PREFIX_HITS + PREFIX_QUERIES + PREFIX_HIT_RATE)
_SELECTED_BY_METRIC: dict[str, list[tuple[str, str, frozenset[str]]]] = {}
for _series, (_metric, _label, _values) in _SELECTED.items():
    _SELECTED_BY_METRIC.setdefault(_metric, []).append((_series, _label, _values))


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


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _labels(key: str) -> dict[str, str]:
    """The labels of a sample key `name{a="x",b="y"}` (slobench.run.scrape.sample_key), values unescaped."""
    inner = key.partition("{")[2]
    return {k: re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), v)
            for k, v in _LABEL.findall(inner)}


# SGLang labels each scheduler's samples with its ranks. With --enable-metrics-for-all-schedulers every tensor-,
# pipeline- and expert-parallel rank reports the batch they share; only the lowest of them is read, so that
# the batch counts once. Data-parallel ranks (dp_rank) run batches of their own and add up.
_SGLANG_SHARED_RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")


def _rank(v: str) -> int:
    return int(v) if v.isascii() and v.isdigit() else 0


def _duplicate_ranks(keys: set[str]) -> set[str]:
    """SGLang sample keys that repeat a lower rank's copy of the same batch."""
    lowest: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[tuple[int, ...], str]] = {}
    dropped: set[str] = set()
    for key in sorted(keys):
        if not key.startswith("sglang:") or "{" not in key:
            continue
        labels = _labels(key)
        if not any(r in labels for r in _SGLANG_SHARED_RANKS):
            continue
        group = (key.split("{", 1)[0], tuple(sorted((k, v) for k, v in labels.items()
                                                    if k not in _SGLANG_SHARED_RANKS)))
        ranks = tuple(_rank(labels.get(r, "0")) for r in _SGLANG_SHARED_RANKS)
        if group not in lowest:
            lowest[group] = (ranks, key)
        elif ranks < lowest[group][0]:
            dropped.add(lowest[group][1])
            lowest[group] = (ranks, key)
        else:
            dropped.add(key)
    return dropped


def _series_of(key: str) -> list[str]:
    """The series a sample adds to: its metric's name, and any label-selected series it belongs to."""
    name = key.split("{", 1)[0]
    out = [name] if name in _WANTED else []
    selected = _SELECTED_BY_METRIC.get(name, ())
    if selected:
        labels = _labels(key)
        out += [series for series, label, values in selected if labels.get(label) in values]
    return out


def load_server_metrics(path: Path) -> ServerSamples | None:
    """server_metrics.jsonl (or the run directory holding it; `rundir.read_server_metrics`: the torn-last-line
    rule of requests.jsonl) as the report's panels: every k-th scrape, at most MAX_POINTS, the only ones
    parsed."""
    scrapes, num_scrapes = read_server_metrics_every(path, MAX_POINTS)
    if not scrapes:
        return None
    rows = [(float(d["t_s"]), {str(k): float(v) for k, v in d["samples"].items()}) for d in scrapes]
    t = np.array([r[0] for r in rows])
    acc: dict[str, np.ndarray] = {}
    cnt: dict[str, np.ndarray] = {}
    keys = {key for _, samples in rows for key in samples}
    keys = {k for k in keys if k.split("{", 1)[0] in _WANTED or k.split("{", 1)[0] in _SELECTED_BY_METRIC}
    keys -= _duplicate_ranks(keys)
    routes = {key: _series_of(key) for key in keys}  # sample key -> the series it adds to
    for i, (_, samples) in enumerate(rows):
        for key, v in samples.items():
            for name in routes.get(key, ()):
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


def _first(s: ServerSamples, names: tuple[str, ...]) -> tuple[str, np.ndarray] | None:
    for n in names:
        if n in s.by_name:
            return n, s.by_name[n]
    return None


def _rate(t: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dt = np.diff(t)
    dv = np.clip(np.diff(counter), 0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        return t[1:], np.where(dt > 0, dv / dt, np.nan)


def _prefix_hit_rate(s: ServerSamples) -> ServerSeries | None:
    """% of looked-up prompt tokens found in the prefix cache: per scrape interval from a server's hit and
    query counters, else its own hit-rate gauge."""
    for hits_name, queries_name in zip(PREFIX_HITS, PREFIX_QUERIES, strict=True):
        hits, queries = s.by_name.get(hits_name), s.by_name.get(queries_name)
        if hits is None or queries is None:
            continue
        if len(s.t_s) < 2:
            return None
        dh, dq = np.clip(np.diff(hits), 0, None), np.clip(np.diff(queries), 0, None)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(dq > 0, 100 * dh / dq, np.nan)
        return ServerSeries("prefix-cache hit rate", "#bcbd22", s.t_s[1:], ratio)
    if (found := _first(s, PREFIX_HIT_RATE)) is None:
        return None
    gauge = found[1]
    with np.errstate(invalid="ignore"):
        pct = np.where(gauge >= 0, 100 * gauge, np.nan)  # vLLM V0 reports -1 with prefix caching off
    if np.isnan(pct).all():
        return None
    return ServerSeries("prefix-cache hit rate", "#bcbd22", s.t_s, pct)


def server_series(s: ServerSamples) -> dict[str, list[ServerSeries]]:
    """Panels -> series: 'requests' (running, waiting), 'cache' (KV usage %, prefix hit %), 'preemptions'."""
    out: dict[str, list[ServerSeries]] = {"requests": [], "cache": [], "preemptions": []}
    if (found := _first(s, RUNNING)) is not None:
        out["requests"].append(ServerSeries("running (server)", "#ff7f0e", s.t_s, found[1]))
    if (found := _first(s, WAITING)) is not None:
        out["requests"].append(ServerSeries("waiting (server queue)", "#9467bd", s.t_s, found[1]))
    if (found := _first(s, KV_USAGE)) is not None:
        out["cache"].append(ServerSeries("KV cache usage", "#17becf", s.t_s, 100 * found[1]))
    if (prefix := _prefix_hit_rate(s)) is not None:
        out["cache"].append(prefix)
    if (found := _first(s, PREEMPTIONS)) is not None and len(s.t_s) > 1:
        t, r = _rate(s.t_s, found[1])
        label = "retractions" if found[0].startswith("sglang:") else "preemptions"
        out["preemptions"].append(ServerSeries(label, "#8c564b", t, r))
    return out
