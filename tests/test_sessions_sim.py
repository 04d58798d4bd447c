"""Sessions that wait for the server, on the virtual clock and in the plan both clocks share: a simulated run
past the engine's capacity obeys the waiting rule on every record, a turn's prompt carries the answer the
server actually gave, a failed turn ends its session, the bundled agent workload runs simulated, and what the
simulator cannot replay is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.fleet.disagg import DisaggFleet
from slobench.fleet.simulate import simulate_run
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.session_plan import SessionPlan
from slobench.workload import WorkloadSpec, generate, load_workload

THINK_S = 0.05
SESSIONS = {"turns": {"dist": "fixed", "value": 4}, "think": {"dist": "fixed", "value_s": THINK_S},
            "response_s_per_token": 0.0}
BASE = {"name": "conv", "api": "completions", "prompt": "tokens", "duration_s": 20.0,
        "arrival": {"process": "poisson", "rate_rps": 40.0},
        "input": {"dist": "fixed", "value": 200}, "output": {"dist": "fixed", "value": 100}}
ENGINE = {"max_num_seqs": 4}  # four sequences at a time: 40 sessions/s of 4 turns are far past capacity


def violations(records: list[RequestRecord], think_s: float) -> list[tuple[int, int]]:
    by_turn = {(r.session_id, r.turn): r for r in records}
    return [k for k, r in by_turn.items() if k[1] and r.sent_s < by_turn[(k[0], k[1] - 1)].done_s + think_s - 1e-9]


def test_a_simulated_run_past_capacity_waits_for_every_answer() -> None:
    specs = generate(WorkloadSpec.from_dict({**BASE, "sessions": SESSIONS}), seed=1, num_requests=400)
    records, summary = simulate_run(specs, ENGINE, seed=1, intervals=False)
    assert len(records) == 400 and all(r.status == "ok" for r in records)
    assert violations(records, THINK_S) == []  # every record
    assert summary.sessions is not None and summary.sessions["late_vs_estimate_s"]["p50"] > 1.0  # past capacity
    # the precomputed schedule, on the same engine, sends most turns before their previous answer ended
    scheduled = generate(WorkloadSpec.from_dict({**BASE, "sessions": {**SESSIONS, "mode": "scheduled"}}), seed=1,
                         num_requests=400)
    early, _ = simulate_run(scheduled, ENGINE, seed=1, intervals=False)
    assert len(violations(early, THINK_S)) > 200


def test_the_simulated_overhead_moves_the_next_turn_as_it_moves_the_answer() -> None:
    specs = generate(WorkloadSpec.from_dict({**BASE, "sessions": SESSIONS}), seed=2, num_requests=80)
    records, _ = simulate_run(specs, ENGINE, seed=2, intervals=False, request_overhead_s=0.2)
    assert violations(records, THINK_S) == []
    by_turn = {(r.session_id, r.turn): r for r in records}
    assert any(r.sent_s == pytest.approx(by_turn[(k[0], k[1] - 1)].done_s + THINK_S)
               for k, r in by_turn.items() if k[1])


def test_the_agent_workload_runs_simulated(tmp_path: Path) -> None:
    agent = load_workload("agent")
    assert agent.sessions is not None and agent.sessions.mode == "wait" and agent.system_prompts is not None
    out = tmp_path / "agent"
    code = main(["run", "--simulate", "--workload", "agent", "--duration", "60", "--rate", "1", "--out", str(out),
                 "--no-progress", "--slo", "ttft=2s", "--max-model-len", "32768"])  # the agent's context
    assert code in (0, 1)  # 1: the SLO not met
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    records = [RequestRecord.from_dict(r) for r in rows]
    think = agent.sessions.think.to_dict()["scale_s"]  # every Pareto tool time is at least its scale
    assert violations(records, think) == []
    outputs = [r.output_tokens for r in records]
    assert min(outputs) >= 20 and max(outputs) > 300 and sum(o <= 80 for o in outputs) > len(outputs) / 2
    assert all(r.prompt_tokens >= 3000 for r in records)  # the shared system prompt and tools head every turn
    s = json.loads((out / "summary.json").read_text())["sessions"]
    assert s["num_sessions"] >= 30 and s["turns"]["max"] >= 3 and "attainment" in s
    # reasoning on: 60% of each answer is reasoning, streamed first, and the answer after it
    assert all(r.status == "ok" and r.reasoning_tokens == int(0.6 * r.output_tokens) for r in records)
    assert all(r.first_reasoning_s == r.first_token_s < r.first_answer_s for r in records)  # type: ignore[operator]


@pytest.mark.parametrize("first_token_from", ["decode", "prefill"])
def test_a_prefill_decode_fleet_past_capacity_waits_for_every_answer(first_token_from: str) -> None:
    """The one fleet loop ends a turn wherever its request ends (a decode instance, or the prefill one for a
    one-token answer), so waiting sessions run on a prefill/decode fleet as on co-located replicas."""
    base = {**BASE, "output": {"dist": "uniform", "min": 1, "max": 100}}  # some answers end at their prefill
    specs = generate(WorkloadSpec.from_dict({**base, "sessions": SESSIONS}), seed=1, num_requests=300)
    fleet = DisaggFleet(prefill=1, decode=1, first_token_from=first_token_from)
    records, summary = simulate_run(specs, ENGINE, seed=1, intervals=False, disagg=fleet)
    assert len(records) == 300 and all(r.status == "ok" for r in records)
    assert any(r.output_tokens == 1 for r in records)
    assert violations(records, THINK_S) == []  # every record
    assert summary.sessions is not None and summary.sessions["late_vs_estimate_s"]["p50"] > 1.0  # past capacity


def plan_of_two_turns() -> tuple[SessionPlan, RequestSpec, RequestSpec]:
    first = RequestSpec(0, 0.0, (1, 2, 3), 3, 4, session_id=7, turn=0)
    # the generator's second turn: the first prompt, its planned answer (4 ids), the new user part (2 ids)
    second = RequestSpec(1, 0.5, (1, 2, 3, 10, 11, 12, 13, 20, 21), 9, 4, session_id=7, turn=1, think_s=0.25)
    return SessionPlan([first, second]), first, second


@pytest.mark.parametrize(("answered", "stand_in"), [(4, (10, 11, 12, 13)), (2, (10, 11)),
                                                    (6, (10, 11, 12, 13, 10, 11)), (0, ())])
def test_the_next_prompt_carries_the_answer_the_server_gave(answered: int, stand_in: tuple[int, ...]) -> None:
    plan, first, second = plan_of_two_turns()
    assert plan.first_turns([first, second]) == [first]
    rec = RequestRecord(0, 0.0, sent_s=0.0, done_s=1.0, output_tokens=answered)
    nxt = plan.next_turn(first, rec)
    assert nxt is not None
    spec, at_s = nxt
    assert at_s == 1.25 and spec.request_id == 1 and spec.arrival_s == 0.5  # the estimate stays the spec's
    assert spec.prompt == (1, 2, 3, *stand_in, 20, 21) and spec.input_tokens == len(spec.prompt)


def test_a_failed_turn_drops_the_rest_of_its_session() -> None:
    plan, first, second = plan_of_two_turns()
    third = RequestSpec(2, 0.9, (*second.prompt, 30, 31, 32, 33, 40), 14, 4, session_id=7, turn=2, think_s=0.1)
    plan = SessionPlan([first, second, third])
    failed = RequestRecord(0, 0.0, sent_s=0.0, done_s=1.0, status="timeout", error="request timed out")
    assert plan.next_turn(first, failed) is None
    assert (plan.num_failed, plan.num_unsent, plan.later) == (1, 2, {})


def test_text_sessions_carry_the_conversation_as_planned() -> None:
    """Chat text is sized to the engine's count as it arrives; the next turn extends the planned conversation
    (not the sized text), so with every answer of its asked length the prompts are the scheduled mode's."""
    text = {**BASE, "api": "chat", "prompt": "text", "duration_s": 10.0,
            "arrival": {"process": "poisson", "rate_rps": 5.0}, "input": {"dist": "fixed", "value": 30},
            "output": {"dist": "fixed", "value": 20}}
    sizes = []
    for mode in ("wait", "scheduled"):
        specs = generate(WorkloadSpec.from_dict({**text, "sessions": {**SESSIONS, "mode": mode}}), seed=0, api="chat")
        records, _ = simulate_run(specs, ENGINE, seed=0, intervals=False, api="chat")
        sizes.append(sorted((r.session_id, r.turn, r.prompt_tokens) for r in records))
    assert sizes[0] == sizes[1] and max(t for _, t, _ in sizes[0]) == 3


def test_a_prefill_decode_fleet_keeps_each_turns_session() -> None:
    """A scheduled session's turns say their session and turn on a prefill/decode fleet as on co-located
    replicas (and as live), so the summary's sessions section covers the fleet's runs too."""
    specs = generate(WorkloadSpec.from_dict({**BASE, "sessions": {**SESSIONS, "mode": "scheduled"}}), seed=1,
                     num_requests=40)
    fleet, summary = simulate_run(specs, {**ENGINE, "prefill_replicas": 1, "decode_replicas": 1}, seed=1,
                                  intervals=False)
    colocated, _ = simulate_run(specs, ENGINE, seed=1, intervals=False)
    turns = [(r.session_id, r.turn) for r in fleet]
    assert turns == [(r.session_id, r.turn) for r in colocated]
    assert all(s is not None for s, _ in turns) and {t for _, t in turns} == {0, 1, 2, 3}
    assert summary.sessions is not None
