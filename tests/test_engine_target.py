"""EngineTarget: the reference engine in process, through the runner, against the HTTP path."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
from reference_engine.tokenizer import ByteTokenizer
from slobench.analysis.summary import error_kind
from slobench.cli.common import add_engine_arguments, engine_knobs_from_args
from slobench.errors import TargetUnreachable, UsageError
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.engine import EngineTarget
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import EngineServerProcess

STEP_S = 0.002  # every modeled step takes 2 ms
PROFILE = CostProfile("flat-2ms", STEP_S, 0.0, 0.0, 0.0)
NO_PROGRESS = RunOptions(progress=False)


def make_engine(num_blocks: int = 128, max_model_len: int = 512, profile: CostProfile = PROFILE) -> LLMEngine:
    tok = ByteTokenizer()
    ex = ModeledExecutor(profile, block_size=16, num_blocks=num_blocks, vocab_size=tok.vocab_size,
                         eos_token_id=tok.eos_token_id, token_id_range=(32, 127))
    return LLMEngine(EngineConfig(block_size=16, num_blocks=num_blocks, max_model_len=max_model_len), ex)


def spec(rid: int, arrival_s: float = 0.0, n_in: int = 24, n_out: int = 5, **kw: object) -> RequestSpec:
    ids = tuple(40 + (31 * rid + k) % 200 for k in range(n_in))
    return RequestSpec(rid, arrival_s, ids, n_in, n_out, **kw)  # type: ignore[arg-type]


def mixed_specs() -> list[RequestSpec]:
    """Token and text prompts, several lengths, and one request too long for max_model_len 512."""
    out = [spec(i, 0.004 * i, n_in=16 + 9 * i, n_out=3 + i) for i in range(8)]
    out.append(RequestSpec(8, 0.035, "a text prompt", 13, 6))
    out.append(spec(9, 0.04, n_in=500, n_out=40))  # 540 > 512: rejected at admission
    return out


def check_times(rec: RequestRecord) -> None:
    assert rec.sent_s is not None and rec.first_token_s is not None and rec.done_s is not None
    assert rec.sent_s <= rec.first_token_s <= rec.done_s
    assert rec.chunk_times_s == sorted(rec.chunk_times_s) and rec.chunk_times_s[0] == rec.first_token_s
    assert rec.chunk_times_s[-1] <= rec.done_s  # over HTTP [DONE] (and usage) come after the last token


async def test_runner_records_match_the_requests() -> None:
    engine = make_engine()
    target = EngineTarget(engine, model_name="m")
    await target.start()
    try:
        assert "m in process" in await target.preflight()
        res = await run(mixed_specs(), target, opts=NO_PROGRESS, handle_sigint=False)
    finally:
        await target.close()
    recs = {r.request_id: r for r in res.records}
    assert len(recs) == 10
    for s in mixed_specs()[:9]:
        r = recs[s.request_id]
        assert r.status == "ok", r.error
        check_times(r)
        assert len(r.chunk_times_s) == r.output_tokens == s.max_tokens and r.chunk_tokens == [1] * s.max_tokens
        assert r.chunk_times_s[-1] == r.done_s  # in process the last token is the end
        assert r.prompt_tokens == s.input_tokens  # token ids as given; the text prompt is 13 bytes
        # real time on the engine's thread: the first token needs at least one whole modeled step
        assert r.first_token_s - r.sent_s >= STEP_S * 0.99
    bad = recs[9]
    # a length refusal is the error kind the HTTP path names it (slobench.targets.capabilities.name_too_long)
    assert bad.status == "error" and bad.error.startswith("too long: ") and "maximum context length" in bad.error
    assert bad.output_tokens == 0 and bad.first_token_s is None and bad.done_s is not None
    st = engine.stats()
    assert st.num_blocks_in_use == 0 and st.num_running == st.num_waiting == 0


async def test_bad_requests_and_chat_need_text() -> None:
    target = EngineTarget(make_engine(), model_name="m", api="chat")
    with pytest.raises(UsageError, match="token ids"):
        target.check_compatible(spec(0))
    async with target:
        rec = RequestRecord(0, 0.0)
        await target.send(RequestSpec(0, 0.0, "hi", 2, 4, extra_body=(("temperature", 7),)), rec)
        assert rec.status == "error" and rec.error.startswith("rejected: ") and "temperature" in rec.error
        ok = RequestRecord(1, 0.0)
        await target.send(RequestSpec(1, 0.0, "hi", 2, 4), ok)
        assert ok.status == "ok" and ok.output_tokens == 4 and ok.prompt_tokens > 2  # the chat template


class _Finishes:
    """An engine observer that keeps the finish reasons."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def observe_iteration_tokens(self, num_tokens: int) -> None: ...
    def observe_ttft(self, seconds: float) -> None: ...
    def observe_itl(self, seconds: float) -> None: ...

    def observe_finished(self, finish_reason: str, e2e_s: float, queue_s: float | None) -> None:
        self.reasons.append(finish_reason)


