"""Server metrics beyond vLLM: each server's /metrics, as it writes it, reaches the same report panels.

One exposition per server (and per naming era where names changed), written from the server's source:
vLLM vllm/v1/metrics/loggers.py and vllm/engine/metrics.py, SGLang python/sglang/srt/metrics/collector.py,
TGI backends/v3/src/{queue,backend}.rs (rendered by metrics-exporter-prometheus), llama.cpp's server metrics
handler (tools/server, examples/server). Each is parsed by the scraper's own parser into server_metrics.jsonl
and read back through the functions the report uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slobench.report import build_report
from slobench.report.server_state import ServerSeries, load_server_metrics, server_series
from slobench.report.synthetic import write_synthetic_sweep
from slobench.run.scrape import parse_samples

# ---- expositions, one per scrape: {placeholders} are the scrape's values -----------------------------------

# vLLM V1 (0.10 and later): gauges and counters per engine; counters get _total and _created from
# prometheus_client; histograms carry buckets the scraper drops.
VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} 1.76e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:prefix_cache_hits_created{{engine="0",model_name="m"}} 1.76e+09
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempt}
vllm:num_preemptions_created{{engine="0",model_name="m"}} 1.76e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} 3.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 5.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} 5.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} 0.9
"""

# vLLM V1 0.9: the deprecated spellings are still exported beside the new ones, with the same values.
VLLM_V1_09_DEPRECATED = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried tokens.DEPRECATED: Use vllm:prefix_cache_queries instead.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached tokens.DEPRECATED: Use vllm:prefix_cache_hits instead.
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
"""

# vLLM V0 (vllm/engine/metrics.py, 0.6-0.8): KV usage and a prefix-cache hit-rate gauge, no hit counters.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{{model_name="m"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="m"}} {kv}
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{{model_name="m"}} 0.0
# HELP vllm:cpu_prefix_cache_hit_rate CPU prefix cache block hit rate.
# TYPE vllm:cpu_prefix_cache_hit_rate gauge
vllm:cpu_prefix_cache_hit_rate{{model_name="m"}} -1.0
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{{model_name="m"}} {hit_rate}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="m"}} {preempt}
"""

