"""Time to the first answer token is measured as well as TTFT: against the token server's reasoning mode
(TTFT 50 ms, ITL 5 ms, the first 8 tokens reasoning) at 100 requests/s, each request's client-side TTFA
and TTFT are compared with the server's own log of when it wrote those tokens (one system-wide clock)."""

from __future__ import annotations

import asyncio
import statistics
import uuid

import pytest

from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration
REASONING = 8


async def _round(token_server: TokenServerProcess) -> tuple[float, float]:
    """Median |client - server| of TTFA and of TTFT (s) over 40 requests."""
    clock = Clock()
    ids = [f"ttfa-{uuid.uuid4().hex[:8]}-{i}" for i in range(40)]
    options = TargetOptions(model=token_server.model, api="chat")
    async with OpenAITarget(token_server.base_url, options, clock) as target:
        async def one(i: int) -> RequestRecord:
            await asyncio.sleep(i * 0.01)  # 100 requests/s
            rec = RequestRecord(i, 0.0)
            body = (("x_request_id", ids[i]), ("x_reasoning_tokens", REASONING))
            await target.send(RequestSpec(i, 0.0, "think", 3, 16, extra_body=body), rec)
            return rec

        records = await asyncio.gather(*(one(i) for i in range(40)))
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    log = {line["id"]: line for line in token_server.read_log()}
    origin_s = clock.origin_ns * 1e-9
    ttft_err, ttfa_err = [], []
    for r in records:
        line = log[ids[r.request_id]]
        assert r.first_token_s is not None and r.first_answer_s is not None and r.sent_s is not None
        sent = origin_s + r.sent_s
        ttft_err.append(abs((origin_s + r.first_token_s - sent) - (line["chunk_s"][0] - line["recv_s"])))
        ttfa_err.append(abs((origin_s + r.first_answer_s - sent) - (line["chunk_s"][REASONING] - line["recv_s"])))
    return statistics.median(ttfa_err), statistics.median(ttft_err)


async def test_ttfa_error_is_at_the_level_of_ttft(token_server: TokenServerProcess) -> None:
    rounds = []
    for _ in range(3):  # a round whose client was starved of CPU by a neighbour is measured again
        ttfa_err, ttft_err = await _round(token_server)
        rounds.append((ttfa_err, ttft_err))
        if ttfa_err < 0.001 and ttfa_err < ttft_err + 0.0005:
            break
    # the target: TTFA's error at TTFT's level, p50 under 1 ms at 100 requests/s
    assert ttfa_err < 0.001, rounds
    assert ttfa_err < ttft_err + 0.0005, rounds
