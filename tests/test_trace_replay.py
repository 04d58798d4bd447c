"""Trace replay end to end and its time arithmetic: scaled times, rate rescaling, windows, Mooncake
block sharing, the `--trace` flags of `slobench run`, and a recording server on 127.0.0.1."""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from aiohttp import web

from slobench.cli import build_parser, main
from slobench.cli.common import options_from_args
from slobench.errors import UsageError
from slobench.load_setup import LoadSetup
from slobench.run.clock import Clock
from slobench.run.runner import RunOptions, run
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.workload.replay import TraceReplay, block_token_ids, replay
from slobench.workload.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:00.0000000,100,10
2023-11-16 18:00:00.5000000,200,20
2023-11-16 18:00:01.0000000,300,30
2023-11-16 18:00:03.0000000,400,40
2023-11-16 18:00:04.0000000,500,50
"""


# ---- a server that records what it receives --------------------------------------------------------


class Recorder:
    """An OpenAI-style endpoint that records (receive time on the run's clock, body) and streams one token."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.received: list[tuple[float, dict]] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t = self.clock.now_s()
        body = json.loads(await request.read())
        self.received.append((t, body))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"choices": [{"index": 0, "text": " x", "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}}
        await resp.write(f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp


async def start_recorder(clock: Clock) -> tuple[Recorder, web.AppRunner, str]:
    rec = Recorder(clock)
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/completions", rec.completions)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # a free port, bound before serving: ready when start() returns
    site = web.SockSite(runner, sock)
    await site.start()
    return rec, runner, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def replay_through_server(specs):
    clock = Clock()
    rec, server, url = await start_recorder(clock)
    target = OpenAITarget(url, TargetOptions(model="m"), clock)
    await target.start()
    try:
        res = await run(specs, target, clock=clock, opts=RunOptions(progress=False), handle_sigint=False)
    finally:
        await target.close()
        await server.cleanup()
    return res, rec.received


@pytest.mark.integration
@needs_traces
@pytest.mark.parametrize("which", ["code", "conv"])
async def test_azure_replay_sends_one_request_per_row_at_its_scaled_time(which):
    path = TRACES / f"AzureLLMInferenceTrace_{which}.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))[:200]
    trace = load_trace(path)
    assert len(trace.entries) == sum(1 for _ in open(path)) - 1 and not trace.problems
    span = trace.entries[199].arrival_s
    scale = 4.0 / span  # the first 200 rows in about 4 s
    specs = replay(trace, num_requests=200, time_scale=scale, seed=0, min_tokens="none")  # the recorder sends 1 token
    assert len(specs) == 200
    res, received = await replay_through_server(specs)
    assert res.summary.num_ok == 200 and len(received) == 200
    # One request per row, carrying the row's token counts (a token-id prompt of ContextTokens ids).
    want = sorted((int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows)
    got = sorted((len(body["prompt"]), body["max_tokens"]) for _, body in received)
    assert got == want
    assert all(isinstance(x, int) for _, body in received for x in body["prompt"][:5])
    # ... at the row's time, scaled: each prompt is unique, so it names its spec.
    by_prompt = {tuple(s.prompt): s for s in specs}
    assert len(by_prompt) == 200
    late = np.array([t - by_prompt[tuple(body["prompt"])].arrival_s for t, body in received])
    assert late.min() > -0.005, late.min()  # never early
    # Bursts in the code trace put requests < 1 ms apart; encoding multi-thousand-token bodies on a busy
    # shared CPU makes the client itself a little late there (the runner measures and reports that), so
    # the bounds are loose; an unscaled or unordered replay is off by seconds, not tenths.
    assert np.median(late) < 0.1 and late.max() < 1.0, (np.median(late), late.max())
    recv_t = [t for t, _ in received]
    sched_t = [by_prompt[tuple(body["prompt"])].arrival_s for _, body in received]
    assert np.corrcoef(recv_t, sched_t)[0, 1] > 0.99
    first = [s.arrival_s for s in specs]
    row_t = trace.arrival_s[:200]
    assert np.allclose(first, row_t * scale)


@pytest.mark.integration
async def test_mooncake_prompts_reach_the_server_with_their_shared_blocks(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 10, "input_length": 1300, "output_length": 4, "hash_ids": [7, 8, 10]},
    ]
    path = write(tmp_path, "mc.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    specs = replay(load_trace(path), time_scale=0.01, min_tokens="none")
    _, received = await replay_through_server(specs)
    a, b = sorted((body["prompt"] for _, body in received), key=len)
    assert a[:1024] == b[:1024] and a[1024:1030] != b[1024:1030]


# ---- time arithmetic --------------------------------------------------------------------------------


def test_time_scale_multiplies_times(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", AZURE))
    specs = replay(trace, time_scale=0.5)
    assert [s.arrival_s for s in specs] == pytest.approx([0, 0.25, 0.5, 1.5, 2.0])
    assert [s.input_tokens for s in specs] == [100, 200, 300, 400, 500]
    assert [len(s.prompt) for s in specs] == [100, 200, 300, 400, 500]
    assert [s.max_tokens for s in specs] == [10, 20, 30, 40, 50]
    assert all(s.tag == "a" for s in specs)


def test_rate_rescales_to_the_target_mean_keeping_the_burst_shape(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", AZURE))
    native = replay(trace)
    specs = replay(trace, rate_rps=10.0)
    t = np.array([s.arrival_s for s in specs])
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(10.0)
    g0, g1 = np.diff([s.arrival_s for s in native]), np.diff(t)
    assert np.allclose(g1 / g0, g1[0] / g0[0])  # every gap scaled by one factor


def test_start_and_duration_window_the_trace(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", AZURE))
    specs = replay(trace, start_s=0.75, time_scale=2.0, duration_s=5.0)
    # Rows at 1.0 and 3.0 s are in; at scale 2 they land at 0.5 and 4.5 s; 4.0 s lands at 6.5 > 5.
    assert [s.arrival_s for s in specs] == pytest.approx([0.5, 4.5])
    assert [s.input_tokens for s in specs] == [300, 400]
    assert [s.request_id for s in specs] == [0, 1]
    assert len(replay(trace, num_requests=2)) == 2
    with pytest.raises(UsageError, match="holds no request"):
        replay(trace, start_s=100.0)


def test_replay_prompts_are_seeded_and_salted_by_rate(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", AZURE))
    assert replay(trace, seed=1) == replay(trace, seed=1)
    assert replay(trace, seed=1)[0].prompt != replay(trace, seed=2)[0].prompt
    # A sweep's runs must not share prefixes: another rate, other prompt content.
    assert replay(trace, rate_rps=1.0)[0].prompt != replay(trace, rate_rps=2.0)[0].prompt


def test_chat_replay_sends_text_of_the_row_length(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", AZURE))
    specs = replay(trace, api="chat")
    assert all(isinstance(s.prompt, str) for s in specs)
    assert [len(s.prompt.split()) for s in specs] == [100, 200, 300, 400, 500]


# ---- Mooncake block sharing -------------------------------------------------------------------------


MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 0, "input_length": 1536, "output_length": 6, "hash_ids": [1, 2, 4]},
    {"timestamp": 3000, "input_length": 700, "output_length": 7, "hash_ids": [1, 5]},
    {"timestamp": 3000, "input_length": 300, "output_length": 8, "hash_ids": [1]},
    {"timestamp": 6000, "input_length": 1400, "output_length": 9, "hash_ids": [6, 2, 3]},
    {"timestamp": 6000, "input_length": 2000, "output_length": 9, "hash_ids": [1, 2]},  # more tokens than blocks
]


def mooncake(tmp_path: Path) -> Path:
    return write(tmp_path, "mc.jsonl", "".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS))


def test_mooncake_requests_sharing_hash_ids_share_those_blocks_and_differ_after(tmp_path):
    trace = load_trace(mooncake(tmp_path))
    specs = replay(trace, seed=3)
    by_len = {s.input_tokens: s.prompt for s in specs}
    assert sorted(by_len) == [300, 700, 1400, 1500, 1536, 2000]  # exact lengths
    p1500, p1536, p700, p300, p1400, p2000 = (by_len[n] for n in (1500, 1536, 700, 300, 1400, 2000))
    B = 512
    # [1,2,3] vs [1,2,4]: the first two blocks are identical, the third differs.
    assert p1500[: 2 * B] == p1536[: 2 * B]
    assert p1500[2 * B : 2 * B + 50] != p1536[2 * B : 2 * B + 50]
    # [1,5] vs [1,2,...]: block 1 shared, block 2 not.
    assert p700[:B] == p1500[:B] and p700[B:] != p1500[B:700]
    # A last partial block is a prefix of the same full block elsewhere.
    assert p300 == p1500[:300]
    # [6,2,3]: a different first block; blocks 2 and 3 are the same *tokens* as in [1,2,3] (same ids)
    # but sit after a different prefix, so a prefix cache would not reuse them (chained hashes).
    assert p1400[:B] != p1500[:B] and p1400[B : 2 * B] == p1500[B : 2 * B]
    # Beyond its blocks a request's tokens are its own.
    assert p2000[: 2 * B] == p1500[: 2 * B] and p2000[2 * B :] != p1500[2 * B :]
    # Block tokens are a function of (key, hash id) alone: the same in another replay with that seed.
    assert replay(trace, seed=3) == specs
    assert replay(trace, seed=4)[0].prompt[:B] != specs[0].prompt[:B]


def test_block_token_ids_are_deterministic_and_in_range():
    a = block_token_ids(5, 42, 512, (100, 200))
    assert a.shape == (512,) and a.min() >= 100 and a.max() < 200
    assert np.array_equal(a, block_token_ids(5, 42, 512, (100, 200)))
    assert np.array_equal(block_token_ids(5, 42, 100, (100, 200)), a[:100])
    assert not np.array_equal(a, block_token_ids(5, 43, 512, (100, 200)))
    assert len(np.unique(a)) > 90  # not a constant or a short cycle


def test_mooncake_buckets_are_spread_and_said_so(tmp_path):
    trace = load_trace(mooncake(tmp_path), seed=0)
    t = trace.arrival_s
    assert len(np.unique(t)) == len(t)  # no two fire at once
    stamps = np.array([r["timestamp"] for r in MOONCAKE_ROWS]) / 1000.0
    lengths = {e.input_tokens: e.arrival_s for e in trace.entries}
    for r, stamp in zip(MOONCAKE_ROWS, stamps, strict=True):
        assert stamp <= lengths[r["input_length"]] < stamp + 3.0
    assert any("buckets" in n and "spread" in n for n in trace.notes)
    assert load_trace(mooncake(tmp_path), seed=0).arrival_s.tolist() == t.tolist()
    assert load_trace(mooncake(tmp_path), seed=1).arrival_s.tolist() != t.tolist()


# ---- the CLI ----------------------------------------------------------------------------------------


def setup_for(argv: list[str]) -> LoadSetup:
    return LoadSetup(options_from_args(build_parser().parse_args(argv)))


def test_load_setup_builds_specs_from_a_trace(tmp_path):
    path = write(tmp_path, "a.csv", AZURE)
    setup = setup_for(["run", "--trace", str(path), "--time-scale", "0.5", "--start", "0.5", "--seed", "2"])
    specs = list(setup.specs(None))  # `run` streams the trace: an iterator, taken once
    assert [s.arrival_s for s in specs] == pytest.approx([0, 0.25, 1.25, 1.75])
    assert [s.max_tokens for s in specs] == [20, 30, 40, 50]
    fast = list(setup.specs(4.0))  # --rate / a sweep's rate: the mean rate of the replay
    t = [s.arrival_s for s in fast]
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(4.0)
    man = setup.manifest(SimpleNamespace(model="m", caps=None), "m")
    assert man["workload"]["trace"]["format"] == "azure" and man["workload"]["time_scale"] == 0.5
    assert man["phases"] == []
    assert setup.workload.name == "a"


def test_load_setup_records_phase_boundaries_in_the_manifest():
    setup = setup_for(["run", "--workload", "day-shift"])
    man = setup.manifest(SimpleNamespace(model="m", caps=None), "m")
    assert man["phases"] == [{"name": "morning", "start_s": 0.0}, {"name": "afternoon", "start_s": 120.0}]
    cut = setup_for(["run", "--workload", "day-shift", "--duration", "100"]).manifest(SimpleNamespace(model="m", caps=None), "m")
    assert cut["phases"] == [{"name": "morning", "start_s": 0.0}]


def test_run_with_an_unusable_trace_exits_2_before_any_connection(tmp_path, capsys):
    empty = write(tmp_path, "empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n")
    bad = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,x,1\n")
    url = "http://127.0.0.1:9/v1"  # nothing listens there: reaching it would be exit 3, not 2
    assert main(["run", "--trace", str(empty), "--url", url, "--no-progress"]) == 2
    assert "no usable requests in 0 rows" in capsys.readouterr().err
    assert main(["run", "--trace", str(bad), "--url", url, "--no-progress"]) == 2
    assert "line 2: ContextTokens is not a number" in capsys.readouterr().err
    assert main(["run", "--trace", str(tmp_path / "missing.csv"), "--url", url]) == 2
    path = write(tmp_path, "a.csv", AZURE)
    assert main(["run", "--trace", str(path), "--time-scale", "-1", "--url", url]) == 2
    assert main(["run", "--trace", str(path), "--input-len", "5", "--url", url]) == 2


def test_trace_replay_open_warns_about_skipped_rows(tmp_path):
    path = write(tmp_path, "a.csv", AZURE + "2023-11-16 18:00:05,7,\n")
    heard: list[str] = []
    tr = TraceReplay.open(str(path), warn=heard.append)
    assert len(tr.specs()) == 5
    assert heard and "line 7" in heard[0] and "GeneratedTokens is empty" in heard[0]



@pytest.mark.integration
def test_slobench_run_trace_end_to_end(tmp_path, token_server):
    path = write(tmp_path, "a.csv", AZURE)
    out = tmp_path / "run"
    argv = ["run", "--trace", str(path), "--time-scale", "0.1", "--url", token_server.base_url,
            "--model", token_server.model, "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["workload"]["trace"]["format"] == "azure" and manifest["phases"] == []
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted((r["input_tokens"], r["max_tokens"]) for r in records) == [
        (100, 10), (200, 20), (300, 30), (400, 40), (500, 50)
    ]
    assert sorted(r["scheduled_s"] for r in records) == pytest.approx([0, 0.05, 0.1, 0.3, 0.4])
    assert all(r["status"] == "ok" and r["prompt_tokens"] == r["input_tokens"] for r in records)
