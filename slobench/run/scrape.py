"""Poll a target's Prometheus `/metrics` while a run goes, into `server_metrics.jsonl` in the run directory.

One JSON line per scrape on the run's clock, so server state lines up with the records:
    {"t_s": 12.0, "samples": {"vllm:num_requests_waiting{model_name=\"m\"}": 3.0, ...}}
Gauges, counters and histograms' `_sum`/`_count` are kept; `_bucket` and `_created` samples are dropped.
A runner monitor (`MetricsScraper(url, path)`); the text may also come from this process (an in-process
engine's `metrics_text`), so both give the same timeline. A target without the endpoint (404, refused,
timed out, not Prometheus text) leaves no file and no error: the report has no server-state panel.
A scrape (its HTTP, decompression and parse) runs on an event loop in a thread of its own, within
`timeout_s` and a body of `max_body_bytes`: a slow, huge or compressed-bomb /metrics costs failed scrapes,
never the sender's schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from slobench.redact import redact_text, redact_url
from slobench.run.clock import Clock
from slobench.run.rundir import SERVER_METRICS
from slobench.targets.bounds import DEFAULT_MAX_METRICS_BODY_BYTES
from slobench.targets.transport import BodyTooLarge, ControlClient, TransportError

T = TypeVar("T")

_SKIP_SUFFIXES = ("_bucket", "_created", "_gcount_created")
_KEEP_OF_DISTRIBUTIONS = ("_sum", "_count", "_gsum", "_gcount")


def metrics_url_for(base_url: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000/metrics` (vLLM, SGLang, TGI serve it at the root); a
    query (a key some servers take there) stays on it."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit(parts._replace(path=path + "/metrics", fragment=""))


def sample_key(name: str, labels: dict[str, str]) -> str:
    """`name{a="x",b="y"}` with sorted labels, values escaped as in the exposition format."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_samples(text: str, extra_labels: dict[str, str] | None = None) -> dict[str, float]:
    """Prometheus text -> {sample key: value}, without buckets. Raises ValueError on text that is not metrics.
    `extra_labels` go on every sample (`replica="1"`: several servers' samples in one scrape line)."""
    # Bucket lines are dropped before parsing only to spare the load generator's CPU: they are ~90% of a
    # vLLM /metrics page and the parser is pure Python. The parser still reads everything that is kept.
    kept = "\n".join(ln for ln in text.splitlines() if not _line_name(ln).endswith("_bucket"))
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(kept):
        is_distribution = fam.type in ("histogram", "gaugehistogram", "summary")
        for s in fam.samples:
            if s.name.endswith(_SKIP_SUFFIXES):
                continue
            if is_distribution and not s.name.endswith(_KEEP_OF_DISTRIBUTIONS):
                continue  # summary quantiles
            v = float(s.value)
            if math.isfinite(v):
                out[sample_key(s.name, {**s.labels, **extra_labels} if extra_labels else s.labels)] = v
    return out


def _line_name(line: str) -> str:
    if line.startswith("#"):
        return ""
    return line.split("{", 1)[0].split(" ", 1)[0]


class _NoText(Exception):
    """A scrape that found no Prometheus text; the message says why. `final`: the next would fare no
    better (a page over the size limit), so scraping stops."""

    def __init__(self, why: str, *, final: bool = False) -> None:
        super().__init__(why)
        self.final = final


# one scrape's samples; raises _NoText, or ValueError for text that is not Prometheus text
Fetch = Callable[[], Awaitable[dict[str, float]]]


