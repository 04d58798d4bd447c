"""The OpenAI server: responses, bad input (400 in OpenAI's shape, engine untouched), auth, and an
integration soak against a real server process with random client disconnects."""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from reference_engine.builder import PRINTABLE_ASCII
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.server import build_app
from reference_engine.tokenizer import ByteTokenizer

MODEL = "test-model"
FAST = CostProfile("fast", 5e-5, 0.0, 0.0, 0.0)


# ---- in-process app (httpx.ASGITransport: fine for content, never for timing) --------------------------
def make_engine(num_blocks: int = 64, max_model_len: int = 128) -> LLMEngine:
    tok = ByteTokenizer()
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_model_len=max_model_len)
    ex = ModeledExecutor(FAST, block_size=4, num_blocks=num_blocks, vocab_size=tok.vocab_size,
                         eos_token_id=tok.eos_token_id, token_id_range=PRINTABLE_ASCII)
    return LLMEngine(cfg, ex)


@pytest.fixture
async def app_client() -> AsyncIterator[tuple[httpx.AsyncClient, LLMEngine]]:
    engine = make_engine()
    app = build_app(engine, MODEL, ByteTokenizer())
    engine.start()  # ASGITransport runs no lifespan
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            yield client, engine
    finally:
        engine.stop()


def sse_objects(body: str) -> list[Any]:
    events = [block[len("data: "):] for block in body.split("\n\n") if block.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_completion_whole_and_streamed(app_client: tuple[httpx.AsyncClient, LLMEngine]) -> None:
    client, engine = app_client
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 6})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"]) == 6
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11,
                             "prompt_tokens_details": {"cached_tokens": 0}}

    r = await client.post("/v1/completions", json={"prompt": [104, 105], "max_tokens": 4, "stream": True,
                                                   "stream_options": {"include_usage": True}})
    objs = sse_objects(r.text)
    texts = [o["choices"][0]["text"] for o in objs if o["choices"]]
    assert len(texts) == 4 and all(len(t) == 1 for t in texts)
    assert objs[-2]["choices"][0]["finish_reason"] == "length"
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 4
    assert objs[-1]["usage"]["prompt_tokens"] == 2
    assert engine.stats().num_blocks_in_use == 0


async def test_chat_whole_and_streamed(app_client: tuple[httpx.AsyncClient, LLMEngine]) -> None:
    client, _ = app_client
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "seed": 1,
                                                        "temperature": 0.5, "top_p": 0.9})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert len(body["choices"][0]["message"]["content"]) == 3
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 3,
                                                        "stream": True})
    objs = sse_objects(r.text)
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [o["choices"][0]["delta"].get("content") for o in objs[1:]]
    assert len(content) == 3 and objs[-1]["choices"][0]["finish_reason"] == "length"
    assert all(o["object"] == "chat.completion.chunk" for o in objs)


async def test_neutral_values_of_unsupported_fields_are_accepted(app_client: tuple[httpx.AsyncClient, LLMEngine]
                                                                  ) -> None:
    # Clients send these defaults unasked; only a value the engine would silently ignore is refused.
    client, _ = app_client
    neutral = {"logprobs": None, "echo": False, "presence_penalty": 0, "frequency_penalty": 0.0, "best_of": 1,
               "logit_bias": {}, "stop_token_ids": [], "stop": None}
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, **neutral})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


async def test_usage_reports_prefix_cache_hits(app_client: tuple[httpx.AsyncClient, LLMEngine]) -> None:
    client, _ = app_client
    prompt = list(range(40, 80))  # 40 tokens = 10 blocks of 4
    r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    r = await client.post("/v1/completions", json={"prompt": prompt + [7, 8], "max_tokens": 2, "stream": True,
                                                   "stream_options": {"include_usage": True}})
    usage = sse_objects(r.text)[-1]["usage"]
    assert usage["prompt_tokens"] == 42 and usage["prompt_tokens_details"]["cached_tokens"] == 40


def predicted_text(engine: LLMEngine, request_id: int, prompt_len: int, n: int) -> str:
    """The modeled executor's tokens are a pure function of (request id, position): the text request
    `request_id` would produce without stopping, one printable byte per token."""
    ex = engine.executor
    assert isinstance(ex, ModeledExecutor)
    return bytes(ex.token_at(request_id, prompt_len + k) for k in range(n)).decode()


