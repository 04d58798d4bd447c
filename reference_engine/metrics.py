"""Prometheus metrics under vLLM's names, verbatim, so one scraper serves vLLM and this engine.

Gauges and monotonic counts are read from `LLMEngine.stats()` at scrape time (a custom collector), so the
engine keeps plain integers and pays nothing per step for them; latency histograms are observed as they
happen. Each instance has its own CollectorRegistry (no process-global state, several engines per process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reference_engine.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets, with finer low ends: a modeled GPU step is a few milliseconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats], model_name: str) -> None:
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels = ["model_name"]
        values = [self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)  # exposed as name + "_total"
            c.add_metric(values, value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", s.kv_cache_usage)
        yield counter("vllm:num_preemptions", "Preemptions (by recompute) so far.", s.num_preemptions)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s.num_prefix_query_tokens)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.num_prefix_hit_tokens)
        yield counter("vllm:prompt_tokens", "Prompt tokens of requests that produced a first token.",
                      s.num_prompt_tokens)
        yield counter("vllm:generation_tokens", "Tokens generated.", s.num_generation_tokens)
        yield gauge("slobench_engine:kv_blocks_in_use", "KV blocks held by requests (0 when idle).",
                    s.num_blocks_in_use)
        yield gauge("slobench_engine:kv_blocks_free", "KV blocks free and unreachable.", s.num_blocks_free)
        yield gauge("slobench_engine:kv_blocks_cached", "Idle KV blocks kept for prefix reuse.", s.num_blocks_cached)
        yield gauge("slobench_engine:kv_blocks_total", "KV blocks in the cache.", s.num_blocks)
        yield counter("slobench_engine:steps", "Engine steps run.", s.num_steps)
        yield counter("slobench_engine:idle_check_failures", "Idle checks that found blocks unaccounted for.",
                      s.num_idle_check_failures)


class EngineMetrics:
    """The engine's StatsObserver and the /metrics exposition."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                               buckets=TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens.", labels,
                              buckets=ITL_BUCKETS, registry=self.registry).labels(model_name)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to finish.", labels,
                              buckets=REQUEST_BUCKETS, registry=self.registry).labels(model_name)
        self._queue = Histogram("vllm:request_queue_time_seconds", "Time waiting before first scheduled.", labels,
                                buckets=REQUEST_BUCKETS, registry=self.registry).labels(model_name)
        self._iteration = Histogram("vllm:iteration_tokens_total", "Tokens computed per engine step.", labels,
                                    buckets=ITERATION_TOKEN_BUCKETS, registry=self.registry).labels(model_name)
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._model_name = model_name
        self.registry.register(_StatsCollector(stats, model_name))

    def observe_iteration_tokens(self, num_tokens: int) -> None:
        self._iteration.observe(num_tokens)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def observe_finished(self, finish_reason: str, e2e_s: float, queue_s: float | None) -> None:
        self._success.labels(self._model_name, finish_reason).inc()
        self._e2e.observe(e2e_s)
        if queue_s is not None:
            self._queue.observe(queue_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
