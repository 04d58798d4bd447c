"""Trace loaders: format detection, each format's fields, malformed rows with line numbers, conversion."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.workload.replay import replay
from slobench.workload.traces import detect_format, load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:05.0000000,110,27
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,GPT-4,417,30,447,API log
"""
MOONCAKE = '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49]}\n'
SLOBENCH = '{"arrival_s": 0.5, "input_tokens": 3, "max_tokens": 4, "prompt": [5, 6, 7], "tag": "x"}\n'
SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "hello there friend"},
        {"from": "gpt", "value": "hi how are you"},
        {"from": "human", "value": "fine thanks"},
        {"from": "gpt", "value": "good"},
    ]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "no human turn"}]},
    {"id": "c", "conversations": [
        {"from": "system", "value": "be nice"},
        {"from": "human", "value": "one two"},
        {"from": "gpt", "value": "three four five"},
    ]},
]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", AZURE, "azure"),
        ("b.csv", BURSTGPT, "burstgpt"),
        ("m.jsonl", MOONCAKE, "mooncake"),
        ("s.jsonl", SLOBENCH, "slobench"),
        ("g.json", json.dumps(SHAREGPT, indent=1), "sharegpt"),
        ("g.jsonl", "".join(json.dumps(c) + "\n" for c in SHAREGPT), "sharegpt"),
        ("weird.txt", AZURE, "azure"),  # the content decides, not the name
    ],
)
def test_format_is_detected_from_the_content(tmp_path, name, text, fmt):
    assert detect_format(write(tmp_path, name, text)) == fmt


def test_undetectable_content_asks_for_a_format(tmp_path):
    with pytest.raises(UsageError, match="--trace-format"):
        detect_format(write(tmp_path, "x.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(UsageError, match="not found"):
        load_trace(tmp_path / "nope.csv")


def test_azure_rows_become_relative_times_and_token_counts(tmp_path):
    tr = load_trace(write(tmp_path, "a.csv", AZURE))
    assert tr.format == "azure" and tr.num_rows == 3 and not tr.problems
    # Seven fractional digits: the seventh is dropped, the rest kept exactly.
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.052, 1.02004], abs=1e-6)
    assert tr.input_tokens.tolist() == [4808, 3180, 110]
    assert tr.output_tokens.tolist() == [10, 8, 27]
    assert [e.line for e in tr.entries] == [2, 3, 4]