async def test_stop_strings_cut_the_text_and_end_the_request(app_client: tuple[httpx.AsyncClient, LLMEngine]
                                                             ) -> None:
    client, engine = app_client
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 40})
    first = r.json()
    rid = int(first["id"].split("-")[-1])
    assert first["choices"][0]["text"] == predicted_text(engine, rid, 5, 40)  # the prediction holds

    # The next request's text is known in advance: stop on 3 characters from its middle (3 tokens).
    full = predicted_text(engine, rid + 1, 5, 40)
    stop = full[20:23]
    cut = full.index(stop)
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 40, "stop": [stop, "\x00"]})
    body = r.json()
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == (full[:cut], "stop")
    assert body["usage"]["completion_tokens"] == cut + 3  # no token generated past the stop string
    generated = engine.stats().num_generation_tokens
    assert generated == 40 + cut + 3

    # Streamed, with the stop string kept: the same cut, and no chunk ever carries part of it early.
    full = predicted_text(engine, rid + 2, 5, 40)
    stop = full[30:32]
    cut = full.index(stop)
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 40, "stop": stop, "stream": True,
                                                   "include_stop_str_in_output": True,
                                                   "stream_options": {"include_usage": True}})
    objs = sse_objects(r.text)
    texts = [o["choices"][0]["text"] for o in objs if o["choices"]]
    assert "".join(texts) == full[: cut + 2]
    assert objs[-2]["choices"][0]["finish_reason"] == "stop"
    assert objs[-1]["usage"]["completion_tokens"] == cut + 2
    assert engine.stats().num_blocks_in_use == 0 and not engine.has_work()
    snap = await client.get("/metrics")
    assert 'vllm:request_success_total{finished_reason="stop"' in snap.text


async def test_stop_strings_wait_for_min_tokens_and_work_in_chat(app_client: tuple[httpx.AsyncClient, LLMEngine]
                                                                 ) -> None:
    client, engine = app_client
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    rid = int(r.json()["id"].split("-")[-1])
    full = predicted_text(engine, rid + 1, 2, 30)
    # min_tokens=10: only an occurrence ending at the 10th output token (index 9) or later ends the request.
    # Stop on a character seen before that and again after it (the text is random printable ASCII).
    stop = next(c for c in full[:9] if full.find(c, 9) != -1)
    later = full.find(stop, 9)
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 30, "stop": stop, "min_tokens": 10})
    body = r.json()
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == (full[:later], "stop")
    assert body["usage"]["completion_tokens"] == later + 1

    messages = [{"role": "user", "content": "hi"}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    rid = int(r.json()["id"].split("-")[-1])
    prompt_len = r.json()["usage"]["prompt_tokens"]
    full = predicted_text(engine, rid + 1, prompt_len, 30)
    stop = full[5:7]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 30, "stop": [stop],
                                                        "stream": True})
    objs = sse_objects(r.text)
    content = "".join(o["choices"][0]["delta"].get("content") or "" for o in objs)
    assert content == full[: full.index(stop)] and objs[-1]["choices"][0]["finish_reason"] == "stop"
    assert engine.stats().num_blocks_in_use == 0


async def test_models_health_metrics_and_unknown_route(app_client: tuple[httpx.AsyncClient, LLMEngine]) -> None:
    client, _ = app_client
    r = await client.get("/v1/models")
    assert [m["id"] for m in r.json()["data"]] == [MODEL]
    assert (await client.get("/health")).status_code == 200
    text = (await client.get("/metrics")).text
    assert "vllm:num_requests_running{" in text and "slobench_engine:kv_blocks_in_use{" in text
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


BAD_COMPLETIONS: list[tuple[Any, str | None]] = [
    ({"prompt": "x" * 200}, "max_tokens"),  # over the context length (128)
    ({"prompt": "x" * 120, "max_tokens": 20}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": "hi", "model": "gpt-9"}, "model"),
    ({"prompt": "hi", "model": 3}, "model"),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "seed": "s"}, "seed"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "stream": True, "stream_options": {"include_usage": "y"}}, "stream_options"),
    ({"prompt": "hi", "stream_options": []}, "stream_options"),
    ({"prompt": "hi", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "stop": ["a", 1]}, "stop"),
    ({"prompt": "hi", "stop": {"a": 1}}, "stop"),
    ({"prompt": "hi", "stop": [str(i) for i in range(33)]}, "stop"),
    ({"prompt": "hi", "stop": "a", "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "logprobs": 5}, "logprobs"),
    ({"prompt": "hi", "best_of": 2}, "best_of"),
    ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "hi", "stop_token_ids": [7]}, "stop_token_ids"),
    ([{"prompt": "hi"}], None),
    ("just a string", None),
]
BAD_CHATS: list[tuple[Any, str | None]] = [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x" * 200}]}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
]


