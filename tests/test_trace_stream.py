"""Streaming replay: rows read as requests are taken, prompts built one at a time (issue 14, item 5)."""

from __future__ import annotations

import json
import tracemalloc
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from slobench.workload.base import RunShape
from slobench.workload.replay import replay
from slobench.workload.trace_stream import PREFIX_ROWS, StreamingReplay, StreamLog, stream_entries
from slobench.workload.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"


def mooncake_file(path: Path, n: int, *, rate_rps: float = 200.0, seed: int = 0, stamp_ms: int = 1,
                  max_input: int = 3000) -> Path:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1000.0 / rate_rps, n))
    t = (t // stamp_ms * stamp_ms).astype(np.int64)
    ins = rng.integers(1, max_input, n)
    with open(path, "w") as fh:
        for i, (ts, k) in enumerate(zip(t.tolist(), ins.tolist(), strict=True)):
            blocks = [i % 7] + [100 + i * 8 + j for j in range(-(-k // 512) - 1)]
            fh.write(json.dumps({"timestamp": ts, "input_length": k, "output_length": 1 + i % 50,
                                 "hash_ids": blocks}) + "\n")
    return path


def key(e):
    return (round(e.arrival_s, 9), e.input_tokens, e.output_tokens, e.tag, e.session_id, e.hash_ids)


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
def test_the_stream_holds_the_rows_load_trace_reads():
    path = TRACES / "AzureLLMInferenceTrace_code.csv"
    assert [key(e) for e in stream_entries(path)] == [key(e) for e in load_trace(path).entries]


def test_taking_the_first_request_reads_only_a_prefix(tmp_path):
    path = mooncake_file(tmp_path / "m.jsonl", 30_000)
    replay_ = StreamingReplay(str(path))
    specs = replay_.specs()
    first = next(specs)
    assert first.request_id == 0 and len(first.prompt) == first.input_tokens
    assert replay_.log.counts is not None and replay_.log.counts.num_rows <= PREFIX_ROWS + 1
    rest = list(islice(specs, 999))
    assert replay_.log.counts.num_rows <= PREFIX_ROWS + 1000
    t = [first.arrival_s] + [s.arrival_s for s in rest]
    assert t == sorted(t) and [s.request_id for s in rest] == list(range(1, 1000))


def test_memory_does_not_grow_with_the_trace(tmp_path):
    path = mooncake_file(tmp_path / "m.jsonl", 20_000, max_input=512)  # one shared block each: a small cache

    def peak(consume) -> int:
        tracemalloc.start()
        try:
            consume()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def stream(n: int) -> None:
        for _ in islice(StreamingReplay(str(path), time_scale=1.0).specs(), n):
            pass

    small, whole = peak(lambda: stream(5_000)), peak(lambda: stream(20_000))
    loaded = peak(lambda: load_trace(path))
    assert whole < 1.5 * small  # flat: four times the rows, not four times the memory
    assert whole < loaded / 2  # and below the entries alone of a whole load


def test_streamed_replay_matches_replay_in_times_counts_and_shared_blocks(tmp_path):
    path = mooncake_file(tmp_path / "m.jsonl", 3_000)
    whole = replay(load_trace(path), rate_rps=50.0, num_requests=500)
    streamed = list(StreamingReplay(str(path)).specs(RunShape(rate_rps=50.0, num_requests=500)))
    assert np.allclose([s.arrival_s for s in streamed], [s.arrival_s for s in whole])
    assert [(s.input_tokens, s.max_tokens, s.min_tokens) for s in streamed] == [
        (s.input_tokens, s.max_tokens, s.min_tokens) for s in whole]
    by_block = {}
    for s, e in zip(streamed, load_trace(path).entries, strict=False):
        assert len(s.prompt) == e.input_tokens
        by_block.setdefault(e.hash_ids[0], []).append(s.prompt[:512])
    assert all(all(p[: len(q)] == q[: len(p)] for q in group) for group in by_block.values() for p in group)


def test_a_duration_at_a_rate_reads_its_window(tmp_path):
    path = mooncake_file(tmp_path / "m.jsonl", 5_000)
    specs = list(StreamingReplay(str(path)).specs(RunShape(rate_rps=20.0, duration_s=30.0)))
    assert len(specs) == 600 and specs[-1].arrival_s < 30.0


def test_coarse_buckets_are_spread_as_they_stream(tmp_path):
    path = mooncake_file(tmp_path / "m.jsonl", 6_000, rate_rps=50.0, stamp_ms=3000)
    log = StreamLog()
    t = np.array([e.arrival_s for e in stream_entries(path, log=log)])
    stamps = np.array(sorted(json.loads(line)["timestamp"] for line in path.read_text().splitlines())) / 1000
    assert np.all(np.diff(t) >= 0) and len(np.unique(t)) == len(t)
    assert log.bucket_s == 3.0 and any("3 s buckets" in n for n in log.notes())
    assert np.all(np.sort(t) >= stamps - stamps[0]) and np.all(np.sort(t) < stamps - stamps[0] + 3.0)


def test_zero_rows_and_late_rows_are_counted_once_the_stream_ends(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": 10, "output_length": 0 if i % 5 == 4 else 3} for i in range(20)]
    rows.insert(15, {"timestamp": 2500, "input_length": 10, "output_length": 3})  # 12 s behind its neighbours
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = StreamLog()
    got = list(stream_entries(path, log=log))
    assert len(got) == 17 and all(a.arrival_s <= b.arrival_s for a, b in zip(got, got[1:], strict=False))
    notes = " ".join(log.notes())
    assert "left out 4 of 21 rows with zero tokens" in notes and "1 rows came earlier" in notes
    assert len(list(stream_entries(path, keep_zero=True))) == 21


def test_the_next_prompt_is_built_after_the_send_just_started(tmp_path):
    """The runner's open loop spawns a send, then takes the next request: that request must not be built
    in between, or every send waits for the next prompt's build."""
    import asyncio

    from slobench.workload import trace_stream

    path = mooncake_file(tmp_path / "m.jsonl", 200)
    events: list[tuple[str, int]] = []
    real = trace_stream.StreamingReplay._requests

    def recording(self, *args, **kwargs):
        for spec in real(self, *args, **kwargs):
            events.append(("built", spec.request_id))
            yield spec

    async def open_loop(specs) -> None:  # the shape of Dispatcher.open_loop: sleep to the time, spawn, take
        tasks = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for spec in specs:
            await asyncio.sleep(max(0.0, t0 + spec.arrival_s * 0.01 - loop.time()))
            events.append(("spawned", spec.request_id))

            async def send(i: int = spec.request_id) -> None:
                events.append(("sent", i))

            tasks.append(asyncio.ensure_future(send()))
        await asyncio.gather(*tasks)

    trace_stream.StreamingReplay._requests = recording  # type: ignore[method-assign]
    try:
        asyncio.run(open_loop(StreamingReplay(str(path)).specs(RunShape(num_requests=100))))
    finally:
        trace_stream.StreamingReplay._requests = real  # type: ignore[method-assign]
    for i in range(100):
        between = events[events.index(("spawned", i)) : events.index(("sent", i))]
        assert not any(kind == "built" for kind, _ in between), between
