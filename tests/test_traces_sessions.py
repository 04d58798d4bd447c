"""BurstGPT_3 sessions: the rows of one `Session ID` are turns of one conversation whose prompts grow
and share their history (issue 14, item 9)."""

from __future__ import annotations

from pathlib import Path

from slobench.workload.replay import replay
from slobench.workload.traces import load_trace

BURSTGPT3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
100.0,aaaa-1,3,GPT-4,100,20,120,Conversation log
101.0,api-1,1,ChatGPT,50,5,55,API log
110.0,bbbb-2,2,ChatGPT,200,40,240,Conversation log
120.0,aaaa-1,2,GPT-4,30,10,40,Conversation log
130.0,bbbb-2,4,ChatGPT,260,15,275,Conversation log
140.0,aaaa-1,2,GPT-4,25,5,30,Conversation log
"""


def trace(tmp_path: Path):
    p = tmp_path / "BurstGPT_3.csv"
    p.write_text(BURSTGPT3)
    return load_trace(p)


def test_session_ids_become_sessions(tmp_path):
    tr = trace(tmp_path)
    assert tr.format == "burstgpt"
    assert [e.session_id for e in tr.entries] == [0, 1, 2, 0, 2, 0]
    assert [e.tag for e in tr.entries] == ["GPT-4", "ChatGPT", "ChatGPT", "GPT-4", "ChatGPT", "GPT-4"]


def test_turns_carry_the_conversation_so_far(tmp_path):
    tr = trace(tmp_path)
    # aaaa-1: 100 (+20 out), then 30 new -> 100 + 20 + 30 = 150 (+10 out), then 25 new -> 150 + 10 + 25.
    # bbbb-2: 200, then 260 >= 200 already holds its history: kept as the trace says.
    assert [e.input_tokens for e in tr.entries] == [100, 50, 200, 150, 260, 185]
    assert [e.output_tokens for e in tr.entries] == [20, 5, 40, 10, 15, 5]
    assert any("2 of 3 later session turns" in n and "280 tokens added" in n for n in tr.notes)


def test_replayed_turns_share_their_history_as_a_prefix(tmp_path):
    specs = replay(trace(tmp_path), seed=4)
    a = [s.prompt for s in specs if s.session_id == 0]
    b = [s.prompt for s in specs if s.session_id == 2]
    assert [len(p) for p in a] == [100, 150, 185] and [len(p) for p in b] == [200, 260]
    assert a[1][:100] == a[0] and a[2][:150] == a[1]
    assert b[1][:200] == b[0]
    other = next(s.prompt for s in specs if s.session_id == 1)
    assert other[:20] != a[0][:20]
