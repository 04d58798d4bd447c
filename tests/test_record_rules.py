"""One set of rules for a run's records however they are read, and requests.parquet never trusted over
requests.jsonl where it breaks them or disagrees with it: a bad value in the Parquet file is a note naming it
and the summary of the JSON lines; a bad record in the JSON lines is exit 2 naming the file and the record;
a run with no readable record is an error, never a summary of nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slobench.analysis.summary import read_columns, summarize
from slobench.cli import main
from slobench.report.synthetic import synthetic_records
from slobench.run.columnar import JSONL_BYTES_KEY, PARQUET, STATUS_COUNTS_KEY
from slobench.run.records import REQUESTS
from slobench.run.rundir import RunWriter, load_run

NUM = 40


def _run(path: Path) -> Path:
    w = RunWriter(path, {"seed": 1})
    for r in synthetic_records(4, NUM, capacity_rps=10, seed=1):
        w.write(r)
    w.finish({})
    return path


def _summary(run: Path) -> dict[str, Any]:
    return summarize(read_columns(run), None, seed=1).to_dict()


def _alter_parquet(run: Path, table: Callable[[pa.Table], pa.Table] = lambda t: t,
                   meta: Callable[[dict[bytes, bytes]], dict[bytes, bytes]] = lambda m: m) -> None:
    """requests.parquet rewritten with its table and key-value metadata changed (requests.jsonl untouched)."""
    path = run / PARQUET
    kept = {k: v for k, v in (pq.read_metadata(path).metadata or {}).items() if k != b"ARROW:schema"}
    t = table(pq.read_table(path))
    pq.write_table(t.replace_schema_metadata(meta(kept)), path)


def _set(t: pa.Table, name: str, row: int, value: Any) -> pa.Table:
    col = t.column(name).to_pylist()
    col[row] = value
    return t.set_column(t.schema.get_field_index(name), t.schema.field(name), pa.array(col, t.schema.field(name).type))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "metadata that is not a size": (lambda run: _alter_parquet(run, meta=lambda m: {**m, JSONL_BYTES_KEY: b"12x"}),
                                    f"metadata's {JSONL_BYTES_KEY.decode()} is not a size"),
    "a NaN scheduled_s": (lambda run: _alter_parquet(run, lambda t: _set(t, "scheduled_s", 3, float("nan"))),
                          "record 4: missing 'scheduled_s'"),
    "an infinite first_token_s": (lambda run: _alter_parquet(run, lambda t: _set(t, "first_token_s", 5, float("inf"))),
                                  "record 6: first_token_s must be a finite number (got inf)"),
    "an infinite chunk time": (lambda run: _alter_parquet(
        run, lambda t: _set(t, "chunk_times_s", 7, [1.0, float("inf")])), "record 8: chunk_times_s must be finite"),
    "a negative output_tokens": (lambda run: _alter_parquet(run, lambda t: _set(t, "output_tokens", 2, -5)),
                                 "record 3: output_tokens must be >= 0 (got -5)"),
    "statuses changed since written": (lambda run: _alter_parquet(
        run, lambda t: t.set_column(t.schema.get_field_index("status"), "status", pa.array(["error"] * NUM))),
        "holds error 40 where its writer wrote"),
    "no rows (an older file without counts)": (lambda run: _alter_parquet(
        run, lambda t: t.slice(0, 0), lambda m: {k: v for k, v in m.items() if k != STATUS_COUNTS_KEY}),
        f"holds no record where {REQUESTS} holds some"),
    "another last record": (lambda run: _alter_parquet(
        run, lambda t: _set(t, "output_tokens", NUM - 1, 12345),
        lambda m: {k: v for k, v in m.items() if k != STATUS_COUNTS_KEY}),
        f"its last record's output_tokens is 12345 where {REQUESTS}'s is"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_parquet_file_breaking_a_rule_is_passed_over_for_the_json_lines(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "run")
    want = _summary(run)
    damage, named = CASES[case]
    damage(run)
    capsys.readouterr()
    with np.errstate(all="raise"):  # no numpy warning on the way (inf - inf)
        assert _summary(run) == want
    err = capsys.readouterr().err
    assert f"{PARQUET}: " in err and named in err and f"reading {REQUESTS}" in err, err
    assert load_run(run).records == load_run(_without_parquet(run)).records


def _without_parquet(run: Path) -> Path:
    (run / PARQUET).unlink()
    return run


def _jsonl_run(tmp_path: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    run = _without_parquet(_run(tmp_path / "run"))
    rows = [json.loads(x) for x in (run / REQUESTS).read_text().splitlines()]
    (run / REQUESTS).write_text("".join(json.dumps(d) + "\n" for d in edit(rows)))
    return run


def _set_row(rows: list[dict[str, Any]], i: int, **kw: Any) -> list[dict[str, Any]]:
    rows[i].update(kw)
    return rows


@pytest.mark.parametrize(("edit", "named"), [
    (lambda rows: _set_row(rows, 4, output_tokens=-5), "record 5: output_tokens must be >= 0 (got -5)"),
    (lambda rows: _set_row(rows, 6, input_tokens=-1), "record 7: input_tokens must be >= 0 (got -1)"),
    (lambda rows: _set_row(rows, 9, status="weird"), "record 10: status must be ok, error, timeout or cancelled"),
])
def test_an_implausible_record_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                                                  named: str) -> None:
    run = _jsonl_run(tmp_path, edit)
    assert main(["summarize", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / REQUESTS}: {named}" in err, err


@pytest.mark.parametrize("rewrite", [False, True])
@pytest.mark.parametrize("text", ["", '{"request_id": 0, "scheduled_s": 0.1, "status": "o'])
def test_a_run_with_no_readable_record_is_an_error_naming_the_file(tmp_path: Path, text: str, rewrite: bool,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _without_parquet(_run(tmp_path / "run"))
    (run / REQUESTS).write_text(text)  # emptied, or one line cut short; summary.json still says 40
    # --rewrite: an empty requests.parquet made from it is no summary either
    assert main(["summarize", str(run), *(["--rewrite"] if rewrite else [])]) == 2
    err = capsys.readouterr().err
    assert f"{run / REQUESTS}: no readable request record" in err, err
