"""A request the server's close met before any byte of an answer is sent once more, on a new connection;
one that got any byte back never is (slobench.targets.rawhttp, slobench.targets.transport). Loopback servers
in this process write exact bytes (slobench.testing.raw_answers); nothing here measures wall time."""

from __future__ import annotations

import asyncio

import pytest

from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts
from slobench.targets.rawhttp import RawHttpTransport
from slobench.targets.transport import TransportError
from slobench.testing.raw_answers import HostileAnswers, Play, RawServer, Request, completion_json, framed

TRANSPORTS = ("raw", "httpx")


async def send_waves(url: str, transport: str, waves: int, per_wave: int) -> list[RequestRecord]:
    """`waves` bursts of `per_wave` concurrent requests, one after another: each burst takes the
    connections the last one left in the pool."""
    options = TargetOptions(model="test-model", api_key_env=None, stream=True, transport=transport,  # type: ignore[arg-type]
                            server_profile="vllm", timeouts=Timeouts(request_s=10.0))
    records: list[RequestRecord] = []
    async with OpenAITarget(url, options) as target:
        for w in range(waves):
            batch = [RequestRecord(w * per_wave + i, 0.0) for i in range(per_wave)]
            specs = [RequestSpec(request_id=r.request_id, arrival_s=0.0, prompt="hi", input_tokens=1, max_tokens=2)
                     for r in batch]
            await asyncio.wait_for(asyncio.gather(*(target.send(s, r) for s, r in zip(specs, batch, strict=True))), 30)
            records += batch
    return records


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_at_load_no_request_fails_for_a_connection_the_server_closed(transport: str) -> None:
    # One completion in three gets a bare 500 that leaves its connection looking kept-alive; the server
    # closes that connection as the next request comes on it: the race of a close and a send, every time.
    answers = HostileAnswers("close-after-500", every=3)
    async with RawServer(answers) as url:
        records = await send_waves(url, transport, waves=6, per_wave=20)
    failed = [r for r in records if r.status != "ok" and r.http_status != 500]
    assert not failed, {r.error for r in failed}
    assert sum(r.http_status == 500 for r in records) == 40  # each 500 is the server's own answer
    resent = [r for r in records if r.retried is not None]
    assert resent and all(r.status == "ok" or r.http_status == 500 for r in resent)
    assert len(answers.closing) >= len(resent)


async def test_a_resend_goes_once_on_a_new_connection_and_keeps_the_first_send() -> None:
    # every connection answers its first request and closes at its second: a resend that took another
    # pooled connection would meet a close again
    async def go(url: str) -> tuple[list[int], list[str | None]]:
        tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
        sent: list[int] = []
        retried = []
        try:
            for _ in range(2):  # two connections in the pool, each past its one answer
                first = [tr.post(url + "/completions", b"{}", {}) for _ in range(2)]
                responses = [await p.__aenter__() for p in first]
                for p, resp in zip(first, responses, strict=True):
                    await resp.read()
                    await p.__aexit__(None, None, None)
            async with tr.post(url + "/completions", b"{}", {}, lambda: sent.append(1)) as resp:
                assert (resp.status, await resp.read()) == (200, b"ok")
                retried.append(resp.retried)
        finally:
            await tr.close()
        return sent, retried

    def answer(req: Request) -> Play | None:
        return Play(framed(b"ok")) if req.index == 0 else None

    server = RawServer(answer)
    async with server as url:
        sent, retried = await go(url)
    assert sent == [1]  # on_sent once: the record's sent_s is the first send's
    assert retried == ["server closed the connection before the response ended"]


async def answered_then_refused(url: str, match: str) -> None:
    """A first request answered, then a second on the same transport failing with `match`."""
    tr = RawHttpTransport(timeout_s=5, connect_timeout_s=5)
    try:
        async with tr.post(url + "/completions", b"{}", {}) as resp:
            await resp.read()
        with pytest.raises(TransportError, match=match):
            async with tr.post(url + "/completions", b"{}", {}):
                pass
    finally:
        await tr.close()


async def test_an_answer_begun_is_never_sent_again() -> None:
    def answer(req: Request) -> Play | None:
        if req.index == 0:
            return Play(framed(completion_json(1)))
        return Play(b"HTTP/1.1 200 OK\r\nContent-Le", close=True)  # a byte came back: the request was read

    server = RawServer(answer)
    async with server as url:
        await answered_then_refused(url, "server closed the connection before the response ended")
    assert (server.connections, len(server.requests)) == (1, 2)


async def test_a_resend_that_fails_too_says_it_was_sent_again() -> None:
    def answer(req: Request) -> Play | None:
        return Play(framed(b"ok")) if req.index == 0 and req.conn == 0 else None

    async with RawServer(answer) as url:
        await answered_then_refused(url, "sent again on a new connection")