async def _until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


async def test_stop_strings_in_extra_body_end_requests_in_the_engine() -> None:
    engine = make_engine()
    finishes = _Finishes()
    engine.observer = finishes
    stops = [chr(c) for c in range(65, 95)]  # 30 of the 95 printable characters: one comes up within a few tokens
    async with EngineTarget(engine, model_name="m") as target:
        rec = RequestRecord(0, 0.0)
        await target.send(spec(0, n_out=40, extra_body=(("stop", stops),)), rec)
        plain = RequestRecord(1, 0.0)
        await target.send(spec(1, n_out=40), plain)
    assert rec.status == "ok" and 1 <= rec.output_tokens < 40
    assert plain.status == "ok" and plain.output_tokens == 40
    assert finishes.reasons == ["stop", "length"]
    assert engine.stats().num_blocks_in_use == 0


async def test_records_carry_prefix_cache_hits() -> None:
    async with EngineTarget(make_engine(), model_name="m") as target:
        first, second = RequestRecord(0, 0.0), RequestRecord(1, 0.0)
        await target.send(spec(5, n_in=40), first)
        await target.send(spec(5, n_in=40), second)  # the same prompt: its two full 16-token blocks are cached
    assert (first.cached_tokens, second.cached_tokens) == (0, 32)


async def test_cancellation_aborts_and_frees_blocks() -> None:
    engine = make_engine(num_blocks=512, max_model_len=4096)
    finishes = _Finishes()
    engine.observer = finishes
    target = EngineTarget(engine)
    await target.start()
    rec = RequestRecord(0, 0.0)
    task = asyncio.ensure_future(target.send(spec(0, n_in=40, n_out=4000), rec))
    await _until(lambda: rec.output_tokens >= 3)
    assert engine.stats().num_blocks_in_use >= 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await target.close()  # waits for the abort to reach the engine, then stops its thread
    st = engine.stats()
    assert st.num_blocks_in_use == 0 and st.num_running == st.num_waiting == 0
    assert finishes.reasons == ["abort"]
    assert 3 <= rec.output_tokens < 4000 and rec.done_s is None and rec.status == "ok"  # the runner marks it


async def test_close_aborts_what_is_still_in_flight() -> None:
    engine = make_engine(num_blocks=512, max_model_len=4096)
    target = EngineTarget(engine)
    await target.start()
    recs = [RequestRecord(i, 0.0) for i in range(3)]
    tasks = [asyncio.ensure_future(target.send(spec(i, n_out=3000), r)) for i, r in enumerate(recs)]
    await _until(lambda: engine.stats().num_running == 3)
    await target.close()
    assert engine.stats().num_blocks_in_use == 0
    await asyncio.gather(*tasks)  # each send saw its abort and returned a failed record
    assert all(r.status == "error" and "'abort'" in r.error and r.output_tokens < 3000 for r in recs)


async def test_ctrl_c_in_the_runner_cancels_sends_and_frees_blocks() -> None:
    engine = make_engine(num_blocks=512, max_model_len=4096)
    target = EngineTarget(engine)
    await target.start()
    specs = [spec(i, 0.0, n_out=3000) for i in range(3)] + [spec(3, 60.0)]  # the sender is still waiting
    runner = asyncio.ensure_future(run(specs, target, opts=RunOptions(progress=False, grace_s=0.0)))
    await _until(lambda: engine.stats().num_running == 3)
    os.kill(os.getpid(), signal.SIGINT)  # the runner's own handler: stop sending, cancel what is in flight
    res = await runner
    await target.close()
    assert res.interrupted and sorted(r.status for r in res.records) == ["cancelled"] * 3
    assert all(r.sent_s is not None and r.done_s is not None and r.output_tokens < 3000 for r in res.records)
    assert engine.stats().num_blocks_in_use == 0


