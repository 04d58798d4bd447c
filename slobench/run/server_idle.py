"""After a run stops early: wait until the server has let go of the requests it cancelled.

A stopped probe closes its connections, and vLLM, SGLang and the bundled engine abort a request whose
client went away, but not at once: a server still holds the aborted requests for a moment (the bundled
engine over HTTP, after 100 cancelled streams: ~0.15 s, and a probe that started at once saw TTFTs of
0.47 s on its first requests, below capacity). A whole probe never has this problem: it waits for its
last request. So the next probe starts only once the server's own gauges say nothing runs or waits, read
from its Prometheus /metrics (vLLM's and SGLang's names, which the bundled engine serves too). A server
without them cannot be waited for; the stopped run says so (`server_idle`), and the next probe starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from slobench.redact import redact_url
from slobench.run.scrape import parse_samples
from slobench.targets.transport import ControlClient, TransportError

# gauges of requests a server runs or queues: vLLM's (and the bundled engine's), SGLang's
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:num_running_reqs",
               "sglang:num_queue_reqs")
IDLE_TIMEOUT_S = 60.0  # the longest a stopped probe waits for the server to go idle
POLL_S = 0.05
READ_TIMEOUT_S = 5.0  # one read of /metrics


Samples = Callable[[], Awaitable[Mapping[str, float]]]


def busy_requests(samples: Mapping[str, float]) -> float | None:
    """Requests running or waiting, summed over the busy gauges and their labels; None: the server has none."""
    found = [v for key, v in samples.items() if key.split("{", 1)[0] in BUSY_GAUGES]
    return sum(found) if found else None


def http_samples(metrics_urls: Sequence[str], headers: Mapping[str, str], max_body_bytes: int) -> Samples:
    """Each server's /metrics read once, as one set of samples (each replica labelled)."""

    async def fetch() -> Mapping[str, float]:
        out: dict[str, float] = {}
        async with ControlClient(timeout_s=READ_TIMEOUT_S, headers=headers, max_body_bytes=max_body_bytes,
                                 limit_flag="--max-metrics-body") as client:
            for i, url in enumerate(metrics_urls):
                reply = await client.get(url)
                if reply.status != 200:
                    raise TransportError("error", f"{redact_url(url)}: HTTP {reply.status}")
                out |= parse_samples(reply.text, {"replica": str(i)} if len(metrics_urls) > 1 else None)
        return out

    return fetch


def local_samples(metrics_text: Callable[[], str | bytes]) -> Samples:
    """An in-process engine's metrics, rendered here."""

    async def fetch() -> Mapping[str, float]:
        text = metrics_text()
        return parse_samples(text.decode() if isinstance(text, bytes) else text)

    return fetch


async def wait_idle(fetch: Samples, *, timeout_s: float = IDLE_TIMEOUT_S, poll_s: float = POLL_S) -> dict[str, Any]:
    """Poll the server's metrics until nothing runs or waits. What it found, for the stopped run's record:
    `idle_after_s`, or `busy` (still busy at the timeout), or `unknown` (why it could not tell)."""
    t0 = time.monotonic()
    while True:
        try:
            busy = busy_requests(await fetch())
        except (TransportError, OSError, ValueError) as e:  # no /metrics, not Prometheus text: nothing to wait for
            return {"unknown": f"the server's metrics could not be read ({e})"}
        if busy is None:
            return {"unknown": "the server's metrics have no running or waiting gauge"}
        waited = time.monotonic() - t0
        if busy == 0:
            return {"idle_after_s": round(waited, 3)}
        if waited >= timeout_s:
            return {"busy": busy, "waited_s": round(waited, 3)}
        await asyncio.sleep(poll_s)