def test_rows_out_of_order_are_sorted_stably(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:02,1,1\n2023-01-01 00:00:01,2,2\n2023-01-01 00:00:01,3,3\n"
    tr = load_trace(write(tmp_path, "a.csv", text))
    assert tr.input_tokens.tolist() == [2, 3, 1] and tr.arrival_s.tolist() == [0, 0, 1]


def test_unreadable_rows_are_skipped_with_their_line_numbers(tmp_path):
    text = AZURE + "\n".join([
        "2023-11-16 18:17:06.0,abc,5",  # line 5
        "2023-11-16 18:17:06.5,100",  # line 6: short
        "not-a-time,100,5",  # line 7
        "2023-11-16 18:17:07.0,0,5",  # line 8: zero prompt tokens: readable, left out and counted apart
        "2023-11-16 18:17:07.5,12.5,5",  # line 9: not an integer
        "",  # blank lines are not rows
        "2023-11-16 18:17:08.0,100,-1",  # line 11
        "2023-11-16 18:17:09.0,100,7",  # line 12: fine
    ]) + "\n"
    tr = load_trace(write(tmp_path, "a.csv", text))
    assert len(tr.entries) == 4 and tr.num_rows == 10
    assert [p.line for p in tr.problems] == [5, 6, 7, 9, 11]
    whys = [p.why for p in tr.problems]
    assert "ContextTokens is not a number ('abc')" in whys[0]
    assert "2 columns" in whys[1]
    assert "GeneratedTokens is -1, must be >= 0" in whys[4]
    summary = tr.problem_summary()
    assert "skipped 5 unreadable of 10 rows" in summary and "line 5:" in summary and "malformed" not in summary
    assert tr.describe()["num_unreadable"] == 5 and tr.describe()["num_zero_dropped"] == 1


def test_a_trace_with_no_usable_row_is_a_usage_error_naming_lines(tmp_path):
    bad = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,x,1\n2023-01-01 00:00:01,1,\n"
    with pytest.raises(UsageError, match=r"no usable requests in 2 rows; 2 unreadable: line 2: .*; line 3"):
        load_trace(write(tmp_path, "a.csv", bad))
    with pytest.raises(UsageError, match="no usable requests in 0 rows"):
        load_trace(write(tmp_path, "e.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"))
    with pytest.raises(UsageError, match="no usable requests in 0 rows"):
        load_trace(write(tmp_path, "z.csv", ""), "azure")
    with pytest.raises(UsageError, match="header lacks"):
        load_trace(write(tmp_path, "h.csv", "TIMESTAMP,Tokens\n1,2\n"), "azure")


def test_burstgpt_rows_carry_the_model_as_tag_and_leave_out_failed_requests(tmp_path):
    tr = load_trace(write(tmp_path, "b.csv", BURSTGPT))
    assert tr.format == "burstgpt"
    assert tr.arrival_s.tolist() == [0.0, 41.0]
    assert [(e.input_tokens, e.output_tokens, e.tag) for e in tr.entries] == [(472, 18, "ChatGPT"), (417, 30, "GPT-4")]
    assert tr.problems == () and tr.num_zero_dropped == 1 and tr.num_rows == 3
    assert any("left out 1 of 3 rows" in n and "failed requests" in n for n in tr.notes)


def test_mooncake_fields(tmp_path):
    text = MOONCAKE + '{"timestamp": 27990, "input_length": 10, "output_length": 2}\n{"timestamp": 1, "hash_ids": [1]}\n'
    tr = load_trace(write(tmp_path, "m.jsonl", text))
    e = tr.entries[0]
    assert (e.input_tokens, e.output_tokens, e.hash_ids) == (6955, 52, (46, 47, 48, 49))
    assert tr.entries[1].arrival_s - e.arrival_s == pytest.approx(0.508)  # ms -> s, distinct stamps kept
    assert not tr.notes  # no repeated stamps: nothing spread
    assert [p.line for p in tr.problems] == [3] and "missing 'input_length'" in tr.problems[0].why


def test_slobench_jsonl_reads_prompts_tags_and_sessions(tmp_path):
    text = SLOBENCH + '{"arrival_s": 1.0, "max_tokens": 2, "prompt": "a b c d", "session_id": 3}\n'
    text += '{"arrival_s": -1, "input_tokens": 3, "max_tokens": 2}\n{"arrival_s": 2, "input_tokens": 3}\n'
    tr = load_trace(write(tmp_path, "s.jsonl", text))
    a, b = tr.entries
    assert (a.prompt, a.input_tokens, a.output_tokens, a.tag) == ((5, 6, 7), 3, 4, "x")
    assert (b.prompt, b.input_tokens, b.session_id) == ("a b c d", 4, 3)
    assert [p.line for p in tr.problems] == [3, 4]
    # The trace's own prompt goes out when it is of the kind being sent; else one of its length.
    specs = replay(tr)
    assert specs[0].prompt == (5, 6, 7) and isinstance(specs[1].prompt, tuple) and len(specs[1].prompt) == 4
    chat = replay(tr, api="chat")
    assert chat[1].prompt == "a b c d" and len(chat[0].prompt.split()) == 3


def test_sharegpt_turns_grow_and_share_their_prefix(tmp_path):
    tr = load_trace(write(tmp_path, "g.json", json.dumps(SHAREGPT)), seed=1)
    assert tr.format == "sharegpt" and len(tr.entries) == 3
    assert [p.line for p in tr.problems] == [2] and tr.problems[0].unit == "item"
    first, second = [e for e in tr.entries if e.session_id == 0]
    assert first.prompt == "hello there friend" and (first.input_tokens, first.output_tokens) == (3, 4)
    assert second.prompt.startswith(first.prompt + "\nhi how are you\n")
    assert (second.input_tokens, second.output_tokens) == (9, 1)
    assert second.arrival_s > first.arrival_s
    assert any("no timestamps" in n for n in tr.notes)
    # The chat API sends the conversation's own text ...
    chat = sorted((s for s in replay(tr, api="chat") if s.session_id == 0), key=lambda s: s.arrival_s)
    assert [s.prompt for s in chat] == [first.prompt, second.prompt]
    # ... a token-id replay sends ids of the word-count lengths, each turn extending the previous one.
    t0, t1 = sorted((s for s in replay(tr) if s.session_id == 0), key=lambda s: s.arrival_s)
    assert isinstance(t0.prompt, tuple) and (len(t0.prompt), len(t1.prompt)) == (3, 9)
    assert t1.prompt[:3] == t0.prompt


def test_convert_writes_slobench_jsonl_that_reads_back_the_same(tmp_path, capsys):
    for name, text in (("a.csv", AZURE), ("m.jsonl", MOONCAKE * 2), ("g.json", json.dumps(SHAREGPT))):
        src = write(tmp_path, name, text)
        out = tmp_path / (name + ".out.jsonl")
        assert main(["workload", "convert", str(src), "-o", str(out)]) == 0
        a, b = load_trace(src), load_trace(out)
        assert b.format == "slobench"
        assert [(e.input_tokens, e.output_tokens, e.hash_ids, e.prompt, e.session_id) for e in a.entries] == [
            (e.input_tokens, e.output_tokens, e.hash_ids, e.prompt, e.session_id) for e in b.entries
        ]
        assert np.allclose(a.arrival_s - a.arrival_s[0], b.arrival_s - b.arrival_s[0])
    assert "wrote" in capsys.readouterr().out


def test_show_prints_counts_rates_and_quantiles(tmp_path, capsys):
    assert main(["workload", "show", str(write(tmp_path, "a.csv", AZURE))]) == 0
    out = capsys.readouterr().out
    assert "azure, 3 requests" in out and "p50" in out and "mean rate" in out
    assert main(["workload", "show", "day-shift"]) == 0
    out = capsys.readouterr().out
    assert "phases: morning @ 0 s, afternoon @ 120 s" in out and "morning/doc" in out
    assert main(["workload", "show", str(write(tmp_path, "bad.csv", "x\n"))]) == 2


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
@pytest.mark.parametrize(("which", "rows"), [("code", 8819), ("conv", 19366)])
def test_the_azure_samples_load_whole(which, rows):
    tr = load_trace(TRACES / f"AzureLLMInferenceTrace_{which}.csv")
    assert len(tr.entries) == rows and not tr.problems
    assert 3400 < tr.span_s < 3600


@pytest.mark.parametrize("kind", ["gzip", "bz2", "xz", None])
def test_a_trace_read_closes_the_file_under_its_decompressor(tmp_path, kind):
    import bz2
    import gc
    import gzip
    import lzma
    import warnings

    text = "".join(json.dumps({"arrival_s": i * 0.5, "input_tokens": 10, "max_tokens": 5}) + "\n" for i in range(4))
    opener = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open, None: open}[kind]
    path = tmp_path / f"t.jsonl{'.' + kind if kind else ''}"
    with opener(path, "wt") as fh:
        fh.write(text)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert len(load_trace(path).entries) == 4
        gc.collect()
    assert not [w for w in said if issubclass(w.category, ResourceWarning)], [str(w.message) for w in said]