class _LoopThread:
    """An event loop in a daemon thread: what runs on it never delays the run's own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slobench-scrape", daemon=True)
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro`'s result, run on the thread's loop; cancelling the caller cancels it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def stop(self, last: Coroutine[Any, Any, Any]) -> None:
        """Cancel what still runs there, run `last` (a client's close), stop the loop and end the thread."""
        loop = self.loop

        async def shutdown() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            with contextlib.suppress(Exception):
                await last
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        await asyncio.to_thread(self._thread.join, 5.0)  # a parse in flight finishes first
        if not self._thread.is_alive():
            loop.close()


class MetricsScraper:
    """A runner monitor: `await scraper(clock)` scrapes every `interval_s` on absolute deadlines until cancelled.

    `source` is where the text comes from: a `/metrics` URL fetched over HTTP, or a callable returning the
    exposition (str or bytes) of something in this process, e.g. `EngineTarget.metrics_text`. The callable
    runs in a worker thread, so it must be safe to call from one. Both feed the same loop and writer. A page
    past `max_body_bytes` (decompressed) is a failed scrape.
    """

    def __init__(
        self,
        source: str | list[str] | Callable[[], str | bytes],
        out_path: str | Path,
        interval_s: float = 1.0,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        max_body_bytes: int = DEFAULT_MAX_METRICS_BODY_BYTES,
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds (got {interval_s!r})")
        if not isinstance(source, str) and headers:
            raise ValueError("headers apply to a /metrics URL, not to a local source")
        out = Path(out_path)
        if isinstance(source, list) and not source:
            raise ValueError("no /metrics URL to scrape")
        self.metrics_url: str | None = source if isinstance(source, str) else None
        # several URLs (a client-routed fleet): one scrape line holds every replica's samples, each
        # labelled replica="i"; the report adds counts and averages fractions across them
        self.metrics_urls: list[str] = source if isinstance(source, list) else []
        self._local: Callable[[], str | bytes] | None = None if isinstance(source, str | list) else source
        self.out_path = out / SERVER_METRICS if out.is_dir() else out
        self.interval_s = interval_s
        self.headers = dict(headers or {})
        # A scrape slower than the interval would only pile up; give up on it and take the next tick.
        self.timeout_s = timeout_s if timeout_s is not None else max(0.5, min(5.0, interval_s))
        self._sleep = sleep
        self.max_body_bytes = max_body_bytes
        self.num_scrapes = 0
        self.num_failed = 0
        self.disabled_reason: str | None = None  # why scraping stopped: no endpoint, or a page over the limit

    async def __call__(self, clock: Clock) -> None:
        async with self._open() as fetch:
            await self._loop(clock, fetch)

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[Fetch]:
        if self._local is not None:
            local = self._local

            def render_and_parse() -> dict[str, float]:
                # Rendering walks the registry: off the event loop like the parse, for the same reason.
                text = local()
                return parse_samples(text.decode() if isinstance(text, bytes) else text)

            async def fetch_local() -> dict[str, float]:
                return await asyncio.to_thread(render_and_parse)

            yield fetch_local
            return
        urls: list[str] = self.metrics_urls or [self.metrics_url or ""]
        thread = _LoopThread()
        client = ControlClient(timeout_s=self.timeout_s, headers=self.headers, max_body_bytes=self.max_body_bytes,
                               limit_flag="--max-metrics-body")

        async def get(url: str) -> str:
            try:
                resp = await client.get(url)
            except TransportError as e:  # a reason is printed: no URL password
                raise _NoText(redact_text(f"{url}: {e}"), final=isinstance(e, BodyTooLarge)) from None
            if resp.status != 200:
                raise _NoText(f"{redact_url(url)}: HTTP {resp.status}")
            return resp.text

        async def scrape() -> dict[str, float]:  # on the thread's loop, parse included
            if not self.metrics_urls:
                return parse_samples(await get(urls[0]))
            return _merge_replicas(list(await asyncio.gather(*(get(u) for u in urls))))

        async def fetch_http() -> dict[str, float]:
            return await thread.run(scrape())

        try:
            yield fetch_http
        finally:
            await thread.stop(client.close())

    async def _loop(self, clock: Clock, fetch: Fetch) -> None:
        writer = _LineWriter(self.out_path)
        try:
            start_s = clock.now_s()
            tick = 0
            while True:
                t_s = clock.now_s()
                samples, why, final = await self._scrape(fetch)
                if samples is None:
                    if self.num_scrapes == 0 and self.num_failed == 0:
                        self.disabled_reason = why
                        return  # no endpoint: silently absent
                    self.num_failed += 1
                    if final:
                        self.disabled_reason = why
                        return  # a page too large stays too large: no more scrapes cost the run CPU
                else:
                    try:
                        writer.write({"t_s": round(t_s, 6), "samples": samples})
                    except OSError as e:  # a full disk: the lines written stay, the scrapes stop and say why
                        self.disabled_reason = f"{self.out_path.name}: cannot write ({e.strerror or e})"
                        return
                    self.num_scrapes += 1
                # Absolute deadlines: tick k is due at start + k*interval, however long scrapes take;
                # a scrape that overran skips the ticks it missed instead of drifting.
                tick = max(tick + 1, math.floor((clock.now_s() - start_s) / self.interval_s) + 1)
                await self._sleep(max(0.0, start_s + tick * self.interval_s - clock.now_s()))
        finally:
            with contextlib.suppress(OSError):  # its lines were flushed as written; a failing close loses none
                writer.close()

    async def _scrape(self, fetch: Fetch) -> tuple[dict[str, float] | None, str, bool]:
        try:
            samples = await fetch()  # off the event loop: a scrape must not delay the requests being sent
        except _NoText as e:
            return None, str(e), e.final
        except ValueError as e:
            return None, f"not Prometheus text: {e}", False
        if not samples:
            return None, "no samples", False
        return samples, "", False


def _merge_replicas(texts: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, text in enumerate(texts):
        out.update(parse_samples(text, {"replica": str(i)}))
    return out


class _LineWriter:
    """JSON lines, opened at the first line (no scrape, no file) and flushed after each: a crash loses at
    most the scrape in progress, like requests.jsonl."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None

    def write(self, row: dict[str, Any]) -> None:
        if self._fh is None:
            self._fh = open(self.path, "w")
        self._fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
