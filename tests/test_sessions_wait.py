"""Sessions that wait for the server, live: against the token server, whose answers take far longer than the
workload's estimate (the precomputed schedule would send turn k+1 long before turn k's answer ended), no turn
leaves before its previous answer ended plus the think time; a failed turn ends its session, the run goes on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.testing import TokenServerProcess
from slobench.workload import WorkloadSpec, generate

THINK_S = 0.01
WORKLOAD = {
    "name": "conv", "api": "completions", "prompt": "tokens", "duration_s": 30.0,
    "arrival": {"process": "poisson", "rate_rps": 20.0},
    "input": {"dist": "fixed", "value": 10},
    "output": {"dist": "fixed", "value": 20},
    # estimated answer time 0: the schedule would send each next turn 10 ms after the previous one left,
    # while the token server (TTFT 50 ms, 5 ms a token) answers in ~150 ms
    "sessions": {"turns": {"dist": "fixed", "value": 3}, "think": {"dist": "fixed", "value_s": THINK_S},
                 "response_s_per_token": 0.0},
}


def write_workload(tmp_path: Path, mode: str) -> Path:
    lines = ['name = "conv"\napi = "completions"\nprompt = "tokens"\nduration_s = 30\n',
             "[arrival]\nprocess = \"poisson\"\nrate_rps = 20\n", "[input]\ndist = \"fixed\"\nvalue = 10\n",
             "[output]\ndist = \"fixed\"\nvalue = 20\n",
             f'[sessions]\nturns = {{dist = "fixed", value = 3}}\nthink = {{dist = "fixed", value_s = {THINK_S}}}\n'
             f'response_s_per_token = 0.0\nmode = "{mode}"\n']
    path = tmp_path / f"conv-{mode}.toml"
    path.write_text("\n".join(lines))
    return path


def records_by_turn(run_dir: Path) -> dict[tuple[int, int], dict]:
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    return {(r["session_id"], r["turn"]): r for r in rows}


def early_turns(by_turn: dict[tuple[int, int], dict]) -> list[tuple[int, int]]:
    """The turns sent before their previous turn's answer ended plus the think time."""
    return [k for k, r in by_turn.items() if k[1] > 0
            and r["sent_s"] < by_turn[(k[0], k[1] - 1)]["done_s"] + THINK_S]


def test_no_turn_leaves_before_its_previous_answer_ended(tmp_path: Path, token_server_url: str) -> None:
    out = tmp_path / "wait"
    code = main(["run", "--url", token_server_url, "--workload", str(write_workload(tmp_path, "wait")),
                 "--num-requests", "60", "--out", str(out), "--no-progress", "--scrape-interval", "0",
                 "--slo", "ttft=1s"])
    assert code == 0
    by_turn = records_by_turn(out)
    assert len(by_turn) == 60 and all(r["status"] == "ok" for r in by_turn.values())
    assert early_turns(by_turn) == []  # every record: sent_s of turn k+1 >= done_s of turn k + think time
    for (sid, turn), r in by_turn.items():
        if turn == 0:
            assert "estimated_s" not in r
            continue
        prev = by_turn[(sid, turn - 1)]
        assert r["scheduled_s"] == prev["done_s"] + THINK_S
        assert r["sent_s"] - r["estimated_s"] > 0.1  # the estimate (10 ms after the previous send) was early
        # the conversation so far, the answer the server gave (its count), the new user part
        assert r["prompt_tokens"] == prev["prompt_tokens"] + prev["output_tokens"] + 10
    summary = json.loads((out / "summary.json").read_text())
    s = summary["sessions"]
    assert (s["num_sessions"], s["num_failed"], s["turns"]["max"]) == (20, 0, 3)
    assert s["attainment"]["value"] == 1.0 and s["attainment"]["ci_low"] < 1.0
    assert s["late_vs_estimate_s"]["num"] == 40 and s["late_vs_estimate_s"]["p50"] > 0.1
    assert s["duration_s"]["p50"] > 3 * 0.15  # three answers of ~150 ms, one after another


def test_the_scheduled_mode_sends_turns_before_the_answers_ended(tmp_path: Path, token_server_url: str) -> None:
    out = tmp_path / "scheduled"
    code = main(["run", "--url", token_server_url, "--workload", str(write_workload(tmp_path, "wait")),
                 "--session-mode", "scheduled", "--num-requests", "30", "--out", str(out), "--no-progress",
                 "--scrape-interval", "0"])
    assert code == 0
    by_turn = records_by_turn(out)
    assert len(early_turns(by_turn)) == len([k for k in by_turn if k[1] > 0])  # what the waiting mode prevents


async def test_a_failed_turn_ends_its_session_and_the_run_goes_on(token_server: TokenServerProcess) -> None:
    specs = generate(WorkloadSpec.from_dict(WORKLOAD), seed=3, num_requests=30)
    fault = (("x_fault", "status_500"),)
    doomed = next(sp.session_id for sp in specs if sp.turn == 1)
    specs = [replace(sp, extra_body=fault) if (sp.session_id, sp.turn) == (doomed, 1) else sp for sp in specs]
    planned = [sp for sp in specs if sp.session_id == doomed]
    assert [sp.turn for sp in planned] == [0, 1, 2]
    async with OpenAITarget(token_server.base_url, TargetOptions(model=token_server.model)) as target:
        res = await run(specs, target, opts=RunOptions(progress=False), handle_sigint=False)
    mine = sorted((r for r in res.records if r.session_id == doomed), key=lambda r: r.turn or 0)
    assert [(r.turn, r.status) for r in mine] == [(0, "ok"), (1, "error")]  # turn 2 never sent
    others = [r for r in res.records if r.session_id != doomed]
    assert len(others) == len(specs) - 3 and all(r.status == "ok" for r in others)
    assert res.summary.sessions is not None and res.summary.sessions["num_failed"] == 1
    assert res.summary.sessions["num_sessions"] == len({sp.session_id for sp in specs})


def test_a_turn_spec_must_be_a_later_turn_to_wait() -> None:
    with pytest.raises(ValueError, match="think_s needs a session's later turn"):
        RequestSpec(0, 0.0, (1, 2), 2, 4, session_id=1, turn=0, think_s=1.0)
