"""The session fields of a record: written only when set, so a run without sessions writes the lines it always
did; and a requests.parquet written before the session columns existed still reads, as absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from slobench.api import load_run
from slobench.cli import main
from slobench.run.columnar import PARQUET, parquet_problem, read_parquet_columns
from slobench.run.records import RequestRecord

SESSION_COLUMNS = ("session_id", "turn", "estimated_s")  # what a run of sessions adds


def test_session_fields_are_written_only_when_set() -> None:
    plain = json.loads(RequestRecord(0, 0.0).to_json())
    assert not set(SESSION_COLUMNS) & set(plain)
    turn = json.loads(RequestRecord(1, 0.5, session_id=3, turn=2, estimated_s=0.25).to_json())
    assert (turn["session_id"], turn["turn"], turn["estimated_s"]) == (3, 2, 0.25)


def test_a_parquet_file_without_the_session_columns_still_reads(tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert main(["run", "--simulate", "--workload", "sessions", "--num-requests", "40", "--out", str(out),
                 "--no-progress"]) == 0
    path = out / PARQUET
    table = pq.read_table(path)
    written = pq.read_metadata(path).metadata
    assert set(SESSION_COLUMNS) <= set(table.column_names)
    older = table.drop_columns(list(SESSION_COLUMNS))  # as a slobench before sessions wrote it
    with pq.ParquetWriter(path, older.schema) as w:
        w.add_key_value_metadata(dict(written))
        w.write_table(older)
    assert parquet_problem(out) is None  # not refused (which would fall back to requests.jsonl)
    c = read_parquet_columns(out)
    assert len(c) == 40 and np.isnan(c.values["session_id"]).all() and np.isnan(c.values["turn"]).all()
    run = load_run(out)
    assert len(run.records) == 40 and all(r.session_id is None for r in run.records)
