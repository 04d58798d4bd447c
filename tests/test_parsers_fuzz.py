"""Property-based tests of the input parsers. Whatever a user or a file holds, each parser either returns a
value or raises slobench's own error (exit 2 with one line), never a Python exception that would print a
traceback: the SLO string and TOML, the workload spec, trace files, the record reader, URLs and headers,
result files (manifest, summary, history lines), and the terminal escaping of outside text."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.errors import SlobenchError
from slobench.history.record import read_history
from slobench.load_flags import check_urls, parse_headers
from slobench.printable import printable
from slobench.run.records import RequestRecord, record_problem
from slobench.run.rundir import check_manifest, check_schema, load_run, read_json
from slobench.workload.spec import WorkloadSpec
from slobench.workload.traces import load_trace

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SLO_KEYS = st.sampled_from(["ttft", "tpot", "e2e", "target", "clock", "ttft_s", "x", ""])
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FILES = settings(FAST, max_examples=80)  # each example writes a file


@FAST
@given(st.text(max_size=60))
def test_slo_strings(text: str) -> None:
    try:
        SLO.parse(text)
    except SlobenchError:
        pass


@FAST
@given(st.dictionaries(SLO_KEYS, json_values, max_size=5))
def test_slo_tables(d: dict[str, Any]) -> None:
    try:
        SLO.from_dict(d)
    except SlobenchError:
        pass


WORKLOAD_KEYS = st.sampled_from(["name", "api", "prompt", "num_requests", "ignore_eos", "min_tokens", "arrival",
                                 "input", "output", "process", "rate", "dist", "mean", "min", "max", "classes",
                                 "phases", "system_prompts", "sessions"])


@FAST
@given(st.dictionaries(WORKLOAD_KEYS, json_values, max_size=6))
def test_workload_specs(d: dict[str, Any]) -> None:
    try:
        WorkloadSpec.from_dict(d)
    except SlobenchError:
        pass


@FAST
@given(st.dictionaries(st.sampled_from(["request_id", "scheduled_s", "sent_s", "chunk_times_s", "chunk_tokens",
                                        "status", "output_tokens", "error", "tag"]), json_values, max_size=6))
def test_record_reader(d: dict[str, Any]) -> None:
    d.setdefault("request_id", 0)
    d.setdefault("scheduled_s", 0.0)
    if record_problem(d) is None:  # then it loads, and a summary of it works
        RequestRecord.from_dict(d)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "manifest.json").write_text('{"schema_version": 1}')
        (run / "requests.jsonl").write_text(json.dumps(d) + "\n")
        try:
            load_run(run)
        except SlobenchError:
            pass


TRACE_HEADS = st.sampled_from([
    "TIMESTAMP,ContextTokens,GeneratedTokens\n", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
    '{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n', "",
])


@FAST
@given(TRACE_HEADS, st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=40), max_size=6),
       st.sampled_from([".csv", ".jsonl", ".txt"]))
def test_trace_files(head: str, rows: list[str], suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"t{suffix}"
        path.write_text(head + "\n".join(rows) + "\n", encoding="utf-8", errors="surrogatepass")
        try:
            load_trace(path)
        except SlobenchError:
            pass


@FAST
@given(st.text(max_size=60))
def test_urls(text: str) -> None:
    try:
        check_urls(text)
    except SlobenchError:
        pass


@FAST
@given(st.lists(st.text(max_size=30), max_size=3))
def test_headers(items: list[str]) -> None:
    try:
        headers = parse_headers(items)
    except SlobenchError:
        return
    for k, v in headers.items():  # what is accepted can be sent as is: no line break, nothing outside ASCII
        assert (k + v).isascii() and not any(c in k + v for c in "\r\n\x00")


@FILES
@given(json_values)
def test_result_file_tops(doc: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.json"
        path.write_text(json.dumps(doc))
        try:
            check_manifest(path, check_schema(path, read_json(path)))
        except SlobenchError:
            pass


SUMMARY_KEYS = st.sampled_from(["num_requests", "num_ok", "duration_s", "ttft_s", "tpot_s", "attainment", "client",
                                "slo", "per_tag", "per_replica", "error_counts", "notes", "lengths", "rate_rps"])


@FILES
@given(st.dictionaries(SUMMARY_KEYS, json_values, max_size=6))
def test_summaries(d: dict[str, Any]) -> None:
    try:
        RunSummary.from_dict(d).flat_metrics()
    except SlobenchError:
        pass


@FILES
@given(st.dictionaries(st.sampled_from(["schema", "commit", "metrics", "workload", "slo", "verdict", "date"]),
                       json_values, max_size=7))
def test_history_lines(d: dict[str, Any]) -> None:
    d.setdefault("schema", 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.jsonl"
        path.write_text(json.dumps(d) + "\n")
        try:
            read_history(path)
        except SlobenchError:
            pass


@FAST
@given(st.text(max_size=40))
def test_printable_leaves_no_control_character(text: str) -> None:
    shown = printable(text)
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in shown)
