"""A simulated run's chunk times held as slices of its step times (`StepChunks`) and its inter-token gaps
as values with counts (`GapCounts`): the same times, and the same ITL numbers bit for bit as the gaps laid
out, with preemptions (a request's times in several slices), a request overhead, several replicas, a warm-up
and failed requests."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import slobench.analysis.metrics as metrics_module
import slobench.run.columnar as columnar_module
from slobench.analysis.metrics import GapCounts, RecordArrays, chunk_gaps, describe, pairwise_sum, step_gaps
from slobench.analysis.summary import gap_dist, run_columns, summarize
from slobench.fleet.simulate import simulate_records, simulate_run
from slobench.run.columnar import RecordBuffer, StepTimes, columns_of_rows
from slobench.run.records import RequestRecord
from slobench.workload import load_workload
from slobench.workload.base import RunShape

KNOBS = {"profile": "h100-llama-1b", "kv_blocks": 384, "max_num_seqs": 16}  # a full cache preempts
CHAT = load_workload("chat")


def run(how: dict, n: int = 160) -> tuple[list[RequestRecord], RecordBuffer, RecordBuffer]:  # type: ignore[type-arg]
    """The records of a run streamed out, gathered by a plain buffer and by one matching step times."""
    steps = StepTimes(how.get("request_overhead_s", 0.0))
    plain, sliced, out = RecordBuffer(tokens=False), RecordBuffer(tokens=False, steps=steps), []

    def keep(rec: RequestRecord) -> None:
        if rec.request_id % 29 == 3:  # a warm-up request and a failure here and there
            rec = replace(rec, is_warmup=True)
        elif rec.request_id % 31 == 5:
            rec = replace(rec, status="error", error="boom")
        out.append(rec)
        plain.add(rec)
        sliced.add(rec)

    specs = CHAT.stream_specs(RunShape(rate_rps=60.0, num_requests=n, seed=5))
    simulate_records(specs, KNOBS, on_record=keep, step_times=steps, **how)
    return out, plain, sliced


HOWS = [{}, {"request_overhead_s": 0.004, "jitter_sd": 0.1}, {"replicas": 3}]


@pytest.mark.parametrize("how", HOWS)
def test_step_slices_hold_every_records_chunk_times(how: dict, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    monkeypatch.setattr(columnar_module, "FOLD_TIMES", 2000)  # several folds
    recs, plain, sliced = run(how)
    want, got = plain.columns(), sliced.columns()
    assert got.steps is not None and len(got.chunk_times_s) == 0
    assert np.array_equal(got.steps.times(), want.chunk_times_s) and np.array_equal(got.chunk_offsets, want.chunk_offsets)
    several = np.diff(got.steps.ends) > 1
    assert several.any()  # preempted requests: their times in several slices
    assert len(got.steps.starts) < len(want.chunk_times_s) / 20
    idx = np.array([5, 0, 77, 3, 3, 150])
    assert np.array_equal(got.take(idx).steps.times(), want.take(idx).chunk_times_s)  # type: ignore[union-attr]
    assert np.array_equal(got.steps.times(10, 20), want.chunk_times_s[want.chunk_offsets[10]:want.chunk_offsets[20]])
    for k, v in want.values.items():
        assert np.array_equal(got.values[k], v, equal_nan=True) if v.dtype != object else got.values[k].tolist() == v.tolist()


@pytest.mark.parametrize("how", HOWS)
def test_counted_gaps_give_the_laid_out_gaps_numbers_bit_for_bit(how: dict, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    monkeypatch.setattr(columnar_module, "FOLD_TIMES", 3000)
    monkeypatch.setattr(metrics_module, "GAP_COUNTS_MIN", 0)  # counted however few
    monkeypatch.setattr(metrics_module, "GAP_BLOCK", 700)  # summed over many blocks of requests
    monkeypatch.setattr(metrics_module, "PAIRWISE_LEAF", 256)  # and halved down to small leaves
    _, plain, sliced = run(how)
    want, got = run_columns(plain.columns(), consume=True).arrays, run_columns(sliced.columns(), consume=True).arrays
    assert isinstance(got.gaps, GapCounts) and isinstance(want.gaps, np.ndarray)
    assert len(got.gaps) == len(want.gaps) and np.array_equal(got.itl_s, want.itl_s)
    assert len(got.gaps.values) < len(want.gaps) / 3
    assert got.gaps.describe() == describe(want.gaps)
    assert gap_dist(got.gaps) == gap_dist(want.gaps)
    assert got.gaps.total == np.add.reduce(want.gaps)


def test_a_simulated_runs_summary_is_the_summary_of_its_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar_module, "FOLD_TIMES", 5000)
    monkeypatch.setattr(metrics_module, "GAP_COUNTS_MIN", 0)
    specs = list(CHAT.specs(RunShape(rate_rps=60.0, num_requests=120, seed=2)))
    out: list[RequestRecord] = []
    _, summary = simulate_run(specs, KNOBS, request_overhead_s=0.002, on_record=out.append, intervals=False)
    want = summarize(out, None, intervals=False)
    assert summary.itl == want.itl and summary.itl.count and summary.tpot == want.tpot


def test_times_no_step_has_are_kept_as_they_came() -> None:
    steps = StepTimes()
    steps.table(0).extend([1.0, 2.0, 3.0, 4.5, 6.0])
    buf = RecordBuffer(tokens=False, steps=steps)
    recs = [RequestRecord(0, 0.0, chunk_times_s=[2.0, 3.0, 4.5]),
            RequestRecord(1, 0.5, chunk_times_s=[1.0, 3.0, 4.5, 6.0]),  # skipped a step: two slices
            RequestRecord(2, 0.6, chunk_times_s=[2.0, 2.5, 6.0]),  # 2.5 is no step's time
            RequestRecord(3, 0.7),
            RequestRecord(4, 0.8, chunk_times_s=[7.0], replica=1)]  # a replica with no steps
    for r in recs:
        buf.add(r)
    c = buf.columns()
    assert c.steps is not None
    assert np.array_equal(c.steps.times(), columns_of_rows(recs, getattr).chunk_times_s)
    assert np.diff(c.steps.ends).tolist() == [1, 2, 1, 0, 1]
    lengths, ok = np.diff(c.chunk_offsets), np.ones(5, dtype=bool)
    want = chunk_gaps(c.steps.times(), lengths, ok)
    counted = step_gaps(c.steps, lengths, ok)
    assert isinstance(counted, np.ndarray) and np.array_equal(counted, want)  # few gaps: laid out


@pytest.mark.parametrize("n", [0, 1, 7, 128, 129, 1000, 70_001])
def test_a_sum_by_halves_over_blocks_is_numpys_sum(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "PAIRWISE_LEAF", 512)
    rng = np.random.default_rng(n)
    x = rng.lognormal(-4, 3, n) * rng.choice([1.0, 1e7], n)
    cuts = np.sort(rng.choice(n + 1, size=min(n, 40), replace=False)) if n else np.zeros(0, dtype=int)
    blocks = iter(np.split(x, cuts))
    got = pairwise_sum(blocks, n)
    assert got == np.add.reduce(x) and (not n or np.float64(got) / n == x.mean())


def test_record_arrays_read_the_gaps_either_way() -> None:
    recs = [RequestRecord(0, 0.0, sent_s=0.0, first_token_s=1.0, done_s=3.0, output_tokens=3,
                          chunk_times_s=[1.0, 2.0, 3.0], chunk_tokens=[1, 1, 1])]
    a = RecordArrays.from_records(recs)
    assert isinstance(a.gaps, np.ndarray) and a.itl_s.tolist() == [1.0, 1.0]
