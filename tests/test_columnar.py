"""requests.parquet: written beside requests.jsonl when a run ends, read column by column, and never trusted
over the JSON lines when it is damaged or stale; the summary is the same bytes from either file. And what
keeps a million records cheap gives the numbers the slower way gave."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slobench.analysis import metrics, slo
from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import SLO, bootstrap_quantile_ci, quantile_ci
from slobench.analysis.summary import read_columns, summarize
from slobench.cli import main
from slobench.report.stats import cdf_points
from slobench.report.synthetic import synthetic_records
from slobench.run import columnar
from slobench.run.columnar import PARQUET, columns_of_rows
from slobench.run.records import REQUESTS, RequestRecord, read_records
from slobench.run.run_reader import read_run_columns
from slobench.run.rundir import RunWriter, load_run, read_summary, write_summary

SLO_ = SLO.parse("ttft=300ms,tpot=60ms")


def _records() -> list[RequestRecord]:
    recs = synthetic_records(12, 400, capacity_rps=10, seed=3, error_text="HTTP 500: boom", tags=("chat", "doc"))
    for i, r in enumerate(recs):
        r.replica = i % 3 if i % 5 else None
        r.cached_tokens = 16 if i % 7 == 0 else None
        r.usage_output_tokens = r.output_tokens + (i % 11 == 0) if i % 2 else None
        r.finish_reason = "length" if i % 4 == 0 else None
        r.retried = "server closed the connection before the response ended" if i % 6 == 1 else None
        r.queued_s = 0.01 * (i % 3)
    recs[0].is_warmup = recs[1].is_warmup = True
    recs[5].chunk_times_s, recs[5].chunk_tokens = [], []  # an answer that came whole
    recs[5].first_token_s = recs[5].done_s
    recs[9].sent_s = recs[9].first_token_s = recs[9].done_s = None  # never sent
    recs[9].status, recs[9].error = "cancelled", "cancelled before send"
    return recs


def _write_run(run_dir: Path, recs: list[RequestRecord]) -> Path:
    w = RunWriter(run_dir, {"seed": 2})
    for r in recs:
        w.write(r)
    w.finish({})
    return run_dir


def _summary_bytes(run_dir: Path, out: Path) -> bytes:
    write_summary(out, summarize(read_columns(run_dir), SLO_, seed=2))
    return (out / "summary.json").read_bytes()


def test_the_summary_is_the_same_bytes_read_from_parquet_or_from_json_lines(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", _records())
    assert (run / PARQUET).is_file() and not (run / f"{PARQUET}.tmp").exists()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    from_parquet = _summary_bytes(run, tmp_path / "a")
    (run / PARQUET).rename(tmp_path / "aside.parquet")
    from_jsonl = _summary_bytes(run, tmp_path / "b")
    assert from_parquet == from_jsonl
    assert json.loads(from_parquet)["num_warmup"] == 2


def test_load_run_gives_the_same_records_from_either_file(tmp_path: Path) -> None:
    recs = _records()
    run = _write_run(tmp_path, recs)
    assert columnar.use_parquet(run)
    from_parquet = load_run(run).records
    assert from_parquet == read_records(run / REQUESTS)
    assert from_parquet[5].chunk_times_s == [] and from_parquet[9].sent_s is None
    assert from_parquet[0].finish_reason == "length" and from_parquet[1].finish_reason is None


def test_the_columns_are_the_same_from_either_file(tmp_path: Path) -> None:
    run = _write_run(tmp_path, _records())
    a = columnar.table_columns(columnar.read_table(run))
    (run / PARQUET).unlink()
    b = read_run_columns(run)
    assert a.values.keys() == b.values.keys()
    for k in a.values:
        assert np.array_equal(a.values[k], b.values[k], equal_nan=a.values[k].dtype.kind == "f"), k
    assert np.array_equal(a.chunk_times_s, b.chunk_times_s) and np.array_equal(a.chunk_offsets, b.chunk_offsets)


def test_row_groups_with_their_own_strings_read_as_the_json_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # strings are read as each row group's dictionary: groups with other words, or none at all, in each column
    monkeypatch.setattr(columnar, "ROW_GROUP", 40)
    recs = _records()
    for i, r in enumerate(recs):
        r.tag = None if i < 60 else f"class-{i // 100}"
        r.finish_reason = "stop" if 100 <= i < 140 else r.finish_reason if i >= 300 else None
    run = _write_run(tmp_path, recs)
    assert pq.read_metadata(run / PARQUET).num_row_groups == 10
    a = columnar.read_parquet_columns(run)
    (run / PARQUET).unlink()
    b = read_run_columns(run)
    for k in a.values:
        assert a.values[k].dtype == b.values[k].dtype, k
        assert np.array_equal(a.values[k], b.values[k], equal_nan=a.values[k].dtype.kind == "f"), k
    assert np.array_equal(a.chunk_times_s, b.chunk_times_s) and np.array_equal(a.chunk_offsets, b.chunk_offsets)


def test_times_are_stored_byte_stream_split_not_through_a_dictionary(tmp_path: Path) -> None:
    run = _write_run(tmp_path, _records())
    group = pq.read_metadata(run / PARQUET).row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    for name in columnar.BYTE_STREAM_SPLIT:
        assert "BYTE_STREAM_SPLIT" in encodings[name] and "RLE_DICTIONARY" not in encodings[name], name
    assert "RLE_DICTIONARY" in encodings["status"]  # a few distinct words: a dictionary is what suits them


@pytest.mark.parametrize("block", [3, 7, 1 << 20])
def test_gaps_and_taken_rows_match_a_per_request_loop(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "GAP_BLOCK", block)  # blocks that end inside requests, and one block
    recs = _records()
    c = columns_of_rows(recs, getattr)
    order = np.array([7, 3, 5, 0, 9, 8])
    taken = c.take(order)
    for j, i in enumerate(order):
        got = taken.chunk_times_s[taken.chunk_offsets[j]:taken.chunk_offsets[j + 1]]
        assert got.tolist() == recs[i].chunk_times_s
    a = RecordArrays.from_records(recs, include_warmup=True)
    by_id = {r.request_id: r for r in recs}
    want = [g for rid, ok in zip(a.request_id, a.is_ok, strict=True) if ok
            for g in np.diff(by_id[int(rid)].chunk_times_s)]
    assert np.array_equal(a.itl_s, np.array(want))
    lengths, ok = np.diff(c.chunk_offsets), np.arange(len(c)) % 4 != 1  # failures with chunk times too
    apart = metrics.chunk_gaps(c.chunk_times_s, lengths, ok)
    flat = c.chunk_times_s.copy()
    over = metrics.chunk_gaps(flat, lengths, ok, in_place=True)
    assert np.array_equal(over, apart) and np.shares_memory(over, flat) and len(apart) < len(want)
    assert a.is_whole.sum() == 1 and a.tag[0] in ("chat", "doc")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_parquet_file_is_passed_over_with_a_note(tmp_path: Path, damage: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path / "run", _records())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want = _summary_bytes(run, tmp_path / "a")
    data = (run / PARQUET).read_bytes()
    (run / PARQUET).write_bytes(data[: len(data) // 2] if damage == "truncated" else b"PAR1" + b"x" * 100)
    capsys.readouterr()
    assert _summary_bytes(run, tmp_path / "b") == want
    assert load_run(run).records == read_records(run / REQUESTS)
    err = capsys.readouterr().err
    assert f"{PARQUET}: unreadable" in err and f"reading {REQUESTS}" in err


def test_a_parquet_file_older_than_its_json_lines_is_not_read(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    recs = _records()
    run = _write_run(tmp_path, recs)
    with open(run / REQUESTS, "a") as fh:  # a record added by hand after the run
        fh.write(RequestRecord(request_id=999, scheduled_s=99.0, status="error", error="late").to_json() + "\n")
    assert len(read_columns(run).arrays) == len(recs) - 2 + 1
    assert "written beside a requests.jsonl of" in capsys.readouterr().err


def test_a_failed_parquet_write_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    class FullDisk:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "ParquetWriter", FullDisk)  # the module columnar imports where it writes
    recs = _records()
    run = _write_run(tmp_path, recs)
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json", REQUESTS, "summary.json"]
    assert "No space left on device" in capsys.readouterr().err
    assert [r.request_id for r in load_run(run).records] == [r.request_id for r in recs]


def test_a_write_failing_part_way_leaves_no_file_and_the_run_goes_on(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar, "ROW_GROUP", 100)  # several row groups, the second one fails
    calls = []
    real = pq.ParquetWriter.write_table

    def write_table(self: pq.ParquetWriter, table: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(self, table, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    recs = _records()
    run = _write_run(tmp_path, recs)
    assert not (run / PARQUET).exists() and not (run / f"{PARQUET}.tmp").exists()
    assert len(read_records(run / REQUESTS)) == len(recs) and read_summary(run) is not None


def test_rewrite_keeps_the_parquet_file_in_step(tmp_path: Path) -> None:
    recs = _records()
    w = RunWriter(tmp_path, {})
    for r in recs:
        w.write(r)
    recs[2].is_warmup = True  # the warm-up cut, known at the end
    w.rewrite(recs)
    w.finish({})
    assert load_run(tmp_path).records == read_records(tmp_path / REQUESTS)
    assert [r.is_warmup for r in load_run(tmp_path).records][:3] == [True, True, True]
    assert columnar.parquet_problem(tmp_path) is None


def test_summarize_rewrite_builds_the_parquet_file_of_an_older_run(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path / "run", _records())
    (run / PARQUET).unlink()  # as an older slobench left it
    assert main(["summarize", str(run)]) == 0
    before = capsys.readouterr().out
    assert main(["summarize", str(run), "--rewrite"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {run / PARQUET}" in out and out.endswith(before)
    assert columnar.parquet_problem(run) is None and load_run(run).records == read_records(run / REQUESTS)
    (run / REQUESTS).unlink()
    assert main(["summarize", str(run), "--rewrite"]) == 2


@pytest.mark.slow
def test_a_large_runs_quantile_interval_is_close_to_the_full_bootstrap() -> None:
    # past FULL_RESAMPLE_MAX values each resample draws that many (m-out-of-n) and the spread is scaled back
    rng = np.random.default_rng(1)
    x = rng.exponential(1.0, 60_000)
    lo, hi = bootstrap_quantile_ci(x, 0.9, seed=0)
    full_lo, full_hi = bootstrap_quantile_ci(x, 0.9, num_resamples=100, seed=0)  # every resample the whole run
    assert lo < np.log(10) < hi
    assert 0.6 < (hi - lo) / (full_hi - full_lo) < 1.6
    iid_width = 2 * 1.96 * np.sqrt(0.9 * 0.1 / len(x)) / 0.1  # the exponential's density at its p90 is 0.1
    assert 0.7 < (hi - lo) / iid_width < 1.5
    q_lo, q_hi = quantile_ci(x, 0.99)
    assert q_lo is not None and q_hi is not None and q_lo < np.quantile(x, 0.99) < q_hi


def test_chunk_times_are_rounded_as_the_json_lines_round_them() -> None:
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(0, 100, 20_000), rng.uniform(0, 1e5, 20_000),
                        (np.arange(20_000) + 0.5) / 1e9,  # halves of the last digit: Python decides
                        [0.0, -2.5e-9, 1e300, 5e-324, np.nan, np.inf]])
    assert np.array_equal(columnar.round_9(x), np.array([round(v, 9) for v in x.tolist()]), equal_nan=True)


def test_the_95_percent_z_is_scipys() -> None:
    from scipy.stats import norm

    assert slo.Z_95 == slo.normal_quantile(0.975) == float(norm.ppf(0.975))


def test_cdf_points_are_the_sorted_samples_order_statistics() -> None:
    x = np.random.default_rng(5).lognormal(size=30_000)
    x[::97] = np.nan
    values, probs = cdf_points(x)
    finite = np.sort(x[np.isfinite(x)])
    assert len(values) <= 500 and np.array_equal(values, finite[np.round(probs * len(finite)).astype(int) - 1])


def test_a_closed_writer_leaves_the_columns_readable_before_the_summary(tmp_path: Path) -> None:
    # a simulator that summarises from the files on disk: close, read the columns, then write the summary
    recs = _records()
    w = RunWriter(tmp_path, {})
    for r in recs:
        w.write(r)
    w.close()
    assert columnar.parquet_problem(tmp_path) is None
    summary = summarize(read_columns(tmp_path), SLO_, seed=2)
    w.finish(summary)
    assert read_summary(tmp_path) == summary and columnar.parquet_problem(tmp_path) is None


def test_summarize_takes_a_run_directory(tmp_path: Path) -> None:
    run = _write_run(tmp_path, _records())
    assert summarize(run, SLO_, seed=2) == summarize(read_columns(run), SLO_, seed=2)


def test_the_cli_keeps_large_arrays_off_huge_pages(tmp_path: Path) -> None:
    probe = ("from slobench.cli import main; main(['summarize', 'absent']); import numpy, pyarrow; "
             "import os; print(numpy._core.multiarray._get_madvise_hugepage(), os.environ['MIMALLOC_ALLOW_LARGE_OS_PAGES'])")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMPY_MADVISE_HUGEPAGE", "MIMALLOC_ALLOW_LARGE_OS_PAGES")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "0"]


@pytest.mark.parametrize("kind", ["lognormal", "ties", "sorted", "infinite", "periodic"])
def test_windowed_quantiles_are_np_quantiles_bit_for_bit(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "GAP_BLOCK", 1000)  # many blocks
    rng = np.random.default_rng(7)
    n = 50_003
    x = {"lognormal": rng.lognormal(-3, 0.5, n), "ties": rng.integers(0, 40, n) / 1e3,
         "sorted": np.sort(rng.random(n)), "infinite": np.where(rng.random(n) < 0.02, np.inf, rng.random(n)),
         "periodic": np.where(np.arange(n) % metrics.SAMPLE_STEP == 0, 0.0, 1.0 + rng.random(n))}[kind]
    qs = (0.5, 0.9, 0.99, 0.001, 0.37)
    monkeypatch.setattr(metrics, "WINDOWED_MIN", 1000)
    with np.errstate(invalid="ignore"):  # inf - inf where two infinities are interpolated: NaN, both ways
        want = np.quantile(x, qs)
        got = metrics.windowed_quantiles(x, qs)
        through = np.array(list(metrics.quantiles(x, qs).values()))
    if kind == "periodic":
        assert got is None  # the sample saw only the zeros: the windows missed, and said so
    else:
        assert got is not None and got.tobytes() == want.tobytes()
    assert through.tobytes() == want.tobytes()


@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=40), st.integers(1, 12))
def test_gaps_of_any_lengths_match_differencing_each_request(reqs: list[tuple[int, bool]], block: int) -> None:
    old = metrics.GAP_BLOCK
    metrics.GAP_BLOCK = block  # blocks ending anywhere: inside requests, at empty ones, past the last
    try:
        lengths = np.array([n for n, _ in reqs], dtype=np.int64)
        ok = np.array([k for _, k in reqs])
        flat = np.cumsum(np.arange(1, int(lengths.sum()) + 1) ** 1.5)  # distinct gaps, increasing times
        ends = np.cumsum(lengths)
        want = [g for i, (n, k) in enumerate(reqs) if k and n > 1 for g in np.diff(flat[ends[i] - n:ends[i]])]
        assert metrics.chunk_gaps(flat, lengths, ok).tolist() == want
        assert metrics.chunk_gaps(flat.copy(), lengths, ok, in_place=True).tolist() == want
    finally:
        metrics.GAP_BLOCK = old
