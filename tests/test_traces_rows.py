"""What a trace loader keeps, alters or drops, and says so: coarse stamps spread only when the trace is
really coarsely stamped, zero-token rows left out or kept on request, compressed files (issue 14)."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from slobench.errors import UsageError
from slobench.workload.replay import replay
from slobench.workload.traces import load_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:05.0000000,110,27
"""


def mooncake_rows(stamps_ms) -> str:
    return "".join(json.dumps({"timestamp": int(t), "input_length": 10 + i, "output_length": 3}) + "\n"
                   for i, t in enumerate(stamps_ms))


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


# ---- coarse stamps ------------------------------------------------------------------------------------


def test_a_millisecond_trace_with_a_few_duplicates_keeps_its_stamps(tmp_path):
    rng = np.random.default_rng(1)
    stamps = np.cumsum(rng.integers(1, 400, size=300))
    stamps[rng.choice(np.arange(1, 300), size=11, replace=False)] = 0  # 11 duplicates of their predecessor
    stamps = np.maximum.accumulate(stamps)
    tr = load_trace(write(tmp_path, "m.jsonl", mooncake_rows(stamps)))
    assert tr.arrival_s.tolist() == pytest.approx(((stamps - stamps[0]) / 1000.0).tolist())
    assert not any("bucket" in n for n in tr.notes)


def test_a_constant_rate_file_with_one_duplicated_stamp_keeps_gap_cv(tmp_path):
    stamps = np.arange(500) * 100
    stamps[250] = stamps[249]
    tr = load_trace(write(tmp_path, "m.jsonl", mooncake_rows(stamps)))
    gaps = np.diff(tr.arrival_s)
    assert tr.arrival_s.tolist() == pytest.approx((stamps / 1000.0).tolist())
    assert gaps.std() / gaps.mean() < 0.1  # one 0 s and one 0.2 s gap in 499: CV 0.06, not 0.46


def test_coarse_buckets_are_spread_over_their_width_and_said_so(tmp_path):
    stamps = np.repeat(np.arange(20) * 3000, 10)  # 3 s buckets, 10 requests each
    path = write(tmp_path, "m.jsonl", mooncake_rows(stamps))
    tr = load_trace(path, seed=2)
    t = tr.arrival_s
    assert len(np.unique(t)) == len(t)
    by_len = {e.input_tokens: e.arrival_s for e in tr.entries}
    for i, s in enumerate(stamps / 1000.0):
        assert s <= by_len[10 + i] < s + 3.0
    assert any("3 s buckets" in n and "200 requests on 20 stamps" in n and "--no-spread" in n for n in tr.notes)
    kept = load_trace(path, spread=False)
    assert kept.arrival_s.tolist() == (np.sort(stamps) / 1000.0).tolist()
    assert not any("bucket" in n for n in kept.notes)


def test_equal_stamps_off_any_grid_are_sent_as_written(tmp_path):
    rng = np.random.default_rng(3)
    stamps = np.repeat(np.cumsum(rng.integers(100, 5000, size=30)), 4)  # bursts of 4 at irregular times
    tr = load_trace(write(tmp_path, "m.jsonl", mooncake_rows(stamps)))
    assert tr.arrival_s.tolist() == pytest.approx(((stamps - stamps[0]) / 1000.0).tolist())


# ---- zero-token rows ----------------------------------------------------------------------------------

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,GPT-4,417,30,447,API log
50,GPT-4,0,12,12,API log
"""


def test_zero_token_rows_are_left_out_and_counted_never_called_malformed(tmp_path):
    tr = load_trace(write(tmp_path, "b.csv", BURSTGPT))
    assert len(tr.entries) == 2 and tr.problems == () and tr.num_rows == 4
    assert tr.describe()["num_zero_dropped"] == 2 and tr.describe()["num_zero_kept"] == 0
    note = " ".join(tr.notes)
    assert "left out 2 of 4 rows" in note and "1 with 0 output tokens (failed requests)" in note
    assert "1 with 0 input tokens" in note and "--keep-zero-rows" in note and "malformed" not in note


def test_zero_token_rows_kept_as_the_nearest_request(tmp_path):
    tr = load_trace(write(tmp_path, "b.csv", BURSTGPT), keep_zero=True)
    assert tr.arrival_s.tolist() == [0.0, 40.0, 41.0, 45.0]  # every arrival of the trace
    assert [(e.input_tokens, e.output_tokens) for e in tr.entries] == [(472, 18), (1087, 1), (417, 30), (1, 12)]
    assert tr.describe()["num_zero_kept"] == 2 and tr.describe()["num_zero_dropped"] == 0
    assert any("kept 2 of 4 rows" in n for n in tr.notes)
    specs = replay(tr)
    assert [(s.input_tokens, len(s.prompt), s.max_tokens) for s in specs][1:4:2] == [(1087, 1087, 1), (1, 1, 12)]


def test_a_trace_of_only_zero_rows_says_why_it_is_empty(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,0,3\n2023-01-01 00:00:01,5,0\n"
    with pytest.raises(UsageError, match=r"no usable requests in 2 rows; 2 with 0 input or output tokens dropped"):
        load_trace(write(tmp_path, "a.csv", text))
    assert len(load_trace(write(tmp_path, "a.csv", text), keep_zero=True).entries) == 2


# ---- compressed files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "pack"), [("gz", gzip.compress), ("bz2", bz2.compress), ("xz", lzma.compress)])
def test_compressed_traces_read_like_plain_ones(tmp_path, suffix, pack):
    plain = load_trace(write(tmp_path, "a.csv", AZURE))
    packed = load_trace(write(tmp_path, f"b.csv.{suffix}", pack(AZURE.encode())))
    assert packed.format == "azure" and packed.entries == plain.entries
    moon = mooncake_rows([0, 1000, 2500])
    assert len(load_trace(write(tmp_path, f"m.jsonl.{suffix}", pack(moon.encode()))).entries) == 3


def test_zstd_trace_reads_or_says_what_is_missing(tmp_path):
    if importlib.util.find_spec("zstandard") is None:
        path = write(tmp_path, "a.csv.zst", b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
        with pytest.raises(UsageError, match=r"zstd-compressed.*zstandard"):
            load_trace(path)
    else:
        import zstandard

        path = write(tmp_path, "a.csv.zst", zstandard.ZstdCompressor().compress(AZURE.encode()))
        assert len(load_trace(path).entries) == 3


def test_archives_and_damaged_files_say_what_they_are(tmp_path):
    with pytest.raises(UsageError, match="zip archive"):
        load_trace(write(tmp_path, "a.zip", b"PK\x03\x04" + b"\x00" * 40))
    damaged = gzip.compress((AZURE * 200).encode())[:-40]
    with pytest.raises(UsageError, match="gzip-compressed"):
        load_trace(write(tmp_path, "d.csv.gz", damaged))
