"""Result files are checked before they are believed: a missing, newer or mistyped schema version, and
every kind of damage (empty, truncated, a directory, binary, not UTF-8, the wrong top-level type, NaN,
numbers past 64 bits, missing or mistyped fields) in any file that gate, history, report or summarize
reads is exit 2 with one line naming the file, never a traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from slobench.cli import main


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated run, a two-rate sweep, its baseline and a two-line history, made once."""
    d = tmp_path_factory.mktemp("results")
    sim = ["--simulate", "--workload", "tiny", "--num-requests", "20", "--no-progress"]
    assert main(["run", *sim, "--rate", "5", "--out", str(d / "run")]) in (0, 1)
    assert main(["sweep", *sim, "--rates", "5,10", "--out", str(d / "sweep")]) in (0, 1)
    assert main(["gate", "--candidate", str(d / "sweep"), "--write-baseline", str(d / "base.json")]) == 0
    assert main(["capacity", *sim, "--slo", "ttft=500ms", "--replicates", "2", "--max-probes", "3",
                 "--out", str(d / "cap")]) in (0, 1, 4)
    for commit in ("a1", "a2"):
        assert main(["history", "add", str(d / "sweep"), "--history", str(d / "h.jsonl"), "--commit", commit]) == 0
    return d


def _json_edit(fn: Callable[[dict], object]) -> Callable[[bytes], bytes]:
    def edit(raw: bytes) -> bytes:
        doc = json.loads(raw)
        fn(doc)
        return json.dumps(doc).encode()
    return edit


def _first_line(fn: Callable[[dict], object]) -> Callable[[bytes], bytes]:
    def edit(raw: bytes) -> bytes:
        first, *rest = raw.splitlines()
        doc = json.loads(first)
        fn(doc)
        return b"\n".join([json.dumps(doc).encode(), *rest]) + b"\n"
    return edit


