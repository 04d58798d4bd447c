"""requests.jsonl's line format: `RequestRecord.to_json` writes exactly what `json.dumps(asdict(record))`
(with chunk times rounded to ns) wrote before it was made cheaper, so files and their readers are unchanged."""

from __future__ import annotations

import json
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

from slobench.run.records import RequestRecord

_time = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))
_records = st.builds(
    RequestRecord,
    request_id=st.integers(min_value=0, max_value=2**40),
    scheduled_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    tag=st.text(max_size=8),
    sent_s=_time,
    first_token_s=_time,
    done_s=_time,
    chunk_times_s=st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=20),
    chunk_tokens=st.lists(st.integers(min_value=1, max_value=64), max_size=20),
    input_tokens=st.integers(min_value=0, max_value=10**6),
    prompt_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    cached_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    output_tokens=st.integers(min_value=0, max_value=10**6),
    usage_output_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    max_tokens=st.integers(min_value=0, max_value=10**6),
    status=st.sampled_from(["ok", "error", "timeout", "cancelled"]),
    error=st.one_of(st.none(), st.text(max_size=40)),  # non-ASCII included: the ellipsis of a cut message
    http_status=st.one_of(st.none(), st.integers(min_value=100, max_value=599)),
    is_warmup=st.booleans(),
    queued_s=st.floats(min_value=0, max_value=10, allow_nan=False),  # tiny values print with exponents
    replica=st.one_of(st.none(), st.integers(min_value=0, max_value=64)),
    finish_reason=st.one_of(st.none(), st.sampled_from(["length", "stop"])),
    output_tokens_source=st.one_of(st.none(), st.sampled_from(["usage", "max_tokens", "tokenizer", "events"])),
    retried=st.one_of(st.none(), st.text(max_size=40)),
    session_id=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    turn=st.one_of(st.none(), st.integers(min_value=0, max_value=64)),
    estimated_s=st.one_of(st.none(), _time),
    first_reasoning_s=_time,
    first_answer_s=_time,
    reasoning_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
    reasoning_tokens_source=st.one_of(st.none(), st.sampled_from(["usage", "events"])),
)


def reference_line(r: RequestRecord) -> str:
    d = asdict(r)
    d["chunk_times_s"] = [round(t, 9) for t in r.chunk_times_s]
    # written only when set (by a target, or for a session's turns)
    for name in ("finish_reason", "output_tokens_source", "retried", "session_id", "turn", "estimated_s",
                 "first_reasoning_s", "first_answer_s", "reasoning_tokens", "reasoning_tokens_source"):
        if d[name] is None:
            del d[name]
    return json.dumps(d, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(_records)
def test_to_json_writes_the_same_bytes_as_before(r: RequestRecord) -> None:
    line = r.to_json()
    assert line == reference_line(r)
    assert RequestRecord.from_dict(json.loads(line)).to_json() == line


_any_float = st.floats()  # NaN, infinities, subnormals, negatives: what json writes its own way
_odd_records = st.builds(
    RequestRecord,
    request_id=st.integers(min_value=-(2**70), max_value=2**70),  # past 64 bits: orjson refuses, json writes
    scheduled_s=_any_float,
    tag=st.text(max_size=8),
    sent_s=st.one_of(st.none(), _any_float),
    first_token_s=st.one_of(st.none(), _any_float),
    done_s=st.one_of(st.none(), _any_float),
    chunk_times_s=st.lists(st.one_of(_any_float, st.floats(min_value=1e-4, max_value=1e5)), max_size=20),
    chunk_tokens=st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=5),
    error=st.one_of(st.none(), st.text(max_size=40)),
    queued_s=_any_float,
    finish_reason=st.one_of(st.none(), st.text(max_size=6)),
)


@settings(max_examples=300, deadline=None)
@given(_odd_records)
def test_to_json_is_jsons_for_any_value(r: RequestRecord) -> None:
    # the fast path (orjson) takes only what it writes as json does; the rest goes through json itself
    assert r.to_json() == reference_line(r)


def test_to_json_takes_numpy_floats_as_json_does() -> None:
    import numpy as np

    r = RequestRecord(3, float(np.float64(1.5)), sent_s=np.float64(1.25), chunk_times_s=[np.float64(1.5)])  # type: ignore[list-item]
    assert r.to_json() == reference_line(r)


def test_a_record_line_is_pinned() -> None:
    r = RequestRecord(7, 0.5, tag="chat", sent_s=0.5001, first_token_s=0.55, done_s=0.6,
                      chunk_times_s=[0.55, 0.5612345678912], chunk_tokens=[1, 2], input_tokens=16, output_tokens=3,
                      max_tokens=3, error="cut…", queued_s=2.5e-06)
    assert r.to_json() == (
        '{"request_id":7,"scheduled_s":0.5,"tag":"chat","sent_s":0.5001,"first_token_s":0.55,"done_s":0.6,'
        '"chunk_times_s":[0.55,0.561234568],"chunk_tokens":[1,2],"input_tokens":16,"prompt_tokens":null,'
        '"cached_tokens":null,"output_tokens":3,"usage_output_tokens":null,"max_tokens":3,"status":"ok",'
        '"error":"cut\\u2026","http_status":null,"is_warmup":false,"queued_s":2.5e-06,"replica":null}'
    )


def test_what_a_server_said_is_written_when_set() -> None:
    r = RequestRecord(1, 0.0, output_tokens=16, max_tokens=16, finish_reason="length", output_tokens_source="max_tokens")
    assert r.to_json().endswith('"replica":null,"finish_reason":"length","output_tokens_source":"max_tokens"}')
    assert RequestRecord.from_dict(json.loads(r.to_json())) == r


@settings(max_examples=200, deadline=None)
@given(_records, st.lists(st.one_of(st.floats(min_value=0, max_value=1e7), _any_float,
                                    st.integers(min_value=0, max_value=99).map(lambda k: (k + 0.5) / 1e9)),
                          min_size=33, max_size=80))
def test_a_long_answers_chunk_times_are_rounded_as_one_by_one(r: RequestRecord, times: list[float]) -> None:
    # past 32 chunks the times are rounded at numpy's speed (`round_9`), to the same bytes
    r.chunk_times_s = times
    assert r.to_json() == reference_line(r)
    r.chunk_times_s = [*times[:-1], 7]  # an int among them: written as an int, as json does
    assert r.to_json() == reference_line(r)


@settings(max_examples=200, deadline=None)
@given(_records, st.lists(st.one_of(st.floats(min_value=1e-4, max_value=1e7),
                                    st.floats(min_value=1e6, max_value=1e17),
                                    st.integers(min_value=10**5, max_value=10**8).map(lambda k: (k + 0.5) / 1e9)),
                          min_size=33, max_size=80))
def test_a_long_answer_in_plain_floats_is_written_from_its_array_to_the_same_bytes(
        r: RequestRecord, times: list[float]) -> None:
    # every time a float json writes without an exponent: orjson writes the rounded array itself (halves at
    # the ninth decimal, and magnitudes where a float's spacing passes 1e-9, go the one-by-one way)
    r.chunk_times_s = times
    assert r.to_json() == reference_line(r)
    r.chunk_times_s = sorted(t + 1.0 for t in times)
    assert r.to_json() == reference_line(r)
