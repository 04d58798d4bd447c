"""Long simulated runs in bounded memory: requests made as they are taken (`FlatSpecs`), records streamed
out in arrival order as they finish (`simulate_records(on_record=...)`, `VirtualProbe` with a run
directory), a loaded trace held as columns (`TraceColumns`), and the bootstrap's quantile intervals from
shared resamples. Each gives exactly what the whole-list path gives."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest

import slobench.analysis.slo as slo_module
import slobench.experiments.probe as probe_module
from reference_engine.sequence import Sequence
from slobench.analysis.slo import SLO, block_length, bootstrap_quantile_cis, quantile_ci, quantile_cis
from slobench.experiments.probe import VirtualProbe, probe_jitter_seed
from slobench.fleet.decode_run import StandInPrompt
from slobench.fleet.simulate import simulate_records
from slobench.run.columnar import RecordBuffer, columns_of_rows
from slobench.run.records import RequestRecord
from slobench.run.rundir import load_run
from slobench.workload import load_workload
from slobench.workload.base import RunShape
from slobench.workload.prompts import TokenPromptDraws, token_prompts
from slobench.workload.replay import replay
from slobench.workload.spec import FlatSpecs
from slobench.workload.trace_stream import StreamingReplay
from slobench.workload.traces import Trace, TraceColumns, load_trace

KNOBS = {"profile": "h100-llama-1b", "kv_blocks": 512, "max_num_seqs": 16}
CHAT = load_workload("chat")


def shape(n: int = 150, **kw: object) -> RunShape:
    return RunShape(rate_rps=kw.pop("rate_rps", 25.0), num_requests=n, seed=3, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("api", [None, "chat"])
def test_flat_specs_are_the_listed_specs_and_can_be_taken_again(api: str | None) -> None:
    listed = CHAT.specs(shape(api=api))
    streamed = CHAT.stream_specs(shape(api=api))
    assert isinstance(streamed, FlatSpecs) and len(streamed) == len(listed)
    for _ in range(2):  # a second pass makes the same requests
        again = list(streamed)
        assert again == listed and [s.ids_below for s in again] == [s.ids_below for s in listed]


def test_prompt_heads_are_each_prompts_first_ids() -> None:
    specs = CHAT.stream_specs(shape(50, input_len=20))
    heads = list(specs.prompt_heads(16))  # type: ignore[attr-defined]
    assert heads == [np.array(s.prompt[:16], dtype=np.int64).tobytes() for s in specs]
    assert list(specs.prompt_heads(32)) == [None] * 50  # type: ignore[attr-defined]  # shorter than a block


@pytest.mark.parametrize("how", [{"request_overhead_s": 0.004, "jitter_sd": 0.1}, {"replicas": 3},
                                 {"prefill_replicas": 1, "decode_replicas": 1}])
def test_a_stream_of_requests_simulates_as_the_list_does_and_streams_records_in_arrival_order(how: dict) -> None:  # type: ignore[type-arg]
    knobs = {**KNOBS, **{k: v for k, v in how.items() if k.endswith("_replicas")}}
    opts = {k: v for k, v in how.items() if not k.endswith("_replicas")}
    listed = simulate_records(CHAT.specs(shape(rate_rps=60.0)), knobs, **opts)
    out: list = []  # type: ignore[type-arg]
    kept = simulate_records(CHAT.stream_specs(shape(rate_rps=60.0)), knobs, on_record=out.append, **opts)
    assert kept == [] and [astuple(r) for r in out] == [astuple(r) for r in listed]
    assert [r.request_id for r in out] == sorted(r.request_id for r in out)  # in arrival order


def test_prompts_that_share_a_first_block_keep_every_block() -> None:
    # every prompt the same: no block is private, and the stream's run is the list's (prefix hits included)
    same = [s for s in CHAT.specs(shape(40, input_len=64))]
    same = [type(s)(s.request_id, s.arrival_s, same[0].prompt, 64, s.max_tokens) for s in same]
    listed = simulate_records(same, KNOBS)
    streamed: list = []  # type: ignore[type-arg]
    simulate_records(iter(same), KNOBS, on_record=streamed.append)
    assert [astuple(r) for r in streamed] == [astuple(r) for r in listed]
    assert sum(r.cached_tokens or 0 for r in listed) > 0


def test_a_stream_out_of_arrival_order_is_refused() -> None:
    specs = CHAT.specs(shape(5))
    with pytest.raises(ValueError, match="out of arrival order"):
        simulate_records(iter([specs[1], specs[0]]), KNOBS)


async def test_a_simulated_probe_writes_the_records_it_would_have_kept(tmp_path: Path) -> None:
    slo = SLO.parse("ttft=300ms,tpot=40ms")
    probe = VirtualProbe(lambda rate, seed: CHAT.stream_specs(shape(60, rate_rps=rate)), KNOBS, slo=slo)
    kept = await probe(40.0, 3, None, {})
    written = await probe(40.0, 3, tmp_path / "run", {"seed": 3})
    assert not written.records and len(kept.records) == 60
    run = load_run(tmp_path / "run")
    assert [r.to_json() for r in run.records] == [r.to_json() for r in kept.records]
    assert written.summary == kept.summary
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_requests"] == 60


def mooncake(path: Path, n: int) -> Path:
    rng = np.random.default_rng(1)
    t = (np.cumsum(rng.exponential(4.0, n)) // 100 * 100).astype(int)  # coarse stamps: spread over buckets
    with open(path, "w") as fh:
        for i, ts in enumerate(t.tolist()):
            k = int(rng.integers(0, 1500))  # some zero-token rows, dropped
            ids = [i % 5, *range(10 + 3 * i, 10 + 3 * i + k // 512)]
            fh.write(json.dumps({"timestamp": ts, "input_length": k, "output_length": 1 + i % 9, "hash_ids": ids}) + "\n")
    return path


def test_a_loaded_trace_is_columns_and_replays_as_its_entries_do(tmp_path: Path) -> None:
    trace = load_trace(mooncake(tmp_path / "m.jsonl", 600), seed=2)
    assert isinstance(trace.entries, TraceColumns) and trace.notes  # the spread and the zero rows noted
    entries = tuple(trace.entries)
    assert list(trace.arrival_s) == [e.arrival_s for e in entries] == sorted(e.arrival_s for e in entries)
    assert trace.entries[-1] == entries[-1] and trace.entries[3:6] == entries[3:6] and trace.entries == entries
    as_tuple = Trace(trace.path, trace.format, entries, num_rows=trace.num_rows)
    for kw in ({"rate_rps": 20.0, "num_requests": 50}, {"rate_rps": 9.0, "duration_s": 4.0},
               {"time_scale": 0.5, "start_s": 1.0, "duration_s": 3.0}):
        assert replay(trace, seed=1, **kw) == replay(as_tuple, seed=1, **kw)  # type: ignore[arg-type]


def plain_bootstrap(x: np.ndarray, q: float, seed: int) -> tuple[float, float]:
    """The moving-block bootstrap of one quantile with every resample materialised at once."""
    x = x[~np.isnan(x)]
    n, b, blen = len(x), 1000, block_length(len(x))
    starts = np.random.default_rng(seed).integers(0, n - blen + 1, size=(b, -(-n // blen)))
    idx = (starts[:, :, None] + np.arange(blen)).reshape(b, -1)[:, :n]
    lo, hi = np.quantile(np.quantile(x[idx], q, axis=1), [0.025, 0.975])
    return float(lo), float(hi)


def test_quantile_intervals_from_shared_resamples_a_chunk_at_a_time_are_each_ones(monkeypatch) -> None:
    monkeypatch.setattr(slo_module, "RESAMPLE_CHUNK_VALUES", 20_000)  # 22 resamples a chunk
    x = np.random.default_rng(4).lognormal(0, 1, 1000)
    x[::11] = np.nan
    qs = (0.5, 0.9, 0.99)
    assert bootstrap_quantile_cis(x, qs, seed=5) == [plain_bootstrap(x, q, 5) for q in qs]
    assert quantile_cis(x, qs, seed=5) == [quantile_ci(x, q, seed=5) for q in qs]


@pytest.mark.parametrize("max_listed", [5, 20_000])
async def test_a_streamed_trace_simulates_alike_listed_or_taken_as_it_comes(tmp_path: Path, monkeypatch,
                                                                          max_listed: int) -> None:
    path = str(mooncake(tmp_path / "m.jsonl", 300))
    replay_ = StreamingReplay.open(path)

    def make_specs(rate: float | None, seed: int) -> object:
        return replay_.specs(RunShape(rate_rps=rate, num_requests=80, seed=seed))

    monkeypatch.setattr(probe_module, "MAX_LISTED", max_listed)
    res = await VirtualProbe(make_specs, KNOBS, slo=None, intervals=False)(30.0, 1, None, {})  # type: ignore[arg-type]
    listed = simulate_records(list(make_specs(30.0, 1)), KNOBS, seed=probe_jitter_seed(30.0, 1, "modeled"))  # type: ignore[call-overload]
    assert [astuple(r) for r in res.records] == [astuple(r) for r in listed] and len(listed) == 80
    assert res.summary.trace_rows["num_requests"] == 80  # the rows that became requests, not one more


def test_private_prompts_come_in_as_stand_ins_drawn_only_for_a_preempted_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # a full cache preempts: each preempted stand-in prompt is drawn, and the run is the list's to the byte
    drawn: list[int] = []
    real_call = StandInPrompt.__call__

    def counted(self: StandInPrompt, seq: Sequence) -> None:
        drawn.append(seq.seq_id)
        real_call(self, seq)
        assert min(seq.token_ids[: seq.num_prompt_tokens]) >= 1000  # the real ids, drawn from [1000, 30000)

    monkeypatch.setattr(StandInPrompt, "__call__", counted)
    listed = simulate_records(CHAT.specs(shape(rate_rps=60.0)), KNOBS)
    assert not drawn  # a list's prompts are all there
    streamed: list = []  # type: ignore[type-arg]
    simulate_records(CHAT.stream_specs(shape(rate_rps=60.0)), KNOBS, on_record=streamed.append)
    assert drawn and [astuple(r) for r in streamed] == [astuple(r) for r in listed]


def test_prompt_draws_give_each_prompt_again_in_any_order() -> None:
    lengths = np.random.default_rng(1).integers(1, 60, 9000)  # three batches
    prompts = token_prompts(lengths, np.random.default_rng(3))
    draws = TokenPromptDraws(lengths, np.random.default_rng(3))
    assert [draws.prompt(i) for i in (8999, 0, 4096, 4095, 17)] == [prompts[i] for i in (8999, 0, 4096, 4095, 17)]
    heads = TokenPromptDraws(lengths, np.random.default_rng(3)).heads(16)
    assert heads == [np.array(p[:16], dtype=np.int64).tobytes() if len(p) >= 16 else None for p in prompts]


def test_a_record_buffers_columns_are_the_records_columns() -> None:
    recs = simulate_records(CHAT.specs(shape(40)), KNOBS)
    recs += [RequestRecord(99, 1.5, tag="x", sent_s=None, status="error", error="boom", is_warmup=True, replica=2,
                           finish_reason="stop", cached_tokens=7),
             RequestRecord(100, 2.5, chunk_times_s=[2.75, 3.0], chunk_tokens=[1, 4], output_tokens_source="usage")]
    buf = RecordBuffer()
    for r in recs:
        buf.add(r)
    got, want = buf.columns(), columns_of_rows(recs, getattr)
    assert got.values.keys() == want.values.keys()
    for k, v in want.values.items():
        assert got.values[k].dtype == v.dtype and got.values[k].tolist() == v.tolist() or (
            np.array_equal(got.values[k], v, equal_nan=True)), k
    assert np.array_equal(got.chunk_times_s, want.chunk_times_s) and np.array_equal(got.chunk_offsets, want.chunk_offsets)