def assert_openai_error(r: httpx.Response, param: str | None) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS)
async def test_bad_completion_is_400_and_changes_nothing(
    app_client: tuple[httpx.AsyncClient, LLMEngine], body: Any, param: str | None
) -> None:
    client, engine = app_client
    before = engine.stats()
    r = await client.post("/v1/completions", content=json.dumps(body))
    assert_openai_error(r, param)
    assert engine.stats() == before and not engine.has_work()


@pytest.mark.parametrize(("body", "param"), BAD_CHATS)
async def test_bad_chat_is_400_and_changes_nothing(
    app_client: tuple[httpx.AsyncClient, LLMEngine], body: Any, param: str | None
) -> None:
    client, engine = app_client
    before = engine.stats()
    assert_openai_error(await client.post("/v1/chat/completions", content=json.dumps(body)), param)
    assert engine.stats() == before


@pytest.mark.parametrize("raw", [b"{bad", b"", b"\xff\xfe", b'{"prompt": "hi",}'])
async def test_malformed_json_is_400(app_client: tuple[httpx.AsyncClient, LLMEngine], raw: bytes) -> None:
    client, engine = app_client
    before = engine.stats()
    r = await client.post("/v1/completions", content=raw)
    assert_openai_error(r, None)
    assert r.json()["error"]["code"] == "invalid_json"
    assert engine.stats() == before


async def test_request_bigger_than_the_cache_is_400() -> None:
    engine = make_engine(num_blocks=4, max_model_len=1000)  # 16 KV slots
    app = build_app(engine, MODEL, ByteTokenizer())
    engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 10})
            assert_openai_error(r, "max_tokens")
            assert "could never complete" in r.json()["error"]["message"]
            r = await client.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 7})
            assert r.status_code == 200
    finally:
        engine.stop()


async def test_flood_of_bad_requests_leaves_the_engine_healthy(
    app_client: tuple[httpx.AsyncClient, LLMEngine]
) -> None:
    client, engine = app_client
    before = engine.stats()
    bodies = [b for b, _ in BAD_COMPLETIONS] * 10
    rs = await asyncio.gather(*(client.post("/v1/completions", content=json.dumps(b)) for b in bodies))
    assert all(r.status_code == 400 for r in rs)
    assert engine.stats() == before and engine.is_healthy()
    assert (await client.get("/health")).status_code == 200
    r = await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


async def test_api_key_guards_v1_routes_only() -> None:
    engine = make_engine()
    app = build_app(engine, MODEL, ByteTokenizer(), api_key="sekret")
    engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = await client.post("/v1/completions", json={"prompt": "hi"}, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert (await client.get("/v1/models")).status_code == 401
            ok = {"Authorization": "Bearer sekret"}
            assert (await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=ok)
                    ).status_code == 200
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/metrics")).status_code == 200
    finally:
        engine.stop()
    assert engine.stats().num_prompt_tokens == 2