class _Exploding:
    """A modeled executor that fails on its third step."""

    def __init__(self) -> None:
        self.inner = ModeledExecutor(PROFILE, block_size=16, num_blocks=128, vocab_size=258)
        self.block_size, self.num_blocks, self.vocab_size, self.eos_token_id = 16, 128, 258, None
        self.calls = 0

    def execute(self, batch: StepBatch) -> StepResult:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("device lost")
        return self.inner.execute(batch)


async def test_engine_failure_is_a_failed_record_then_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    engine = LLMEngine(EngineConfig(block_size=16, num_blocks=128, max_model_len=512), _Exploding())
    async with EngineTarget(engine) as target:
        rec = RequestRecord(0, 0.0)
        await target.send(spec(0, n_out=10), rec)
        assert rec.status == "error" and "engine failed" in rec.error and rec.output_tokens == 2
        late = RequestRecord(1, 0.0)
        await target.send(spec(1), late)
        assert late.status == "error" and "died" in late.error
        with pytest.raises(TargetUnreachable, match="stopped"):
            await target.preflight()


async def test_preflight_before_start_and_describe() -> None:
    target = EngineTarget({"executor": "modeled", "profile": "cpu-tiny", "kv_blocks": 64, "model": "tiny"})
    with pytest.raises(TargetUnreachable, match="before start"):
        await target.preflight()
    d = target.describe()
    assert d["kind"] == "engine" and d["model"] == "tiny" and d["config"]["num_blocks"] == 64
    assert d["profile"]["name"] == "cpu-tiny" and "prefix_hash_key" not in d["config"]
    json.dumps(d)  # goes into the manifest


def test_cli_flags_build_the_target() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    add_engine_arguments(p)
    args = p.parse_args(["--engine", "modeled", "--kv-blocks", "96", "--max-num-seqs", "8", "--no-prefix-caching"])
    knobs = engine_knobs_from_args(args)
    assert knobs["kv_blocks"] == 96 and knobs["enable_prefix_caching"] is False and knobs["model"] == "tiny"
    clock = Clock()
    t = EngineTarget(knobs, clock, model_name=knobs["model"], api="chat")
    assert t.clock is clock and t.api == "chat" and t.engine.config.max_num_seqs == 8
    assert p.parse_args([]).engine is None  # no --engine: the HTTP target, as before


# ---- the same requests through the HTTP server -----------------------------------------------------------


@pytest.mark.integration
async def test_records_match_the_http_server_path(tmp_path: Path) -> None:
    profile_path = tmp_path / "p.json"
    profile_path.write_text(PROFILE.to_json())
    knobs = {"executor": "modeled", "profile": str(profile_path), "kv_blocks": 128, "max_model_len": 512}
    specs = mixed_specs()
    with EngineServerProcess("--executor", "modeled", "--profile", str(profile_path), "--kv-blocks", "128",
                             "--max-model-len", "512", "--model", "m") as srv:
        http = OpenAITarget(srv.base_url, TargetOptions(model="m", api_key_env=None))
        await http.start()
        try:
            await http.preflight()
            via_http = await run(specs, http, opts=NO_PROGRESS, handle_sigint=False)
        finally:
            await http.close()
    local = EngineTarget(knobs, model_name="m")
    await local.start()
    try:
        in_process = await run(specs, local, opts=NO_PROGRESS, handle_sigint=False)
    finally:
        await local.close()
    h = {r.request_id: r for r in via_http.records}
    e = {r.request_id: r for r in in_process.records}
    assert sorted(h) == sorted(e) == list(range(10))
    for rid in range(10):
        a, b = h[rid], e[rid]
        assert (a.status, a.output_tokens, a.prompt_tokens) == (b.status, b.output_tokens, b.prompt_tokens), rid
        if a.status == "ok":
            check_times(a)
            check_times(b)
            assert sum(a.chunk_tokens) == a.output_tokens == len(b.chunk_times_s) == b.output_tokens
    # the same refusal, worded by the same validator, and the same error kind on both paths ("too long")
    assert error_kind(h[9].error) == error_kind(e[9].error) == "too long"
    assert h[9].error.removeprefix("too long: HTTP 400: ") == e[9].error.removeprefix("too long: ")
    assert local.engine.stats().num_blocks_in_use == 0
