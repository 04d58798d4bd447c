"""`slobench run --trace` streams the trace (issue 14, items 3 and 5): the runner takes an iterator of requests
one at a time, in schedule order, with the same requests as the eager path, and summary.json says what
became of the trace's rows (`trace_rows`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import build_parser, main
from slobench.cli.common import options_from_args
from slobench.errors import SpecError, UsageError
from slobench.load_setup import LoadSetup
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase
from slobench.targets.options import TargetOptions
from slobench.workload.base import RunShape
from slobench.workload.replay import TraceReplay
from slobench.workload.trace_stream import ReplayStream, StreamingReplay, count_lines

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"


class InstantTarget(TargetBase):
    """Answers at once; remembers how many requests its source had handed out at each send."""

    def __init__(self, clock: Clock, taken: list[int] | None = None) -> None:
        self.clock = clock
        self.taken = taken
        self.taken_at_send: list[int] = []

    async def send(self, spec: RequestSpec, rec) -> None:
        if self.taken is not None:
            self.taken_at_send.append(self.taken[0])
        t = self.clock.now_s()
        rec.sent_s = rec.first_token_s = rec.done_s = t
        rec.output_tokens = 1


def mooncake(path: Path, n: int, *, zero_every: int = 0, gap_ms: int = 2) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            out = 0 if zero_every and i % zero_every == zero_every - 1 else 1 + i % 7
            fh.write(json.dumps({"timestamp": gap_ms * i + (i % 3), "input_length": 1 + (i * 37) % 900,
                                 "output_length": out, "hash_ids": [i % 5, 1000 + i]}) + "\n")
    return path


def key(rec) -> tuple:
    return (rec.request_id, round(rec.scheduled_s, 9), rec.input_tokens, rec.max_tokens)


async def run_records(specs, **opts) -> tuple[list, dict]:
    clock = Clock()
    res = await run(specs, InstantTarget(clock), clock=clock, opts=RunOptions(progress=False, **opts))
    return sorted(res.records, key=lambda r: r.request_id), res.summary


async def test_streamed_run_sends_the_eager_runs_requests_in_the_same_order(tmp_path):
    path = mooncake(tmp_path / "m.jsonl", 600, zero_every=9)
    eager, s1 = await run_records(TraceReplay.open(str(path)).specs())
    streamed, s2 = await run_records(StreamingReplay(str(path)).specs())
    assert len(streamed) == len(eager) == 600 - 600 // 9
    assert [key(r) for r in streamed] == [key(r) for r in eager]
    assert s1.num_scheduled == s2.num_scheduled == len(eager)
    # sent in schedule order: the send times follow the request ids
    sent = [r.sent_s for r in streamed]
    assert sent == sorted(sent)


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
async def test_streamed_and_eager_agree_on_an_azure_window_at_a_rate():
    path = str(TRACES / "AzureLLMInferenceTrace_conv.csv")
    eager, _ = await run_records(TraceReplay.open(path, start_s=600).specs(RunShape(rate_rps=400.0, num_requests=800)))
    streamed, _ = await run_records(StreamingReplay.open(path, start_s=600).specs(RunShape(rate_rps=400.0, num_requests=800)))
    assert len(streamed) == len(eager) == 800
    assert [key(r) for r in streamed] == [key(r) for r in eager]


def test_a_rate_over_the_whole_trace_streams_in_two_passes_with_the_eager_scale(tmp_path):
    path = mooncake(tmp_path / "m.jsonl", 400)
    eager = TraceReplay.open(str(path)).specs(RunShape(rate_rps=50.0))
    streamed = list(StreamingReplay(str(path)).specs(RunShape(rate_rps=50.0)))
    assert np.allclose([s.arrival_s for s in streamed], [s.arrival_s for s in eager])
    t = [s.arrival_s for s in streamed]
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(50.0)


async def test_the_runner_takes_a_stream_as_it_sends():
    """The first request goes out when the runner has taken one or two, not the whole schedule (the old
    runner sorted and counted its requests before the first send)."""
    taken = [0]

    def source() -> Iterator[RequestSpec]:
        for i in range(300):
            taken[0] += 1
            yield RequestSpec(i, i * 0.002, (1, 2), 2, 1)

    clock = Clock()
    target = InstantTarget(clock, taken)
    res = await run(source(), target, clock=clock, opts=RunOptions(progress=False))
    assert len(res.records) == 300 and res.summary.num_scheduled == 300
    assert target.taken_at_send[0] <= 5  # one or two, a few more when the loaded machine ran late
    assert max(target.taken_at_send[:100]) < 300  # 0.4 s of sends before the source ran out


async def test_a_stream_out_of_schedule_order_is_refused_naming_the_request():
    def source() -> Iterator[RequestSpec]:
        yield RequestSpec(0, 0.0, (1,), 1, 1)
        yield RequestSpec(1, 0.02, (1,), 1, 1)
        yield RequestSpec(2, 0.01, (1,), 1, 1)

    clock = Clock()
    with pytest.raises(SpecError, match="request 2 at 0.010000 s after request 1"):
        await run(source(), InstantTarget(clock), clock=clock, opts=RunOptions(progress=False))


async def test_a_stream_with_duration_counts_what_it_sent():
    def source() -> Iterator[RequestSpec]:
        for i in range(100):
            yield RequestSpec(i, i * 0.001, (1,), 1, 1)

    recs, summary = await run_records(source(), duration_s=0.0495)
    assert len(recs) == summary.num_scheduled == 50


async def test_progress_total_comes_from_the_streams_hint(tmp_path):
    from slobench.run import runner

    path = mooncake(tmp_path / "m.jsonl", 50)
    assert count_lines(path) == 50
    stream = StreamingReplay(str(path)).specs()
    assert stream.count_hint() == 50
    assert StreamingReplay(str(path)).specs(RunShape(num_requests=7)).count_hint() == 7
    seen = []
    real = runner._estimate_total

    async def spy(hint, progress):
        await real(hint, progress)
        seen.append((progress.total, progress.is_total_estimate))

    runner._estimate_total = spy  # type: ignore[assignment]
    try:
        await run_records(stream)
    finally:
        runner._estimate_total = real  # type: ignore[assignment]
    assert seen == [(50, True)]


def test_count_lines_leaves_out_a_csv_header_and_counts_a_last_line_without_newline(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n4,5,6")
    assert count_lines(p) == 2


def test_an_empty_window_is_a_usage_error(tmp_path):
    path = mooncake(tmp_path / "m.jsonl", 20)
    with pytest.raises(UsageError, match="holds no request"):
        StreamingReplay(str(path), start_s=1e6).specs()


# ---- what the rows became: summary.json trace_rows (item 3) ----------------------------------------------


def burstgpt(path: Path) -> Path:
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(40):
        out = 0 if i % 10 == 3 else 20 + i  # 4 failed requests
        rows.append(f"{i * 0.5},ChatGPT,{100 + i},{out},{120 + 2 * i},Conversation log")
    rows.insert(7, "oops,ChatGPT,1,2,3,x")  # one unreadable row
    path.write_text("\n".join(rows) + "\n")
    return path


async def test_summary_says_how_many_rows_were_left_out_and_why_streamed_or_eager(tmp_path):
    path = str(burstgpt(tmp_path / "b.csv"))
    fast = 0.01  # the trace spans 20 s; replayed 100x faster, what its rows became is the same
    _, streamed = await run_records(StreamingReplay.open(path, time_scale=fast).specs())
    _, eager = await run_records(TraceReplay.open(path, time_scale=fast).specs())
    for summary in (streamed, eager):
        rows = summary.trace_rows
        assert rows["num_rows_read"] == 41 and rows["is_whole_file"] and rows["num_requests"] == 36
        assert rows["dropped"] == {"unreadable": 1, "zero_tokens": 4} and rows["num_dropped"] == 5
        assert rows["zero_tokens"] == {"zero_output": 4, "zero_input": 0}
        assert any("4 with 0 output tokens (failed requests)" in n for n in rows["notes"])
        assert "malformed" not in json.dumps(rows)
    assert summary.num_requests == 36
    _, kept = await run_records(StreamingReplay.open(path, keep_zero=True, time_scale=fast).specs())
    assert kept.trace_rows["altered"]["zero_tokens_raised_to_1"] == 4 and kept.num_requests == 40


async def test_a_windowed_stream_reports_the_rows_it_read_not_the_file(tmp_path):
    path = mooncake(tmp_path / "m.jsonl", 10_000, zero_every=10)
    _, summary = await run_records(StreamingReplay(str(path), time_scale=0.001).specs(RunShape(num_requests=100)))
    rows = summary.trace_rows
    assert not rows["is_whole_file"] and rows["num_rows_read"] < 10_000
    assert rows["dropped"]["zero_tokens"] == rows["num_rows_read"] // 10


# ---- the CLI ------------------------------------------------------------------------------------------


def test_run_streams_the_trace_simulated_or_not_and_sweep_loads_it(tmp_path):
    path = str(mooncake(tmp_path / "m.jsonl", 30))

    def setup(argv: list[str]) -> LoadSetup:
        return LoadSetup(options_from_args(build_parser().parse_args(argv)))

    assert isinstance(setup(["run", "--trace", path]).specs(None), ReplayStream)
    assert isinstance(setup(["run", "--trace", path, "--simulate"]).specs(None), ReplayStream)  # simulated too
    assert isinstance(setup(["sweep", "--trace", path, "--rates", "1,2"]).specs(1.0), list)


@pytest.mark.integration
def test_slobench_run_trace_streams_and_reports_its_rows(tmp_path, token_server, capsys):
    path = burstgpt(tmp_path / "b.csv")
    out = tmp_path / "run"
    argv = ["run", "--trace", str(path), "--time-scale", "0.02", "--url", token_server.base_url,
            "--model", token_server.model, "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["workload"]["trace"]["streamed"] is True
    assert summary["trace_rows"]["num_dropped"] == 5 and manifest["trace_rows"] == summary["trace_rows"]
    assert summary["num_requests"] == summary["num_scheduled"] == 36
    printed = capsys.readouterr().out
    assert "41 rows read (the whole file) -> 36 requests; 5 rows left out" in printed
    assert "1 unreadable rows skipped: line 8" in printed


@pytest.mark.integration
async def test_client_workers_take_a_streamed_trace(tmp_path, token_server):
    """--client-workers hands each request to a worker process as the runner takes it: a stream goes
    through them unchanged (every row one request, in order)."""
    from slobench.targets.workers import WorkerPool

    path = mooncake(tmp_path / "m.jsonl", 40, gap_ms=10)
    async with WorkerPool(2, token_server.base_url, TargetOptions(model=token_server.model)) as pool:
        await pool.preflight()
        res = await run(StreamingReplay(str(path)).specs(), pool, opts=RunOptions(progress=False),
                        handle_sigint=False)
    recs = sorted(res.records, key=lambda r: r.request_id)
    eager = TraceReplay.open(str(path)).specs()
    assert [(r.input_tokens, r.max_tokens) for r in recs] == [(s.input_tokens, s.max_tokens) for s in eager]
    assert res.summary.num_ok == 40 and res.summary.trace_rows["num_requests"] == 40


async def test_the_runner_builds_ahead_in_the_slack_never_between_a_spawn_and_its_send(tmp_path):
    """A stream builds requests ahead while the runner sleeps to its next send (`fill`), never between
    the runner spawning a send and the send itself."""
    from slobench.run.runner import Dispatcher
    from slobench.workload import trace_stream

    path = mooncake(tmp_path / "m.jsonl", 120, gap_ms=3)
    events: list[tuple[str, int]] = []
    real = trace_stream.StreamingReplay._requests

    def recording(self, *args, **kwargs):
        for spec in real(self, *args, **kwargs):
            events.append(("built", spec.request_id))
            yield spec

    class Recording(Dispatcher):
        def _spawn(self, coro) -> None:
            events.append(("spawned", len([e for e in events if e[0] == "spawned"])))
            super()._spawn(coro)

    class Target(InstantTarget):
        async def send(self, spec, rec) -> None:
            events.append(("sent", spec.request_id))
            await super().send(spec, rec)

    trace_stream.StreamingReplay._requests = recording  # type: ignore[method-assign]
    try:
        stream = StreamingReplay(str(path)).specs()
        clock = Clock()
        disp = Recording(Target(clock), clock, RunOptions(progress=False))
        clock.reset()
        await disp.open_loop(stream, fill=stream.fill)
        # every send is spawned once open_loop returns; `while disp.tasks: await next(iter(disp.tasks))` could
        # spin forever on a finished task whose discard callback has not run (awaiting a done task never yields)
        for task in list(disp.tasks):
            await task
    finally:
        trace_stream.StreamingReplay._requests = real  # type: ignore[method-assign]
    assert sorted(i for kind, i in events if kind == "sent") == list(range(120))
    for i in range(120):
        between = events[events.index(("spawned", i)) : events.index(("sent", i))]
        assert not any(kind == "built" for kind, _ in between), between
    built_at = {i: n for n, (kind, i) in enumerate(events) if kind == "built"}
    sent_at = {i: n for n, (kind, i) in enumerate(events) if kind == "sent"}
    assert max(sent_at[i] - built_at[i] for i in range(1, 120)) > 3  # built several sends ahead


def test_fill_builds_ahead_only_within_its_slack_and_bound(tmp_path):
    from slobench.workload.trace_stream import MAX_AHEAD

    stream = StreamingReplay(str(mooncake(tmp_path / "m.jsonl", MAX_AHEAD + 50))).specs()
    assert not stream.fill(0.0)  # no slack: nothing built
    built = 0
    while stream.fill(10.0):
        built += 1
    assert built == MAX_AHEAD - 1  # one was ready from the start
    assert [s.request_id for s in stream] == list(range(MAX_AHEAD + 50))


async def test_a_trace_damaged_part_way_stops_the_run_with_its_summary_written(tmp_path):
    import gzip

    from slobench.run.rundir import load_run

    plain = mooncake(tmp_path / "m.jsonl", 8000, gap_ms=1).read_bytes()
    packed = gzip.compress(plain)
    damaged = tmp_path / "m.jsonl.gz"
    damaged.write_bytes(packed[: len(packed) * 3 // 4])  # cut: the stream fails past its first rows
    clock = Clock()
    with pytest.raises(UsageError, match="cannot read the gzip-compressed file"):
        await run(StreamingReplay(str(damaged), time_scale=0.01).specs(), InstantTarget(clock), clock=clock,
                  opts=RunOptions(progress=False), run_dir=tmp_path / "r")
    back = load_run(tmp_path / "r")
    assert back.summary is not None and "gzip-compressed" in back.summary.stopped_by
    assert back.summary.interrupted and back.summary.num_scheduled is None
    assert 4096 < len(back.records) < 8000 and back.summary.num_requests == len(back.records)


def test_time_scale_with_a_closed_loop_is_refused(tmp_path, capsys):
    path = str(mooncake(tmp_path / "m.jsonl", 10))
    argv = ["run", "--trace", path, "--concurrency", "2", "--time-scale", "0.5", "--url", "http://127.0.0.1:9/v1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--time-scale and --concurrency conflict" in err[0]


def test_streamed_burstgpt_sessions_grow_and_share_their_history(tmp_path):
    p = tmp_path / "BurstGPT_3.csv"
    p.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "100.0,aaaa-1,3,GPT-4,100,20,120,Conversation log\n101.0,api-1,1,ChatGPT,50,5,55,API log\n"
                 "110.0,bbbb-2,2,ChatGPT,200,40,240,Conversation log\n120.0,aaaa-1,2,GPT-4,30,10,40,Conversation log\n"
                 "130.0,bbbb-2,4,ChatGPT,260,15,275,Conversation log\n140.0,aaaa-1,2,GPT-4,25,5,30,Conversation log\n")
    stream = StreamingReplay.open(str(p)).specs(RunShape(seed=4))
    specs = list(stream)
    eager = TraceReplay.open(str(p)).specs(RunShape(seed=4))
    assert [(s.session_id, s.input_tokens, s.max_tokens) for s in specs] == [
        (s.session_id, s.input_tokens, s.max_tokens) for s in eager]
    a = [s.prompt for s in specs if s.session_id == 0]
    assert [len(x) for x in a] == [100, 150, 185] and a[1][:100] == a[0] and a[2][:150] == a[1]
    assert stream.row_report()["altered"]["sent_with_session_history"] == 2


def test_a_simulated_trace_run_says_what_its_rows_became(tmp_path):
    path = burstgpt(tmp_path / "b.csv")
    out = tmp_path / "sim"
    assert main(["run", "--trace", str(path), "--simulate", "--no-progress", "--out", str(out)]) == 0
    rows = json.loads((out / "summary.json").read_text())["trace_rows"]
    assert rows["dropped"] == {"unreadable": 1, "zero_tokens": 4} and rows["num_requests"] == 36


def test_summarize_keeps_what_the_trace_rows_became(tmp_path, capsys):
    path = burstgpt(tmp_path / "b.csv")
    out = tmp_path / "sim"
    assert main(["run", "--trace", str(path), "--simulate", "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["summarize", str(out)]) == 0
    assert "41 rows read (the whole file) -> 36 requests; 5 rows left out" in capsys.readouterr().out
