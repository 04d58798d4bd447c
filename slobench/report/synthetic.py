"""Synthetic sweep directories with a real-looking attainment cliff, for the report's tests and benchmark.

Not a simulator: one FIFO queue (Lindley's recursion) in front of a server of `capacity_rps`, decode slowing
as the queue fills, a few failures. Enough that TTFT explodes past capacity and the report has a knee to
find. The files are written through the same writers a real run uses (RunWriter, sweep.json layout).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from slobench.analysis.headline import headline
from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.run.records import RequestRecord
from slobench.run.rundir import SERVER_METRICS, RunWriter, rate_dir_name, write_sweep
from slobench.version import __version__

DEFAULT_SLO = SLO(ttft_s=0.5, tpot_s=0.05)


def synthetic_records(
    rate_rps: float,
    num_requests: int,
    *,
    capacity_rps: float = 10.0,
    median_output_tokens: int = 32,
    seed: int = 0,
    error_text: str = "HTTP 500: upstream error",
    tags: Sequence[str] = (),
) -> list[RequestRecord]:
    """Records of one open-loop run at `rate_rps` against the toy queue. `tags` split the run into phases."""
    rng = np.random.default_rng(seed)
    n = num_requests
    sched = np.cumsum(rng.exponential(1 / rate_rps, n))
    sched -= sched[0]
    sent = sched + rng.exponential(0.0004, n)
    service = rng.exponential(1 / capacity_rps, n)
    wait = np.zeros(n)
    for i in range(1, n):  # Lindley: W[i] = max(0, W[i-1] + S[i-1] - A[i])
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - (sent[i] - sent[i - 1]))
    ttft = wait + 0.3 * service + 0.02
    util = min(rate_rps / capacity_rps, 1.5)
    out_tok = np.clip(rng.lognormal(np.log(median_output_tokens), 0.6, n).astype(int), 1, 16 * median_output_tokens)
    tpot = 0.02 * (1 + 1.2 * util**2) * rng.lognormal(0, 0.15, n)
    failed = rng.random(n) < 0.003
    timeout_s = 30.0
    recs = []
    for i in range(n):
        r = RequestRecord(
            request_id=i, scheduled_s=float(sched[i]), sent_s=float(sent[i]), input_tokens=256, max_tokens=int(out_tok[i]),
            tag=tags[min(len(tags) - 1, i * len(tags) // n)] if tags else "",
        )
        if failed[i]:
            r.fail("error", error_text, float(sent[i] + 0.01))
            r.http_status = 500
        elif ttft[i] > timeout_s:
            r.fail("timeout", f"no first token within {timeout_s:g}s", float(sent[i] + timeout_s))
        else:
            first = sent[i] + ttft[i]
            k = int(out_tok[i])
            times = first + np.arange(k) * tpot[i]
            r.first_token_s = float(first)
            r.chunk_times_s = times.tolist()
            r.chunk_tokens = [1] * k
            r.done_s = float(times[-1])
            r.output_tokens = k
            r.prompt_tokens = 256
        recs.append(r)
    return recs


def synthetic_server_metrics(records: Sequence[RequestRecord], *, interval_s: float = 1.0) -> list[dict[str, Any]]:
    """vLLM-named samples derived from the records (waiting = sent but no first token yet, and so on)."""
    inf = np.inf
    sent = np.array([r.sent_s if r.sent_s is not None else inf for r in records])
    first = np.array([r.first_token_s if r.first_token_s is not None else inf for r in records])
    done = np.array([r.done_s if r.done_s is not None else inf for r in records])
    end = float(np.nanmax(np.where(np.isfinite(done), done, np.nan)))
    t = np.arange(0.0, end + interval_s, interval_s)

    def at_or_before(x: np.ndarray) -> np.ndarray:  # how many of x are <= each t: O(n log n), not O(n x scrapes)
        return np.searchsorted(np.sort(x), t, side="right")

    # sent <= t < first is sent <= t less max(sent, first) <= t; likewise first <= t < done
    waiting = at_or_before(sent) - at_or_before(np.maximum(sent, first))
    running = at_or_before(first) - at_or_before(np.maximum(first, done))
    preempt = np.cumsum(np.maximum(0, waiting - 20) * 0.1)
    queries = np.cumsum(256.0 * (waiting + running))
    hits = np.cumsum(100.0 * (waiting + running))
    lines = []
    for i, ti in enumerate(t.tolist()):
        w, r = int(waiting[i]), int(running[i])
        lines.append({"t_s": ti, "samples": {
            'vllm:num_requests_waiting{model_name="synthetic"}': float(w),
            'vllm:num_requests_running{model_name="synthetic"}': float(r),
            'vllm:kv_cache_usage_perc{model_name="synthetic"}': min(1.0, r / 64),
            'vllm:num_preemptions_total{model_name="synthetic"}': float(preempt[i]),
            'vllm:prefix_cache_hits_total{model_name="synthetic"}': float(hits[i]),
            'vllm:prefix_cache_queries_total{model_name="synthetic"}': float(queries[i]),
        }})
    return lines


def write_synthetic_sweep(
    out_dir: str | Path,
    rates: Sequence[float],
    num_per_rate: int,
    *,
    slo: SLO | None = DEFAULT_SLO,
    capacity_rps: float = 10.0,
    median_output_tokens: int = 32,
    seed: int = 0,
    model: str = "synthetic-model",
    workload_name: str = "synthetic",
    error_text: str = "HTTP 500: upstream error",
    tags: Sequence[str] = (),
    with_server_metrics: bool = True,
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "slobench_version": __version__,
        "workload_name": workload_name,
        "seed": seed,
        "target": {"url": "http://127.0.0.1:8000/v1", "model": model, "api": "completions", "stream": True},
        "slo": slo.to_dict() if slo else None,
    }
    rows: list[dict[str, Any]] = []
    for k, rate in enumerate(rates):
        recs = synthetic_records(
            rate, num_per_rate, capacity_rps=capacity_rps, median_output_tokens=median_output_tokens,
            seed=seed + k, error_text=error_text, tags=tags,
        )
        run_dir = out / rate_dir_name(rate)
        w = RunWriter(run_dir, {**manifest, "rate_rps": rate, "clock": {"wall_anchor_unix_s": 1.7e9 + 3600 * k}})
        for r in recs:
            w.write(r)
        summary = replace(summarize(recs, slo, seed=seed), rate_rps=rate)
        w.finish(summary)
        if with_server_metrics:
            with open(run_dir / SERVER_METRICS, "w") as fh:
                for line in synthetic_server_metrics(recs):
                    fh.write(json.dumps(line) + "\n")
        rows.append({"rate_rps": rate, "run_dir": run_dir.name, "summary": summary})
    write_sweep(out, {"manifest": manifest, "runs": rows, "headline": headline([r["summary"] for r in rows], slo)})
    return out
