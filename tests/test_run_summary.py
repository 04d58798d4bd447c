"""Issue 12, item 1: one typed, schema-versioned results model (`RunSummary`), built by one function from
one column reader, written and read back without loss."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, columns_of, read_columns, summarize
from slobench.errors import UsageError
from slobench.report.synthetic import synthetic_records
from slobench.run.rundir import SCHEMA_VERSION, RunWriter, load_run, read_summary

SLO_ = SLO.parse("ttft=300ms,tpot=60ms")


def _records():  # type: ignore[no-untyped-def]
    recs = synthetic_records(12, 300, capacity_rps=10, seed=3, error_text="HTTP 500: boom",
                             tags=("chat", "doc"))
    for i, r in enumerate(recs):
        r.replica = i % 2
        if i % 7 == 0:
            r.cached_tokens = 16
    recs[0].is_warmup = True
    return recs


def test_summary_json_round_trips_through_the_typed_model(tmp_path: Path) -> None:
    s = replace(summarize(_records(), SLO_, seed=1), interrupted=False, num_scheduled=300, rate_rps=12.0,
                notes=("one note",))
    assert s.per_replica and s.per_tag and s.prefix_cache and s.attainment is not None
    w = RunWriter(tmp_path, {"rate_rps": 12.0})
    w.finish(s)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    back = read_summary(tmp_path)
    assert back is not None
    assert json.loads(json.dumps(back.to_dict())) == {k: v for k, v in doc.items() if k != "schema_version"}
    assert back.flat_metrics() == pytest.approx(s.flat_metrics())
    assert back.ttft.ci == s.ttft.ci and back.per_tag == s.per_tag and back.notes == ("one note",)


def test_one_function_from_records_in_memory_or_from_the_file(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, {})
    for r in _records():
        w.write(r)
    w.close()
    recs = load_run(tmp_path).records  # the file's numbers (times are written to the microsecond)
    mem, disk = summarize(columns_of(recs), SLO_, seed=2), summarize(read_columns(tmp_path), SLO_, seed=2)
    assert json.dumps(mem.to_dict(), sort_keys=True) == json.dumps(disk.to_dict(), sort_keys=True)
    assert mem.num_warmup == disk.num_warmup == 1


def test_intervals_change_no_point_number() -> None:
    recs = _records()
    full, lean = summarize(recs, SLO_, seed=0), summarize(recs, SLO_, seed=0, intervals="none")
    assert lean.attainment is not None and full.attainment is not None
    assert lean.attainment.value == full.attainment.value and lean.attainment.ci_low is None
    assert lean.ttft.p99 == full.ttft.p99 and lean.ttft.ci is None and full.ttft.ci
    assert lean.flat_metrics() == full.flat_metrics()


def test_unknown_keys_survive_and_a_malformed_summary_is_named(tmp_path: Path) -> None:
    s = summarize(_records(), None)
    doc = {**s.to_dict(), "from_a_newer_writer": {"x": 1}}
    assert RunSummary.from_dict(doc).to_dict()["from_a_newer_writer"] == {"x": 1}
    (tmp_path / "summary.json").write_text(json.dumps({"schema_version": 1, **doc, "num_ok": "many"}))
    with pytest.raises(UsageError, match=r"summary\.json.*malformed"):
        read_summary(tmp_path)
