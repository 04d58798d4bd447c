"""Multi-turn traces replayed in the waiting mode: a trace session's turn k+1 is sent when turn k's answer has
ended plus the trace's gap between the two turns, its sessions still arriving at the trace's times; a
BurstGPT `Session ID` and Mooncake-style `chat_id` / `parent_chat_id` make the sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.errors import SpecError
from slobench.run.records import RequestRecord
from slobench.workload.replay import TraceReplay, replay
from slobench.workload.traces import load_trace, may_hold_sessions

NUM_SESSIONS, TURNS, GAP_S = 60, 4, 0.3


def burstgpt_sessions(path: Path) -> Path:
    """NUM_SESSIONS conversations of TURNS turns, a session starting every 47 ms (no two rows on one stamp), its turns GAP_S apart: each
    turn's input the conversation so far (grown by the answer and 40 new tokens)."""
    rows = ["Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    events = []
    for s in range(NUM_SESSIONS):
        n_in = 200
        for k in range(TURNS):
            events.append((s * 0.047 + k * GAP_S, f"conv-{s}", n_in, 60))
            n_in += 60 + 40
    for t, sid, n_in, n_out in sorted(events):
        rows.append(f"{t:.3f},{sid},1,ChatGPT,{n_in},{n_out},{n_in + n_out},Conversation log")
    path.write_text("\n".join(rows) + "\n")
    return path


def records_of(run_dir: Path) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in (run_dir / "requests.jsonl").read_text().splitlines()]


def early_turns(records: list[RequestRecord], gap_s: float) -> list[tuple[int | None, int | None]]:
    """The turns sent before their previous answer had ended plus `gap_s`."""
    by_turn = {(r.session_id, r.turn): r for r in records}
    return [k for k, r in by_turn.items()
            if k[1] and r.sent_s < by_turn[(k[0], k[1] - 1)].done_s + gap_s - 1e-9]  # type: ignore[operator]


def run_trace(tmp_path: Path, name: str, trace: Path, *extra: str) -> list[RequestRecord]:
    out = tmp_path / name
    code = main(["run", "--simulate", "--trace", str(trace), "--max-num-seqs", "2", "--out", str(out),
                 "--no-progress", *extra])
    assert code == 0
    return records_of(out)


def test_a_waiting_replay_past_capacity_never_sends_a_turn_before_its_answer_ended(tmp_path: Path) -> None:
    trace = burstgpt_sessions(tmp_path / "BurstGPT_3.csv")
    records = run_trace(tmp_path, "wait", trace)  # the default for a trace with sessions
    assert len(records) == NUM_SESSIONS * TURNS and all(r.status == "ok" for r in records)
    assert {r.turn for r in records} == set(range(TURNS))
    assert early_turns(records, GAP_S) == []  # every record
    first = sorted(r.sent_s for r in records if r.turn == 0)  # sessions arrive at the trace's times
    assert first == pytest.approx([s * 0.047 for s in range(NUM_SESSIONS)], abs=1e-6)
    late = [r.sent_s - r.estimated_s for r in records if r.turn]  # type: ignore[operator]
    assert min(late) > 0 and sorted(late)[len(late) // 2] > 1.0  # past capacity: far behind the trace's times
    # at the trace's times, on the same engine, most later turns leave before their previous answer ended
    scheduled = run_trace(tmp_path, "scheduled", trace, "--session-mode", "scheduled")
    assert len(early_turns(scheduled, GAP_S)) > NUM_SESSIONS


def test_a_waiting_turn_carries_the_answer_the_server_gave(tmp_path: Path) -> None:
    specs = replay(load_trace(burstgpt_sessions(tmp_path / "BurstGPT_3.csv")), seed=3)
    turns = sorted((s for s in specs if s.session_id == 0), key=lambda s: s.turn)  # type: ignore[arg-type,return-value]
    assert [s.turn for s in turns] == list(range(TURNS))
    assert turns[0].think_s is None and all(s.think_s == pytest.approx(GAP_S) for s in turns[1:])
    assert [len(s.prompt) for s in turns] == [200, 300, 400, 500]
    assert all(b.prompt[:len(a.prompt)] == a.prompt for a, b in zip(turns, turns[1:], strict=False))  # nest
    scheduled = replay(load_trace(tmp_path / "BurstGPT_3.csv"), seed=3, session_mode="scheduled")
    assert all(s.think_s is None for s in scheduled) and {s.turn for s in scheduled} == set(range(TURNS))
    with pytest.raises(SpecError, match="session_mode"):
        TraceReplay(load_trace(tmp_path / "BurstGPT_3.csv"), session_mode="later")


def test_mooncake_style_chat_ids_link_turns_into_sessions(tmp_path: Path) -> None:
    rows = [
        {"chat_id": 10, "parent_chat_id": -1, "timestamp": 0, "input_length": 100, "output_length": 20, "hash_ids": [1]},
        {"chat_id": 11, "parent_chat_id": -1, "timestamp": 100, "input_length": 50, "output_length": 5, "hash_ids": [2]},
        {"chat_id": 12, "parent_chat_id": 10, "timestamp": 900, "input_length": 160, "output_length": 10,
         "hash_ids": [1, 3]},
        {"chat_id": 13, "parent_chat_id": 12, "timestamp": 2000, "input_length": 200, "output_length": 10,
         "hash_ids": [1, 3]},
        {"timestamp": 2100, "input_length": 30, "output_length": 5, "hash_ids": [4]},  # Mooncake's own: no session
    ]
    path = tmp_path / "qwen.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    trace = load_trace(path)
    assert trace.format == "mooncake" and may_hold_sessions(path)
    assert [e.session_id for e in trace.entries] == [0, 1, 0, 0, None]
    specs = replay(trace)
    assert [(s.session_id, s.turn) for s in specs] == [(0, 0), (1, 0), (0, 1), (0, 2), (None, None)]
    assert [s.think_s for s in specs] == [None, None, pytest.approx(0.9), pytest.approx(1.1), None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "chat_id": [1]}) + "\n" + json.dumps(rows[1]) + "\n")
    assert "chat_id must be an integer or a string" in str(load_trace(bad).problems[0])
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps(rows[-1]) + "\n")
    assert not may_hold_sessions(plain)
