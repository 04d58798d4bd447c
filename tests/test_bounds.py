"""What a server's answer may cost the client, without a server: capped bodies and inflation, JSON depth,
secrets scrubbed in every echoed form, the raw client's request line, a stream complete at its end even
when the body stays open, the scraper's own thread, and the size flags."""

from __future__ import annotations

import asyncio
import base64
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from slobench.cli import main
from slobench.errors import SpecError
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.scrape import _LoopThread
from slobench.targets import OpenAITarget
from slobench.targets import openai as openai_mod
from slobench.targets.bounds import MIB, Decoder, brief, json_of, parse_size
from slobench.targets.options import TargetOptions
from slobench.targets.rawhttp import RawHttpTransport
from slobench.targets.transport import TransportError, read_body


async def pieces(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def gzip_of(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


# ---- bodies -----------------------------------------------------------------------------------------


def test_a_gzip_bomb_inflates_only_as_far_as_the_limit() -> None:
    bomb = gzip_of(bytes(256 * MIB))  # 256 MiB of zeros: about 250 KB on the wire
    assert len(bomb) < MIB
    d = Decoder("gzip")
    out = d.decode(bomb, MIB + 1)
    assert len(out) == MIB + 1  # never more than asked, however much the input would give

    with pytest.raises(TransportError, match=r"over the 1 MiB limit once decompressed \(gzip\) \(--max-body\)"):
        asyncio.run(read_body(pieces(bomb[:1000], bomb[1000:]), "gzip", MIB))


def test_plain_and_compressed_bodies_within_the_limit_read_whole() -> None:
    body = b'{"data": [{"id": "m"}]}' * 1000
    raw_deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    cases = {
        None: body,
        "identity": body,
        "gzip": gzip_of(body[:500]) + gzip_of(body[500:]),  # two members
        "deflate": zlib.compress(body),
        "DEFLATE ": raw_deflate.compress(body) + raw_deflate.flush(),  # raw deflate, as some servers send
    }
    for enc, wire in cases.items():
        got = asyncio.run(read_body(pieces(wire[:7], wire[7:]), enc, len(body)))
        assert got == body, enc
    with pytest.raises(TransportError, match=r"over the 100 bytes limit \(--max-metrics-body\)"):
        asyncio.run(read_body(pieces(body), None, 100, "--max-metrics-body"))
    with pytest.raises(TransportError, match="Content-Encoding 'br' was not asked for"):
        asyncio.run(read_body(pieces(body), "br", MIB))
    with pytest.raises(TransportError, match="a bad gzip body"):
        asyncio.run(read_body(pieces(b"not gzip at all"), "gzip", MIB))


# ---- JSON depth --------------------------------------------------------------------------------------


def test_deep_json_is_a_named_value_error_and_never_a_recursion_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="JSON nested deeper than 1024 levels"):
        json_of(deep)
    nested = orjson.loads(b"[" * 1000 + b"]" * 1000)  # within orjson's limit, past str()'s
    assert brief(nested).startswith("[[[[") and len(brief(nested)) < 100
    t = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="m", api_key_env=None))
    assert "nested deeper than 1024 levels" in t.http_error(400, b'{"error": ' + deep + b"}")
    message = t.http_error(400, b'{"error": {"message": ' + b"[" * 1000 + b"]" * 1000 + b"}}")
    assert message.startswith("HTTP 400: [[[[")


# ---- secrets ------------------------------------------------------------------------------------------


def test_every_form_of_a_configured_secret_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOBENCH_TEST_KEY", "sk-env-key-123")
    o = TargetOptions(model="m", api_key_env="SLOBENCH_TEST_KEY",
                      headers={"Authorization": "Bearer tok-bare-456", "X-Api-Key": "xk-789", "X-Team": "blue-team"})
    t = OpenAITarget("http://alice:p%40ss%2Fw0rd@127.0.0.1:1/v1?api_key=q-secret-1", o)
    echoed = ("Bearer tok-bare-456 | tok-bare-456 | xk-789 | blue-team | p@ss/w0rd | p%40ss%2Fw0rd | "
              "alice:p@ss/w0rd | q-secret-1 | sk-env-key-123 | tok-bare-456 again")
    scrubbed = t.scrub(echoed)
    for secret in ("tok-bare-456", "xk-789", "blue-team", "p@ss/w0rd", "p%40ss%2Fw0rd", "q-secret-1", "sk-env-key"):
        assert secret not in scrubbed, (secret, scrubbed)
    assert "alice" not in scrubbed and scrubbed.endswith("*** again")  # user:password is replaced whole

    basic = "Basic " + base64.b64encode(b"bob:hunter22").decode()
    t2 = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="m", api_key_env=None,
                                                           headers={"Proxy-Authorization": basic}))
    assert "hunter22" not in t2.scrub("got bob:hunter22, i.e. hunter22")
    assert t2.scrub("a key of 3: abc") == "a key of 3: abc"  # nothing configured is that short
    t3 = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="m", api_key_env=None,
                                                           headers={"X-Note": "hello world"}))
    assert t3.scrub("hello world, world") == "***, world"  # only an auth scheme's token is a secret alone


