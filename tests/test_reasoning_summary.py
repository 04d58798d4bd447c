"""The answer's metrics in the summary, the SLO, the gate's numbers and the reports, from records made by
hand; and requests.parquet files written before the reasoning columns existed, still read from the Parquet."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, summarize
from slobench.errors import SpecError
from slobench.report.terminal import print_run, reasoning_text
from slobench.run.columnar import (
    JSONL_BYTES_KEY,
    OPTIONAL,
    PARQUET,
    parquet_problem,
    read_parquet_records,
    use_parquet,
    write_parquet,
)
from slobench.run.records import REQUESTS, RequestRecord, write_records
from slobench.run.run_reader import read_run_columns


def rec(i: int, *, first_answer: float | None, reasoning: int | None, out: int = 11) -> RequestRecord:
    """Sent at 0, first token at 0.1, done at 1.1: 11 tokens a tenth of a second apart."""
    r = RequestRecord(i, 0.0, sent_s=0.0, first_token_s=0.1, done_s=1.1, output_tokens=out,
                      chunk_times_s=[0.1 + j / 10 for j in range(out)], chunk_tokens=[1] * out)
    if reasoning is not None:
        r.first_reasoning_s, r.first_answer_s = 0.1, first_answer
        r.reasoning_tokens, r.reasoning_tokens_source = reasoning, "usage" if i % 2 else "events"
    return r


def test_ttfa_answer_tpot_share_and_no_answer() -> None:
    records = [rec(0, first_answer=0.6, reasoning=5), rec(1, first_answer=0.6, reasoning=5),
               rec(2, first_answer=None, reasoning=11), rec(3, first_answer=None, reasoning=None)]
    s = summarize(records, SLO(ttft_s=0.2, ttfa_s=0.5, clock="sent"))
    assert s.ttft.p50 == pytest.approx(0.1)
    assert s.ttfa is not None and s.ttfa.count == 3  # the no-answer request has none; the plain one its TTFT
    assert sorted([s.ttfa.max, s.ttfa.p50]) == pytest.approx([0.6, 0.6])
    # answer TPOT: (1.1 - 0.6) / (6 - 1) for the reasoning answers; the plain one's is its TPOT
    assert s.answer_tpot is not None and s.answer_tpot.p50 == pytest.approx(0.1)
    assert s.reasoning == {"num_reasoning": 3, "num_no_answer": 1, "reasoning_tokens": 21, "output_tokens": 44,
                           "reasoning_share": pytest.approx(21 / 44), "counted_by": {"events": 2, "usage": 1}}
    # only the plain request answered within 0.5 s: 1 of 4 met
    assert s.attainment is not None and s.attainment.value == pytest.approx(0.25)
    flat = s.flat_metrics()
    assert flat["ttfa.p99"] == pytest.approx(0.6) and "answer_tpot.p50" in flat
    back = RunSummary.from_dict(s.to_dict())
    assert back.ttfa == s.ttfa and back.reasoning == s.reasoning and back.slo == s.slo
    text = reasoning_text(s.reasoning)
    assert text is not None and "1 completed with reasoning only, no answer token" in text and "48%" in text


def test_a_run_without_reasoning_keeps_its_summary() -> None:
    s = summarize([rec(0, first_answer=None, reasoning=None)], SLO(ttft_s=0.2))
    assert (s.ttfa, s.answer_tpot, s.reasoning) == (None, None, None)
    assert not any(k.startswith(("ttfa", "answer_tpot", "reasoning")) for k in s.to_dict())
    assert "ttfa_s" not in SLO(ttft_s=0.2).to_dict()


def test_the_slo_takes_ttfa() -> None:
    slo = SLO.parse("ttft=200ms,ttfa=2s,tpot=50ms")
    assert (slo.ttft_s, slo.ttfa_s, slo.tpot_s) == (0.2, 2.0, 0.05)
    assert SLO.parse("ttfa=1s").ttfa_s == 1.0 and "ttfa<=" in str(slo)
    assert SLO.from_dict({"ttfa": "750ms"}).ttfa_s == 0.75
    assert SLO.from_dict(slo.to_dict()) == slo
    for bad in ("ttfa=-1s", "ttfa=0", "ttfa=soon", "ttfa=1s,ttfa=2s"):
        with pytest.raises(SpecError, match="ttfa"):
            SLO.parse(bad)


def test_the_terminal_prints_the_answers_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    s = summarize([rec(0, first_answer=0.6, reasoning=5)], None)
    print_run(s, Console(width=200, color_system=None))
    out = capsys.readouterr().out
    assert "TTFA ms, first answer token (from sent)" in out and "TPOT ms, answer alone" in out
    assert "reasoning: 1 answers reasoned; reasoning 45% of output tokens (1 by counting the stream)" in out


def test_an_older_parquet_file_is_read_from_the_parquet(tmp_path: Path) -> None:
    records = [rec(0, first_answer=None, reasoning=None), rec(1, first_answer=0.6, reasoning=5)]
    write_records(tmp_path / REQUESTS, records)
    assert write_parquet(tmp_path, records)
    new = read_run_columns(tmp_path)
    size = (pq.read_metadata(tmp_path / PARQUET).metadata or {})[JSONL_BYTES_KEY]
    old = pq.read_table(tmp_path / PARQUET).drop_columns(list(OPTIONAL))  # an older slobench's columns
    pq.write_table(old.replace_schema_metadata({JSONL_BYTES_KEY: size}), tmp_path / PARQUET)
    assert use_parquet(tmp_path)  # not refused: the JSON lines are not read instead
    (tmp_path / REQUESTS).write_text("")  # the Parquet file is what is read: the lines are gone
    assert parquet_problem(tmp_path) is not None  # (a requests.jsonl of another size is noticed...)
    (tmp_path / REQUESTS).unlink()  # (... and without one the Parquet file stands alone)
    assert use_parquet(tmp_path)
    got = read_run_columns(tmp_path)
    for k in OPTIONAL:
        v = got.values[k]
        assert all(x is None or (isinstance(x, float) and math.isnan(x)) for x in v.tolist()), k
    assert got.values["first_token_s"].tolist() == new.values["first_token_s"].tolist()
    assert new.values["first_answer_s"].tolist()[1] == 0.6
    assert [r.first_answer_s for r in read_parquet_records(tmp_path)] == [None, None]  # the Python API's reader
