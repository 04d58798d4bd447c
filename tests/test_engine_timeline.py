"""Server-state timelines for runs against the in-process engine: the same exposition as its HTTP /metrics,
scraped locally into server_metrics.jsonl, so the report draws queue, KV cache and preemptions."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.metrics import EngineMetrics
from reference_engine.tokenizer import ByteTokenizer
from slobench.cli import main
from slobench.report import build_report
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.run.scrape import MetricsScraper, parse_samples, sample_key
from slobench.targets.engine import EngineTarget

LABELS = {"model_name": "tiny"}
RUNNING = sample_key("vllm:num_requests_running", LABELS)
WAITING = sample_key("vllm:num_requests_waiting", LABELS)
KV_USAGE = sample_key("vllm:kv_cache_usage_perc", LABELS)
PREEMPTIONS = sample_key("vllm:num_preemptions_total", LABELS)
# Subplot titles of the timeline's server rows (slobench/report/timeline.py) and a series of its requests row.
SERVER_PANELS = ("server: KV cache and prefix cache (%)", "server: preemptions per second", "waiting (server queue)")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now_s(self) -> float:
        return self.t


def make_engine(num_blocks: int = 64) -> LLMEngine:
    tok = ByteTokenizer()
    ex = ModeledExecutor(CostProfile("flat-2ms", 0.002, 0.0, 0.0, 0.0), block_size=16, num_blocks=num_blocks,
                         vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id, token_id_range=(32, 127))
    return LLMEngine(EngineConfig(block_size=16, num_blocks=num_blocks, max_model_len=512), ex)


# ---- the scraper over a local source ---------------------------------------------------------------------


async def test_local_source_keeps_absolute_deadlines_and_decodes_bytes(tmp_path):
    clock = FakeClock()
    sleeps: list[float] = []
    threads: list[str] = []

    def render() -> bytes:
        threads.append(threading.current_thread().name)
        clock.t += 0.3  # each render takes 0.3 s of run time: deadlines must not drift by it
        return f"# TYPE q gauge\nq {len(sleeps)}\n".encode()

    async def fake_sleep(dt: float) -> None:
        sleeps.append(dt)
        if len(sleeps) == 3:
            raise asyncio.CancelledError
        clock.t += dt

    out = tmp_path / "server_metrics.jsonl"
    scraper = MetricsScraper(render, out, 1.0, sleep=fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await scraper(clock)
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [ln["t_s"] for ln in lines] == [0.0, 1.0, 2.0]
    assert [ln["samples"]["q"] for ln in lines] == [0.0, 1.0, 2.0]
    assert sleeps == pytest.approx([0.7, 0.7, 0.7])
    assert scraper.num_scrapes == 3 and scraper.metrics_url is None
    assert threading.main_thread().name not in threads  # rendered off the event loop


async def test_local_source_that_is_not_metrics_leaves_no_file(tmp_path):
    async def never_sleep(dt: float) -> None:
        raise AssertionError("scraper kept going without metrics")

    scraper = MetricsScraper(lambda: "<html>no</html>", tmp_path, 0.5, sleep=never_sleep)
    await scraper(FakeClock())
    assert not (tmp_path / "server_metrics.jsonl").exists()
    assert scraper.disabled_reason and "not Prometheus text" in scraper.disabled_reason


def test_headers_are_refused_for_a_local_source(tmp_path):
    with pytest.raises(ValueError, match="headers"):
        MetricsScraper(lambda: "", tmp_path, headers={"a": "b"})


# ---- EngineTarget.metrics_text ---------------------------------------------------------------------------


async def test_metrics_text_tracks_the_engine_and_fills_latency_histograms():
    target = EngineTarget(make_engine(), model_name="tiny")
    idle = parse_samples(target.metrics_text())
    assert idle[RUNNING] == 0 and idle[WAITING] == 0 and idle[KV_USAGE] == 0
    specs = [RequestSpec(i, 0.0, tuple(40 + i for _ in range(40)), 40, 6) for i in range(5)]
    async with target:
        res = await run(specs, target, opts=RunOptions(progress=False))
    assert all(r.error is None for r in res.records)
    done = parse_samples(target.metrics_text())
    assert done[sample_key("vllm:generation_tokens_total", LABELS)] == 30
    # the target installed its metrics as the engine's observer: per-token latencies were recorded
    assert done[sample_key("vllm:time_to_first_token_seconds_count", LABELS)] == 5
    assert done[sample_key("vllm:e2e_request_latency_seconds_count", LABELS)] == 5


def test_an_engine_shared_with_a_server_keeps_its_metrics():
    engine = make_engine()
    shared = EngineMetrics("tiny", engine.stats)
    engine.observer = shared
    target = EngineTarget(engine, model_name="tiny", keep_running=True)
    shared.observe_ttft(0.5)
    assert engine.observer is shared
    assert parse_samples(target.metrics_text())[sample_key("vllm:time_to_first_token_seconds_count", LABELS)] == 1


# ---- end to end: slobench run --engine modeled, then its report ------------------------------------------


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 60 tiny requests at 60 req/s into 48 KV blocks: past the cpu-tiny model's cliff (about 30 req/s
    # completed), the queue grows and blocks run out, so requests are preempted. About 3 s.
    out = tmp_path_factory.mktemp("eng") / "run"
    rc = main(["run", "--engine", "modeled", "--workload", "tiny", "--rate", "60", "--num-requests", "60",
               "--kv-blocks", "48", "--scrape-interval", "0.1", "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def test_engine_run_writes_server_metrics(engine_run: Path):
    lines = [json.loads(ln) for ln in (engine_run / "server_metrics.jsonl").read_text().splitlines()]
    assert len(lines) >= 5
    t = [ln["t_s"] for ln in lines]
    assert all(b > a for a, b in zip(t, t[1:], strict=False))
    for key in (RUNNING, WAITING, KV_USAGE, PREEMPTIONS):
        assert all(key in ln["samples"] for ln in lines), key
    assert max(ln["samples"][WAITING] for ln in lines) > 0  # a queue formed and the timeline saw it
    assert max(ln["samples"][KV_USAGE] for ln in lines) > 0.5
    assert lines[-1]["samples"][PREEMPTIONS] > 0


def test_engine_run_report_has_server_panels(engine_run: Path, tmp_path: Path):
    html = build_report([engine_run], tmp_path / "r.html").read_text()
    for marker in SERVER_PANELS:
        assert marker in html, marker
    # the markers come from the scraped file: without it the same run has no server panels
    (engine_run / "server_metrics.jsonl").rename(tmp_path / "kept.jsonl")
    try:
        bare = build_report([engine_run], tmp_path / "bare.html").read_text()
    finally:
        (tmp_path / "kept.jsonl").rename(engine_run / "server_metrics.jsonl")
    assert not any(marker in bare for marker in SERVER_PANELS)