# ---- the raw client's request line --------------------------------------------------------------------


def test_the_raw_request_line_percent_encodes_path_and_query() -> None:
    tr = RawHttpTransport(timeout_s=1, connect_timeout_s=1)
    _, head = tr._head("http://example.test/v1 beta/modèle%20x/completions?q=a b&r=ü", {})
    line = head.split(b"\r\n", 1)[0]
    assert line == b"POST /v1%20beta/mod%C3%A8le%20x/completions?q=a%20b&r=%C3%BC HTTP/1.1"


# ---- a stream complete at its end, the body left open -------------------------------------------------


class _OpenAfter:
    """A 200 stream that sends `data` and then never ends (a server holding the body open)."""

    status = 200
    retry_after = None
    location = None

    def __init__(self, data: bytes, then: BaseException | None = None) -> None:
        self.data = data
        self.then = then

    async def _gen(self) -> AsyncIterator[bytes]:
        yield self.data
        if self.then is not None:
            raise self.then
        await asyncio.Event().wait()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def read(self) -> bytes:
        return self.data


class _Open:
    def __init__(self, data: bytes, then: BaseException | None = None) -> None:
        self.data = data
        self.then = then

    @asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   on_sent: Callable[[], None] | None = None) -> AsyncIterator[_OpenAfter]:
        yield _OpenAfter(self.data, self.then)

    async def close(self) -> None:
        pass


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


TOKENS = _event({"choices": [{"index": 0, "text": " a"}]}) * 3
FINISH = _event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})


@pytest.mark.parametrize("data, n, then", [
    (TOKENS + FINISH + USAGE + b"data: [DONE]\n\n", 1, None),  # [DONE], then nothing
    (TOKENS + FINISH + USAGE, 1, None),  # every finish and the usage asked for, no [DONE]
    (TOKENS + FINISH + _event({"choices": [{"index": 1, "text": " b", "finish_reason": "length"}]}) + USAGE, 2, None),
    (TOKENS + FINISH + USAGE + b"data: [DONE]\n\n", 1, RuntimeError("the client's own error")),  # then a reset
])
def test_a_complete_stream_ends_the_request_though_the_body_stays_open(
    monkeypatch: pytest.MonkeyPatch, data: bytes, n: int, then: BaseException | None
) -> None:
    monkeypatch.setattr(openai_mod, "DRAIN_S", 0.01)
    t = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="m", api_key_env=None,
                                                          extra_body={"n": n} if n > 1 else None),
                     transport=_Open(data, then))
    spec = RequestSpec(request_id=0, arrival_s=0.0, prompt=(1, 2, 3), input_tokens=3, max_tokens=3)
    record = RequestRecord(0, 0.0)

    async def go() -> None:
        await t.start()
        await asyncio.wait_for(t.send(spec, record), 30)  # without the drain bound: never ends

    asyncio.run(go())
    assert record.status == "ok" and record.finish_reason == "length" and record.output_tokens == 2 + n


# ---- the scraper's thread, the size flags --------------------------------------------------------------


def test_the_scrape_loop_runs_on_a_thread_of_its_own() -> None:
    async def go() -> tuple[int, int]:
        thread = _LoopThread()

        async def ident() -> int:
            return threading.get_ident()

        try:
            return threading.get_ident(), await thread.run(ident())
        finally:
            await thread.stop(asyncio.sleep(0))

    here, there = asyncio.run(go())
    assert here != there


def test_sizes_parse_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert [parse_size(s) for s in ("64MiB", "16M", "512k", "1048576", "1.5KiB", "2G")] == [
        64 * MIB, 16 * MIB, 512 * 1024, MIB, 1536, 2048 * MIB]
    for bad in ("", "lots", "0", "-5M"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(SpecError, match="max_body_bytes"):
        TargetOptions(max_body_bytes=0)
    with pytest.raises(SystemExit) as e:
        main(["run", "--simulate", "--max-body", "lots", "--num-requests", "1"])
    assert e.value.code == 2 and "--max-body" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [True, False])
def test_a_deep_answer_or_event_is_a_named_error_on_the_record(stream: bool) -> None:
    deep = b'{"choices": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    data = TOKENS + b"data: " + deep + b"\n\n" if stream else deep
    t = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="m", api_key_env=None, stream=stream),
                     transport=_Open(data))
    spec = RequestSpec(request_id=0, arrival_s=0.0, prompt=(1, 2, 3), input_tokens=3, max_tokens=3)
    record = RequestRecord(0, 0.0)

    async def go() -> None:
        await t.start()
        await asyncio.wait_for(t.send(spec, record), 30)

    asyncio.run(go())
    assert record.status == "error" and "nested deeper than 1024 levels" in (record.error or ""), record.error