WHOLE: dict[str, Callable[[bytes], bytes] | None] = {
    "empty": lambda raw: b"",
    "truncated": lambda raw: raw[: len(raw) // 2],
    "binary": lambda raw: bytes(range(256)),
    "not UTF-8": lambda raw: b"\xff\xfe" + raw,
    "a list": lambda raw: b"[1, 2]",
    "a number": lambda raw: b"42",
    "NaN": lambda raw: b"NaN",
    "nested too deep": lambda raw: b"[" * 100_000 + b"]" * 100_000,
    "a 5000-digit number": lambda raw: b'{"a": ' + b"9" * 5000 + b"}",
    "a directory": None,
}
SCHEMA = {
    "schema_version 99": _json_edit(lambda d: d.update(schema_version=99)),
    "schema_version missing": _json_edit(lambda d: d.pop("schema_version")),
    "schema_version '1'": _json_edit(lambda d: d.update(schema_version="1")),
    "schema_version true": _json_edit(lambda d: d.update(schema_version=True)),
}
# file -> the commands that read it ({d}: the results folder)
READERS = {
    "run/manifest.json": [["summarize", "{d}/run"], ["gate", "--baseline", "{d}/run", "--candidate", "{d}/run"],
                          ["history", "add", "{d}/run", "--history", "{d}/new.jsonl", "--commit", "x"]],
    "run/summary.json": [["gate", "--baseline", "{d}/run", "--candidate", "{d}/run"],
                         ["history", "add", "{d}/run", "--history", "{d}/new.jsonl", "--commit", "x"]],
    "sweep/sweep.json": [["gate", "--baseline", "{d}/base.json", "--candidate", "{d}/sweep"],
                         ["history", "add", "{d}/sweep", "--history", "{d}/new.jsonl", "--commit", "x"]],
    "base.json": [["gate", "--baseline", "{d}/base.json", "--candidate", "{d}/sweep"]],
    "cap/capacity.json": [["gate", "--baseline", "{d}/cap", "--candidate", "{d}/cap"],
                          ["history", "add", "{d}/cap", "--history", "{d}/new.jsonl", "--commit", "x"]],
}
FIELDS = {
    "run/manifest.json": {
        "seed 'x'": _json_edit(lambda d: d.update(seed="x")), "seed -1": _json_edit(lambda d: d.update(seed=-1)),
        "slo a string": _json_edit(lambda d: d.update(slo="x")),
        "slo a list": _json_edit(lambda d: d.update(slo=[])),
        "rate_rps 2**70": _json_edit(lambda d: d.update(rate_rps=2**70)),
        "rate_rps 1e400": lambda raw: raw.replace(b'"rate_rps": 5', b'"rate_rps": 1e400'),
        "workload_name a number": _json_edit(lambda d: d.update(workload_name=3)),
        "options a list": _json_edit(lambda d: d.update(options=[1])),
    },
    "run/summary.json": {
        "num_ok 'many'": _json_edit(lambda d: d.update(num_ok="many")),
        "ttft_s a list": _json_edit(lambda d: d.update(ttft_s=[1])),
        "duration_s 2**70": _json_edit(lambda d: d.update(duration_s=2**70)),
        "attainment a string": _json_edit(lambda d: d.update(attainment="x")),
    },
    "sweep/sweep.json": {
        "runs a string": _json_edit(lambda d: d.update(runs="x")),
        "a run without its rate": _json_edit(lambda d: d["runs"][0].pop("rate_rps")),
        "a rate as text": _json_edit(lambda d: d["runs"][0].update(rate_rps="5")),
        "a summary as a list": _json_edit(lambda d: d["runs"][0].update(summary=[])),
        "manifest a list": _json_edit(lambda d: d.update(manifest=[])),
        "manifest seed as text": _json_edit(lambda d: d["manifest"].update(seed="0")),
    },
    "cap/capacity.json": {
        "capacity_rps 'x'": _json_edit(lambda d: d.update(capacity_rps="x")),
        "interval_rps -1": _json_edit(lambda d: d.update(interval_rps=-1)),
        "probes a string": _json_edit(lambda d: d.update(probes="x")),
        "a probe's seed as text": _json_edit(lambda d: d["probes"][0].update(seed="x")),
        "a replicate without its seed": _json_edit(lambda d: d.update(replicates=[{"capacity_rps": 1.0}])),
        "manifest slo a string": _json_edit(lambda d: d["manifest"].update(slo="x")),
    },
    "base.json": {
        "metrics a list": _json_edit(lambda d: d.update(metrics=[])),
        "a replicate without its seed": _json_edit(
            lambda d: next(iter(d["metrics"].values()))["replicates"][0].pop("seed")),
        "kind other": _json_edit(lambda d: d.update(kind="other")),
        "workload a string": _json_edit(lambda d: d.update(workload="x")),
        "slo a list": _json_edit(lambda d: d.update(slo=[])),
    },
}
CASES = [(f, name, edit) for f in READERS for name, edit in {**WHOLE, **SCHEMA, **FIELDS.get(f, {})}.items()]


def _check_exit_2(argv: list[str], d: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([a.replace("{d}", str(d)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (argv, err)
    assert where in err[0] and "Traceback" not in err[0], err


@pytest.mark.parametrize(("rel", "name", "edit"), CASES, ids=[f"{f} {n}" for f, n, _ in CASES])
def test_a_damaged_or_foreign_result_file_is_exit_2_naming_it(results: Path, tmp_path: Path, rel: str, name: str,
                                                               edit: Callable[[bytes], bytes] | None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "r"
    shutil.copytree(results, d)
    path = d / rel
    if edit is None:
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(edit(path.read_bytes()))
    for argv in READERS[rel]:  # the file named, or its run directory where a directory stands in its place
        _check_exit_2(argv, d, str(path.parent if edit is None and rel.startswith("run/") else path), capsys)


HISTORY = {
    "schema 2": _first_line(lambda d: d.update(schema=2)),
    "schema missing": _first_line(lambda d: d.pop("schema")),
    "commit a number": _first_line(lambda d: d.update(commit=7)),
    "a metric of 4 values": _first_line(lambda d: d["metrics"].update(x=[1, 2, 3, 4])),
    "a metric with n as text": _first_line(lambda d: d["metrics"].update(x=[1, 1, 1, None, "5"])),
    "verdict maybe": _first_line(lambda d: d.update(verdict="maybe")),
    "workload a list": _first_line(lambda d: d.update(workload=[])),
    "garbage on the first line": lambda raw: b"\xff{{\n" + raw,
    "NaN mean": lambda raw: raw.replace(b"[0.", b"[NaN, 0.", 1),
    "torn first line": lambda raw: raw[: len(raw) // 2 - 20],
    **{k: v for k, v in WHOLE.items() if k not in ("empty", "truncated")},
}


@pytest.mark.parametrize(("name", "edit"), HISTORY.items(), ids=list(HISTORY))
def test_a_damaged_history_file_is_exit_2_naming_it(results: Path, tmp_path: Path, name: str,
                                                     edit: Callable[[bytes], bytes] | None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "h.jsonl"
    if edit is None:
        hist.mkdir()
    else:
        hist.write_bytes(edit((results / "h.jsonl").read_bytes()))
    _check_exit_2(["history", "report", str(hist), "-o", str(tmp_path / "h.html")], tmp_path, str(hist), capsys)
    _check_exit_2(["history", "add", str(results / "sweep"), "--history", str(hist), "--commit", "a3"], tmp_path,
                  str(hist), capsys)


# (a summary.json the report cannot read is left aside: it recomputes every number from requests.jsonl)
@pytest.mark.parametrize("rel", ["run/manifest.json", "sweep/sweep.json", "sweep/rate-5/manifest.json"])
def test_the_report_and_summarize_refuse_a_newer_schema(results: Path, tmp_path: Path, rel: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "r"
    shutil.copytree(results, d)
    (d / rel).write_bytes(SCHEMA["schema_version 99"]((d / rel).read_bytes()))
    folder = rel.split("/")[0]
    _check_exit_2(["report", f"{{d}}/{folder}", "-o", "{d}/r.html"], d, "schema_version 99", capsys)
    if folder == "run":
        _check_exit_2(["summarize", "{d}/run"], d, "schema_version 99", capsys)


@pytest.mark.parametrize("field", ["input_tokens", "max_tokens", "output_tokens", "scheduled_s"])
def test_the_report_names_a_record_of_the_wrong_type(results: Path, tmp_path: Path, field: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "r"
    shutil.copytree(results, d)
    path = d / "run" / "requests.jsonl"
    path.write_bytes(_first_line(lambda rec: rec.update({field: "x"}))(path.read_bytes()))
    (d / "run" / "requests.parquet").unlink()  # an older run's: its records only as JSON lines
    _check_exit_2(["report", "{d}/run", "-o", "{d}/r.html"], d, str(path), capsys)