def test_modeled_server_never_imports_torch() -> None:
    code = ("import sys, reference_engine.server, reference_engine.builder as b; b.build_engine(b.EngineSpec(executor='modeled', profile='h100-llama-1b')); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---- a real server process ---------------------------------------------------------------------------
def start_server(tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    profile = tmp / "fast.json"
    profile.write_text(json.dumps({"name": "fast", "step_overhead_s": 1e-4, "per_prefill_token_s": 1e-7,
                                   "per_decode_seq_s": 1e-6, "per_context_token_s": 0.0}))
    cmd = [sys.executable, "-m", "reference_engine.server", "--executor", "modeled", "--port", "0",
           "--profile", str(profile), "--model", MODEL, *extra]
    err = open(tmp / "server.err", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    line = b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 64)
        if not chunk:
            break
        line += chunk
    if not line.startswith(b"LISTENING "):
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {(tmp / 'server.err').read_text()[-2000:]}")
    base = f"http://127.0.0.1:{int(line.split()[1])}"
    while time.monotonic() < deadline:  # bound, then poll health
        try:
            if httpx.get(base + "/health", timeout=1.0).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
    proc.kill()
    raise AssertionError("server never became healthy")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    proc, base = start_server(tmp_path, "--kv-blocks", "4096", "--max-num-seqs", "128",
                              "--max-batched-tokens", "4096")
    try:
        yield base
    finally:
        stop_server(proc)


def parse_metrics(text: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample; `value(m, name)` sums a name over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def value(m: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, v in m.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
    return total


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(base + "/metrics") as r:
        return parse_metrics(await r.text())


async def wait_idle(session: aiohttp.ClientSession, base: str, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = await scrape(session, base)
        busy = (value(m, "vllm:num_requests_running") + value(m, "vllm:num_requests_waiting")
                + value(m, "slobench_engine:kv_blocks_in_use"))
        if busy == 0 or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_server_process_streams_over_real_http(server: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"prompt": "hello there", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
        async with s.post(server + "/v1/completions", json=body) as r:
            assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
            objs = sse_objects((await r.read()).decode())
        assert len("".join(o["choices"][0]["text"] for o in objs if o["choices"])) == 8
        assert objs[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 8, "total_tokens": 19,
                                     "prompt_tokens_details": {"cached_tokens": 0}}
        async with s.post(server + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}) as r:
            assert len((await r.json())["choices"][0]["message"]["content"]) == 5
        async with s.post(server + "/v1/completions", data=b"{oops") as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"
        m = await wait_idle(s, server)
        assert value(m, "vllm:request_success_total", finished_reason="length") == 2
        assert value(m, "vllm:generation_tokens_total") == 13


@pytest.mark.integration
async def test_soak_with_random_disconnects_leaks_no_block(server: str) -> None:
    """NOTES bug 5: thousands of streamed requests, some clients leaving mid-stream and some leaving a
    non-streaming request while it waits. Afterwards nothing runs and no block is held; and every request
    the server saw ended exactly once, as 'length' (finished) or 'abort' (client gone)."""
    rng = random.Random(7)
    n = 2800  # ~80% of them streamed
    kinds = rng.choices(["stream", "whole", "stream_leave", "whole_leave"], weights=[70, 10, 10, 10], k=n)
    prefixes = ["You are a helpful assistant. " * 2, "Summarise the following text: ", ""]
    results = {"stream": 0, "whole": 0, "stream_leave": 0, "whole_leave": 0}
    sem = asyncio.Semaphore(96)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(i: int, kind: str, s: aiohttp.ClientSession) -> None:
        leave = kind.endswith("leave")
        max_tokens = 2000 if leave else rng.randint(1, 8)
        body = {"prompt": rng.choice(prefixes) + f"request {i}", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": kind.startswith("stream")}
        async with sem:
            if kind == "whole_leave":
                with pytest.raises(asyncio.TimeoutError):  # noqa: PT012 - the post is the thing that times out
                    await asyncio.wait_for(s.post(server + "/v1/completions", json=body), rng.uniform(0.02, 0.06))
                results[kind] += 1
                return
            async with s.post(server + "/v1/completions", json=body) as r:
                assert r.status == 200
                if kind == "stream_leave":
                    await r.content.readany()  # the first chunk(s), then hang up
                    r.close()
                    results[kind] += 1
                    return
                if kind == "whole":
                    assert (await r.json())["usage"]["completion_tokens"] == max_tokens
                else:
                    objs = sse_objects((await r.read()).decode())
                    assert len(objs) == max_tokens
                results[kind] += 1

    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=connector) as s:
        await asyncio.gather(*(one(i, k, s) for i, k in enumerate(kinds)))
        m = await wait_idle(s, server)
    elapsed_s = time.monotonic() - t0
    print(f"soak: {n} requests in {elapsed_s:.1f}s, {results}")

    assert sum(results.values()) == n
    assert value(m, "vllm:num_requests_running") == 0
    assert value(m, "vllm:num_requests_waiting") == 0
    assert value(m, "slobench_engine:kv_blocks_in_use") == 0
    assert value(m, "vllm:kv_cache_usage_perc") == 0
    assert (value(m, "slobench_engine:kv_blocks_free") + value(m, "slobench_engine:kv_blocks_cached")
            == value(m, "slobench_engine:kv_blocks_total") == 4096)
    assert value(m, "slobench_engine:idle_check_failures_total") == 0
    # Only the requests whose clients stayed ran to max_tokens: a leaked one would finish as 'length' too.
    assert value(m, "vllm:request_success_total", finished_reason="length") == results["stream"] + results["whole"]
    aborted = value(m, "vllm:request_success_total", finished_reason="abort")
    left = results["stream_leave"] + results["whole_leave"]
    assert 0.8 * left <= aborted <= left
    assert value(m, "vllm:prefix_cache_hits_total") > 0


def test_zero_engine_sizes_are_refused_not_defaulted():
    # Regression: `kv_blocks or 2048` turned an explicit 0 into the default and served anyway.
    from reference_engine.config import EngineSpec
    from slobench.errors import EngineConfigError

    for knobs in ({"kv_blocks": 0}, {"max_model_len": 0}):
        with pytest.raises(EngineConfigError, match=f"{next(iter(knobs))}: must be an integer >= 1"):
            EngineSpec(executor="modeled", **knobs)


def test_a_port_another_process_holds_is_exit_2_naming_it(capsys):
    import socket

    from slobench.cli import main as cli_main

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert cli_main(["serve", "--executor", "modeled", "--port", str(port)]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err and "internal error" not in err
