import asyncio
import json
import socket

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from slobench.run.scrape import MetricsScraper, metrics_url_for, parse_samples, sample_key
from slobench.targets.openai import OpenAITarget
from slobench.targets.transport import endpoint_url


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now_s(self) -> float:
        return self.t


def _registry():
    reg = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=reg)
    waiting.labels('m"<x>').set(3)
    Counter("vllm:num_preemptions", "preemptions", registry=reg).inc(2)
    h = Histogram("vllm:time_to_first_token_seconds", "ttft", registry=reg)
    h.observe(0.25)
    return reg, waiting


async def _serve(app: web.Application):
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, sock.getsockname()[1]


def test_metrics_url_for():
    assert metrics_url_for("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url_for("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url_for("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url_for("http://h:8000/v1?api_key=k") == "http://h:8000/metrics?api_key=k"
    assert metrics_url_for("http://h/proxy/v1/?a=1&b=2") == "http://h/proxy/metrics?a=1&b=2"


def test_endpoints_go_under_the_base_path_before_its_query():
    assert endpoint_url("http://h/v1?api_key=k", "/models") == "http://h/v1/models?api_key=k"
    assert endpoint_url("http://h/v1/", "/completions") == "http://h/v1/completions"
    assert OpenAITarget("http://h:8000?api_key=k").url == "http://h:8000/v1/completions?api_key=k"
    assert OpenAITarget("http://h:8000/v1/?k=1#frag").base_url == "http://h:8000/v1?k=1"


def test_parse_samples_keeps_gauges_counters_sums_not_buckets():
    reg, _ = _registry()
    s = parse_samples(generate_latest(reg).decode())
    assert s[sample_key("vllm:num_requests_waiting", {"model_name": 'm"<x>'})] == 3.0
    assert s["vllm:num_preemptions_total"] == 2.0
    assert s["vllm:time_to_first_token_seconds_sum"] == 0.25
    assert s["vllm:time_to_first_token_seconds_count"] == 1.0
    assert not any("_bucket" in k or "_created" in k for k in s)
    with pytest.raises(ValueError):
        parse_samples("<html>not metrics</html>")


async def test_scraper_writes_samples_on_absolute_deadlines(tmp_path):
    reg, waiting = _registry()
    clock = FakeClock()
    sleeps: list[float] = []

    async def handler(request):
        clock.t += 0.3  # each scrape takes 0.3 s of run time: deadlines must not drift by it
        waiting.labels('m"<x>').set(len(sleeps))
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner, port = await _serve(app)

    async def fake_sleep(dt: float) -> None:
        sleeps.append(dt)
        if len(sleeps) == 4:
            raise asyncio.CancelledError  # the runner cancels its monitors at the end of a run
        clock.t += dt

    out = tmp_path / "server_metrics.jsonl"
    scraper = MetricsScraper(metrics_url_for(f"http://127.0.0.1:{port}/v1"), out, 1.0, sleep=fake_sleep)
    try:
        with pytest.raises(asyncio.CancelledError):
            await scraper(clock)
    finally:
        await runner.cleanup()
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [ln["t_s"] for ln in lines] == [0.0, 1.0, 2.0, 3.0]
    assert sleeps == pytest.approx([0.7, 0.7, 0.7, 0.7])
    key = sample_key("vllm:num_requests_waiting", {"model_name": 'm"<x>'})
    assert [ln["samples"][key] for ln in lines] == [0.0, 1.0, 2.0, 3.0]
    assert all(ln["samples"]["vllm:num_preemptions_total"] == 2.0 for ln in lines)
    assert scraper.num_scrapes == 4


async def test_overrun_skips_missed_ticks(tmp_path):
    reg, _ = _registry()
    clock = FakeClock()
    sleeps: list[float] = []

    async def handler(request):
        clock.t += 2.5  # slower than the interval
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner, port = await _serve(app)

    async def fake_sleep(dt: float) -> None:
        sleeps.append(dt)
        if len(sleeps) == 2:
            raise asyncio.CancelledError
        clock.t += dt

    out = tmp_path / "m.jsonl"
    try:
        with pytest.raises(asyncio.CancelledError):
            await MetricsScraper(f"http://127.0.0.1:{port}/metrics", out, 1.0, sleep=fake_sleep)(clock)
    finally:
        await runner.cleanup()
    # scrape at 0 ends at 2.5 -> next deadline 3.0 (ticks 1 and 2 skipped), not 2.5 + 1.0
    assert [json.loads(ln)["t_s"] for ln in out.read_text().splitlines()] == [0.0, 3.0]
    assert sleeps == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("mode", ["404", "html", "refused"])
async def test_no_endpoint_leaves_no_file_and_no_error(tmp_path, mode):
    app = web.Application()
    if mode == "html":

        async def html(request):
            return web.Response(text="<html>hi there</html>", content_type="text/html")

        app.router.add_get("/metrics", html)
    runner, port = await _serve(app)
    if mode == "refused":
        await runner.cleanup()
    out = tmp_path / "server_metrics.jsonl"

    async def never_sleep(dt: float) -> None:  # the scraper must stop before it ever waits
        raise AssertionError("scraper kept going without an endpoint")

    scraper = MetricsScraper(f"http://127.0.0.1:{port}/metrics", out, 0.5, sleep=never_sleep)
    try:
        await asyncio.wait_for(scraper(FakeClock()), timeout=10)
    finally:
        if mode != "refused":
            await runner.cleanup()
    assert not out.exists()
    assert scraper.disabled_reason


def test_out_path_may_be_the_run_dir(tmp_path):
    s = MetricsScraper("http://x/metrics", tmp_path)
    assert s.out_path == tmp_path / "server_metrics.jsonl"
    with pytest.raises(ValueError, match="interval_s"):
        MetricsScraper("http://x/metrics", tmp_path, 0)


async def test_several_urls_are_one_line_a_scrape_labelled_by_replica(tmp_path):
    from slobench.report.server_state import load_server_metrics

    servers = []
    for waiting in (3, 5):
        reg = CollectorRegistry()
        Gauge("vllm:num_requests_waiting", "waiting", registry=reg).set(waiting)
        Gauge("vllm:kv_cache_usage_perc", "kv", registry=reg).set(waiting / 10)
        text = generate_latest(reg)

        async def handler(request, text=text):
            return web.Response(body=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", handler)
        servers.append(await _serve(app))
    clock = FakeClock()
    ticks = []

    async def two_ticks(s):
        ticks.append(s)
        clock.t += 1.0
        if len(ticks) == 2:
            raise asyncio.CancelledError

    urls = [f"http://127.0.0.1:{port}/metrics" for _, port in servers]
    out = tmp_path / "server_metrics.jsonl"
    try:
        with pytest.raises(asyncio.CancelledError):
            await MetricsScraper(urls, out, 1.0, sleep=two_ticks)(clock)
    finally:
        for runner, _ in servers:
            await runner.cleanup()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2
    assert lines[0]["samples"]['vllm:num_requests_waiting{replica="0"}'] == 3.0
    assert lines[0]["samples"]['vllm:num_requests_waiting{replica="1"}'] == 5.0
    fleet = load_server_metrics(out)
    assert fleet.by_name["vllm:num_requests_waiting"][0] == 8.0  # queues add up
    assert fleet.by_name["vllm:kv_cache_usage_perc"][0] == pytest.approx(0.4)  # usage averages
    with pytest.raises(ValueError, match="no /metrics URL"):
        MetricsScraper([], out)


@pytest.mark.parametrize("mode", ["404", "refused"])
async def test_why_no_metrics_names_the_url_without_its_password(tmp_path, mode):
    # the reason is printed ("no server metrics scraped (...)"): a URL's password must not be in it
    runner, port = await _serve(web.Application())
    if mode == "refused":
        await runner.cleanup()

    async def never_sleep(dt: float) -> None:
        raise AssertionError("scraper kept going without an endpoint")

    scraper = MetricsScraper(f"http://user:s3cretPASS@127.0.0.1:{port}/metrics", tmp_path / "m.jsonl", 0.5,
                             sleep=never_sleep)
    try:
        await asyncio.wait_for(scraper(FakeClock()), timeout=10)
    finally:
        if mode != "refused":
            await runner.cleanup()
    assert scraper.disabled_reason and "127.0.0.1" in scraper.disabled_reason
    assert "s3cretPASS" not in scraper.disabled_reason
