"""The answer apart from the reasoning, against the token server's reasoning mode (a known schedule: token i
at received + TTFT + i * ITL, the first `x_reasoning_tokens` of them reasoning): where each record puts its
first reasoning and first answer token, and what the run's summary makes of them."""

from __future__ import annotations

import asyncio
from itertools import accumulate
from typing import Any

import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration


def chat_spec(i: int, reasoning: int, max_tokens: int = 12, **extra: Any) -> RequestSpec:
    body = (("x_reasoning_tokens", reasoning), ("x_ttft_ms", 2), ("x_itl_ms", 1), *extra.items())
    return RequestSpec(request_id=i, arrival_s=0.0, prompt="think first", input_tokens=3, max_tokens=max_tokens,
                       extra_body=body)


async def send_all(server: TokenServerProcess, specs: list[RequestSpec], **options: Any) -> list[RequestRecord]:
    records = [RequestRecord(s.request_id, 0.0) for s in specs]
    async with OpenAITarget(server.base_url, TargetOptions(model=server.model, api="chat", **options)) as target:
        await asyncio.gather(*(target.send(s, r) for s, r in zip(specs, records, strict=True)))
    return records


async def test_each_record_has_the_schedules_first_reasoning_and_first_answer_token(
        token_server: TokenServerProcess) -> None:
    records = await send_all(token_server, [chat_spec(i, reasoning=i % 4) for i in range(12)])
    for r in records:
        k = r.request_id % 4
        assert r.status == "ok", r.error
        assert r.output_tokens == 12 and sum(r.chunk_tokens) == 12
        if k == 0:  # no reasoning: the record reads as it always did
            assert (r.first_reasoning_s, r.first_answer_s, r.reasoning_tokens) == (None, None, None)
            continue
        # the answer's first token is the schedule's token k: the read that brought it (reads may carry
        # several tokens)
        assert r.first_token_s == r.first_reasoning_s == r.chunk_times_s[0]
        assert r.first_answer_s == r.chunk_times_s[next(j for j, n in enumerate(accumulate(r.chunk_tokens)) if n > k)]
        assert (r.reasoning_tokens, r.reasoning_tokens_source) == (k, "usage")
    s = summarize(records, SLO(ttft_s=1.0, ttfa_s=1.0))
    assert s.ttfa is not None and s.answer_tpot is not None and s.reasoning is not None
    assert s.ttfa.count == 12 and s.ttfa.p50 is not None and s.ttft.p50 is not None
    assert s.ttfa.p50 >= s.ttft.p50
    assert s.reasoning["num_reasoning"] == 9 and s.reasoning["num_no_answer"] == 0
    assert s.reasoning["reasoning_share"] == pytest.approx((3 * (1 + 2 + 3)) / (12 * 12))


async def test_reasoning_only_answers_and_whole_answers(token_server: TokenServerProcess) -> None:
    streamed = await send_all(token_server, [chat_spec(0, reasoning=12), chat_spec(1, reasoning=20)])
    for r in streamed:  # every token was reasoning: a completed request with no answer token
        assert r.status == "ok", r.error
        assert r.first_reasoning_s is not None and r.first_answer_s is None
        assert r.reasoning_tokens == r.output_tokens == 12
    s = summarize(streamed, SLO(ttfa_s=10.0))
    assert s.reasoning is not None and s.reasoning["num_no_answer"] == 2
    assert s.ttfa is not None and s.ttfa.count == 0
    assert s.attainment is not None and s.attainment.value == 0.0  # no answer misses an answer SLO
    whole = await send_all(token_server, [chat_spec(0, reasoning=5)], stream=False)
    r = whole[0]
    assert r.status == "ok" and r.first_reasoning_s == r.first_answer_s == r.done_s
    assert (r.reasoning_tokens, r.output_tokens) == (5, 12)


async def test_vllms_newer_reasoning_field(start_token_server: Any) -> None:
    server = start_token_server(ttft_ms=2, itl_ms=1, reasoning_tokens=3, reasoning_field="reasoning")
    records = await send_all(server, [chat_spec(0, reasoning=3)])
    r = records[0]
    assert r.first_answer_s == r.chunk_times_s[next(j for j, n in enumerate(accumulate(r.chunk_tokens)) if n > 3)]
    assert r.reasoning_tokens == 3