# SGLang (current collector.py): per-scheduler labels; token counters split by mode; retractions counted.
SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {running}
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 4096.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {kv}
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 812.4
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {waiting}
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 0.99
# HELP sglang:num_retracted_reqs The number of retracted requests.
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 2.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {retracted}
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{{engine_type="unified",mode="prefill_compute",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {compute}
sglang:realtime_tokens_total{{engine_type="unified",mode="prefill_cache",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {cached}
sglang:realtime_tokens_total{{engine_type="unified",mode="decode",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 99999.0
"""

# SGLang before the token counters and labels by rank: the hit rate is only a gauge.
SGLANG_OLD = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m"}} {running}
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="m"}} {kv}
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m"}} {waiting}
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="m"}} {hit_rate}
"""

# TGI: metrics-exporter-prometheus renders counters without _total and histograms with buckets.
TGI = """\
# TYPE tgi_request_count counter
tgi_request_count 57
# TYPE tgi_request_success counter
tgi_request_success 41
# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{{method="prefill"}} 12
tgi_batch_inference_count{{method="decode"}} 640
# TYPE tgi_queue_size gauge
tgi_queue_size {waiting}
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size {running}
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9216
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{{le="0.005"}} 30
tgi_request_queue_duration_bucket{{le="+Inf"}} 41
tgi_request_queue_duration_sum 2.5
tgi_request_queue_duration_count 41
"""

# llama.cpp server (current tools/server): no KV-cache gauge any more; counters named *_total by hand.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 180.5
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 7688
# HELP llamacpp:n_tokens_max Largest observed n_tokens.
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 512
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 3.41
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 140.261
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 43.2189
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {running}
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {waiting}
"""

# llama.cpp builds before mid-2025 (examples/server/server.cpp) also reported the KV cache.
LLAMACPP_OLD_KV = """\
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio {kv}
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1234
"""


def write_scrapes(path: Path, template: str, scrapes: list[dict[str, float]]) -> Path:
    """One server_metrics.jsonl line a scrape, one second apart, as slobench.run.scrape writes them."""
    with open(path, "w") as fh:
        for i, values in enumerate(scrapes):
            samples = parse_samples(template.format(**values))
            fh.write(json.dumps({"t_s": float(i), "samples": samples}, separators=(",", ":")) + "\n")
    return path


def panels_of(path: Path) -> dict[str, dict[str, ServerSeries]]:
    s = load_server_metrics(path)
    assert s is not None
    return {panel: {x.label: x for x in series} for panel, series in server_series(s).items()}


def values(series: ServerSeries) -> list[float]:
    return [round(float(v), 6) if np.isfinite(v) else float("nan") for v in series.values]


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((np.isnan(x) and np.isnan(y)) or x == pytest.approx(y) for x, y in zip(a, b, strict=True))


# ---- vLLM ---------------------------------------------------------------------------------------------------


def test_vllm_v1(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", VLLM_V1, [
        {"running": 2, "waiting": 0, "kv": 0.1, "queries": 0, "hits": 0, "preempt": 0},
        {"running": 8, "waiting": 5, "kv": 0.55, "queries": 1000, "hits": 250, "preempt": 3},
        {"running": 8, "waiting": 9, "kv": 0.9, "queries": 3000, "hits": 1250, "preempt": 3},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [2, 8, 8]
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 5, 9]
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([10, 55, 90])
    hit = panels["cache"]["prefix-cache hit rate"]
    assert hit.t_s.tolist() == [1, 2] and values(hit) == pytest.approx([25, 50])  # per interval, from counters
    assert values(panels["preemptions"]["preemptions"]) == [3, 0]


def test_vllm_09_exports_both_spellings_and_is_read_once(tmp_path):
    both = VLLM_V1 + VLLM_V1_09_DEPRECATED
    p = write_scrapes(tmp_path / "server_metrics.jsonl", both, [
        {"running": 1, "waiting": 0, "kv": 0.2, "queries": 0, "hits": 0, "preempt": 0},
        {"running": 1, "waiting": 0, "kv": 0.4, "queries": 100, "hits": 10, "preempt": 0},
    ])
    panels = panels_of(p)
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([20, 40])  # not 40/80: one name read
    assert values(panels["cache"]["prefix-cache hit rate"]) == pytest.approx([10])


def test_vllm_v1_before_09_has_only_the_gpu_spellings(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", VLLM_V1_09_DEPRECATED, [
        {"kv": 0.3, "queries": 0, "hits": 0}, {"kv": 0.5, "queries": 400, "hits": 100},
    ])
    panels = panels_of(p)
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([30, 50])
    assert values(panels["cache"]["prefix-cache hit rate"]) == pytest.approx([25])


def test_vllm_v0_hit_rate_gauge(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", VLLM_V0, [
        {"running": 4, "waiting": 1, "kv": 0.25, "hit_rate": 0.0, "preempt": 0},
        {"running": 6, "waiting": 3, "kv": 0.75, "hit_rate": 0.42, "preempt": 2},
        {"running": 6, "waiting": 2, "kv": 0.5, "hit_rate": 0.5, "preempt": 7},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [4, 6, 6]
    assert values(panels["requests"]["waiting (server queue)"]) == [1, 3, 2]
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([25, 75, 50])
    hit = panels["cache"]["prefix-cache hit rate"]
    assert hit.t_s.tolist() == [0, 1, 2] and values(hit) == pytest.approx([0, 42, 50])  # the gauge, in %
    assert values(panels["preemptions"]["preemptions"]) == [2, 5]


def test_vllm_v0_without_prefix_caching_has_no_hit_rate(tmp_path):
    # BlockAllocator.get_prefix_cache_hit_rate: "-1 means not supported or disabled"
    p = write_scrapes(tmp_path / "server_metrics.jsonl", VLLM_V0, [
        {"running": 1, "waiting": 0, "kv": 0.1, "hit_rate": -1, "preempt": 0},
        {"running": 1, "waiting": 0, "kv": 0.1, "hit_rate": -1, "preempt": 0},
    ])
    assert list(panels_of(p)["cache"]) == ["KV cache usage"]


# ---- SGLang -------------------------------------------------------------------------------------------------


def test_sglang(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", SGLANG, [
        {"running": 3, "waiting": 0, "kv": 0.12, "retracted": 0, "compute": 0, "cached": 0},
        {"running": 16, "waiting": 7, "kv": 0.81, "retracted": 4, "compute": 3000, "cached": 1000},
        {"running": 16, "waiting": 12, "kv": 0.97, "retracted": 10, "compute": 3000, "cached": 1000},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [3, 16, 16]
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 7, 12]
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([12, 81, 97])
    # from the prefill_cache / (prefill_cache + prefill_compute) counters, not the 0.99 gauge beside them
    hit = panels["cache"]["prefix-cache hit rate"]
    assert hit.t_s.tolist() == [1, 2] and same(values(hit), [25, float("nan")])  # no prefill in the 2nd interval
    assert values(panels["preemptions"]["retractions"]) == [4, 6]


def test_sglang_data_parallel_ranks_add_up(tmp_path):
    rank1 = SGLANG.replace('tp_rank="0"', 'tp_rank="1"').replace('moe_ep_rank="0"', 'moe_ep_rank="1"')
    rank1 = "\n".join(ln for ln in rank1.splitlines() if not ln.startswith("#"))  # one HELP/TYPE per family
    text = SGLANG.replace('engine_type="unified"', 'dp_rank="0",engine_type="unified"') + \
        rank1.replace('engine_type="unified"', 'dp_rank="1",engine_type="unified"') + "\n"
    p = write_scrapes(tmp_path / "server_metrics.jsonl", text, [
        {"running": 2, "waiting": 1, "kv": 0.2, "retracted": 0, "compute": 0, "cached": 0},
        {"running": 5, "waiting": 3, "kv": 0.6, "retracted": 1, "compute": 100, "cached": 300},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [4, 10]  # counts add up over ranks
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([20, 60])  # fractions average
    assert values(panels["cache"]["prefix-cache hit rate"]) == pytest.approx([75])
    assert values(panels["preemptions"]["retractions"]) == [2]


def test_sglang_tensor_parallel_ranks_reporting_one_batch_count_once(tmp_path):
    # --enable-metrics-for-all-schedulers: every tensor-parallel rank's scheduler logs the batch they share
    rank1 = "\n".join(ln for ln in SGLANG.replace('tp_rank="0"', 'tp_rank="1"').splitlines()
                       if not ln.startswith("#"))
    p = write_scrapes(tmp_path / "server_metrics.jsonl", SGLANG + rank1 + "\n", [
        {"running": 2, "waiting": 1, "kv": 0.2, "retracted": 0, "compute": 0, "cached": 0},
        {"running": 5, "waiting": 3, "kv": 0.6, "retracted": 1, "compute": 100, "cached": 300},
    ])
    s = load_server_metrics(p)
    assert s is not None and s.by_name["sglang:num_running_reqs"].tolist() == [2, 5]  # not [4, 10]
    panels = panels_of(p)
    assert values(panels["requests"]["waiting (server queue)"]) == [1, 3]
    assert values(panels["preemptions"]["retractions"]) == [1]
    assert values(panels["cache"]["prefix-cache hit rate"]) == pytest.approx([75])


# SGLang's tokenizer-side counters (TokenizerMetricsCollector): cached prompt tokens of finished requests.
SGLANG_TOKENIZER = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{model_name="m"}} {cached}
"""


def test_sglang_cached_tokens_counter_when_there_are_no_realtime_token_counters(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", SGLANG_OLD + SGLANG_TOKENIZER, [
        {"running": 1, "waiting": 0, "kv": 0.1, "hit_rate": 0.9, "prompt": 0, "cached": 0},
        {"running": 2, "waiting": 0, "kv": 0.2, "hit_rate": 0.9, "prompt": 1000, "cached": 600},
    ])
    hit = panels_of(p)["cache"]["prefix-cache hit rate"]
    assert hit.t_s.tolist() == [1] and values(hit) == pytest.approx([60])  # the counters, not the gauge


def test_sglang_hit_rate_gauge_when_there_are_no_token_counters(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", SGLANG_OLD, [
        {"running": 1, "waiting": 0, "kv": 0.05, "hit_rate": 0.0},
        {"running": 9, "waiting": 4, "kv": 0.6, "hit_rate": 0.37},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [1, 9]
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 4]
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([5, 60])
    hit = panels["cache"]["prefix-cache hit rate"]
    assert hit.t_s.tolist() == [0, 1] and values(hit) == pytest.approx([0, 37])
    assert panels["preemptions"] == {}


# ---- TGI ----------------------------------------------------------------------------------------------------


def test_tgi(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", TGI, [
        {"running": 0, "waiting": 0}, {"running": 32, "waiting": 5}, {"running": 32, "waiting": 11},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [0, 32, 32]
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 5, 11]
    assert panels["cache"] == {} and panels["preemptions"] == {}  # TGI exports neither


# ---- llama.cpp ----------------------------------------------------------------------------------------------


def test_llamacpp(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", LLAMACPP, [
        {"running": 1, "waiting": 0}, {"running": 4, "waiting": 6}, {"running": 4, "waiting": 2},
    ])
    panels = panels_of(p)
    assert values(panels["requests"]["running (server)"]) == [1, 4, 4]
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 6, 2]
    assert panels["cache"] == {} and panels["preemptions"] == {}


def test_llamacpp_before_mid_2025_reports_kv_usage(tmp_path):
    p = write_scrapes(tmp_path / "server_metrics.jsonl", LLAMACPP + LLAMACPP_OLD_KV, [
        {"running": 1, "waiting": 0, "kv": 0.031}, {"running": 4, "waiting": 6, "kv": 0.5},
    ])
    panels = panels_of(p)
    assert values(panels["cache"]["KV cache usage"]) == pytest.approx([3.1, 50])
    assert values(panels["requests"]["waiting (server queue)"]) == [0, 6]


# ---- through the report -------------------------------------------------------------------------------------


@pytest.mark.parametrize("template, scrapes, markers", [
    (SGLANG, [{"running": 3, "waiting": 0, "kv": 0.1, "retracted": 0, "compute": 0, "cached": 0},
              {"running": 9, "waiting": 4, "kv": 0.8, "retracted": 2, "compute": 50, "cached": 50}],
     ("server: KV cache and prefix cache (%)", "server: preemptions per second", "waiting (server queue)",
      "prefix-cache hit rate", "retractions")),
    (TGI, [{"running": 0, "waiting": 0}, {"running": 8, "waiting": 2}], ("waiting (server queue)",)),
], ids=["sglang", "tgi"])
def test_the_report_draws_other_servers_panels(tmp_path, template, scrapes, markers):
    sweep = write_synthetic_sweep(tmp_path / "s", [2.0], 40, with_server_metrics=False)
    write_scrapes(sweep / "rate-2" / "server_metrics.jsonl", template, scrapes)
    html = build_report([sweep], tmp_path / "r.html").read_text()
    for marker in markers:
        assert marker in html, marker
    if template is TGI:
        assert "server: KV cache and prefix cache (%)" not in html  # no panel for what TGI does not export
