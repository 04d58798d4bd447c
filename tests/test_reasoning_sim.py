"""Reasoning in a workload (`[reasoning] share`) and on the virtual clock: `--simulate --api responses` runs,
and its records split reasoning from answer as a live run against the token server's reasoning mode does;
the completions API, live or simulated, has no reasoning channel; a session's next turn resends the answer,
not the reasoning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.errors import SpecError
from slobench.fleet.simulate import simulate_run
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.session_plan import SessionPlan
from slobench.workload import WorkloadSpec, generate

SHARE = 0.5
WORKLOAD = ('name = "think"\napi = "chat"\nprompt = "text"\n[arrival]\nprocess = "poisson"\nrate_rps = 20\n'
            '[input]\ndist = "fixed"\nvalue = 30\n[output]\ndist = "uniform"\nmin = 4\nmax = 24\n'
            f"[reasoning]\nshare = {SHARE}\n")


def run_records(tmp_path: Path, name: str, *where: str, api: str = "responses") -> tuple[list[RequestRecord], dict]:
    path = tmp_path / "think.toml"
    path.write_text(WORKLOAD)
    out = tmp_path / name
    code = main(["run", *where, "--api", api, "--workload", str(path), "--num-requests", "24", "--rate", "20",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    rows = [RequestRecord.from_dict(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: r.request_id), json.loads((out / "summary.json").read_text())


def split(records: list[RequestRecord]) -> list[tuple[object, ...]]:
    return [(r.request_id, r.output_tokens, r.reasoning_tokens, r.reasoning_tokens_source, r.first_answer_s is None)
            for r in records]


def test_a_simulated_responses_run_splits_reasoning_as_the_live_server_does(tmp_path: Path,
                                                                               token_server_url: str) -> None:
    simulated, sim_summary = run_records(tmp_path, "sim", "--simulate")
    live, live_summary = run_records(tmp_path, "live", "--url", token_server_url, "--scrape-interval", "0")
    assert all(r.status == "ok" for r in simulated + live)
    assert split(simulated) == split(live)
    assert all(r.reasoning_tokens == int(SHARE * r.output_tokens) and r.first_answer_s is not None for r in live)
    for r in simulated:  # one token a chunk: the answer's first token is chunk k + 1
        assert r.first_reasoning_s == r.first_token_s and r.first_answer_s == pytest.approx(r.chunk_times_s[r.reasoning_tokens], abs=1e-9)
    assert sim_summary["reasoning"] == live_summary["reasoning"]
    assert sim_summary["ttfa_s"]["p50"] > sim_summary["ttft_s"]["p50"]
    # the completions API has no reasoning channel, live (the token server streams none) or simulated
    specs = generate(WorkloadSpec.from_dict({"name": "c", "input": {"dist": "fixed", "value": 8},
                                             "output": {"dist": "fixed", "value": 10}, "reasoning": {"share": SHARE}}),
                     seed=0, num_requests=5)
    records, summary = simulate_run(specs, {}, seed=0, intervals=False)
    assert all(r.reasoning_tokens is None and r.first_answer_s is None for r in records) and summary.ttfa is None


def test_the_next_turn_resends_the_answer_without_its_reasoning() -> None:
    body = (("x_reasoning_tokens", 3),)
    first = RequestSpec(0, 0.0, (1, 2, 3), 3, 5, session_id=7, turn=0, extra_body=body)
    # the generator's second turn: the first prompt, its planned answer (5 - 3 = 2 ids), the new user part
    second = RequestSpec(1, 0.5, (1, 2, 3, 10, 11, 20, 21), 7, 5, session_id=7, turn=1, think_s=0.25, extra_body=body)
    plan = SessionPlan([first, second])
    rec = RequestRecord(0, 0.0, sent_s=0.0, done_s=1.0, output_tokens=5, reasoning_tokens=3)
    nxt = plan.next_turn(first, rec)
    assert nxt is not None and nxt[0].prompt == second.prompt  # the planned answer: resent as planned
    spec = WorkloadSpec.from_dict({"name": "s", "input": {"dist": "fixed", "value": 10},
                                   "output": {"dist": "fixed", "value": 20}, "reasoning": {"share": 0.6},
                                   "sessions": {"turns": {"dist": "fixed", "value": 3}}})
    turns = sorted(generate(spec, seed=1, num_requests=30), key=lambda s: (s.session_id, s.turn))
    assert all(s.extra_body == (("x_reasoning_tokens", 12),) for s in turns)
    by_turn = {(s.session_id, s.turn): s for s in turns}
    assert all(s.input_tokens == by_turn[(s.session_id, s.turn - 1)].input_tokens + 8 + 10  # answer 20 - 12
               for s in turns if s.turn)
    with pytest.raises(SpecError, match="reasoning share"):
        WorkloadSpec.from_dict({"name": "s", "input": {"dist": "fixed", "value": 10},
                                "output": {"dist": "fixed", "value": 20}, "reasoning": {"share": 1.0}})
    assert WorkloadSpec.from_dict(spec.to_dict()) == spec
