"""Multi-turn sessions and shared system-prompt groups."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from slobench.errors import SpecError
from slobench.workload import WorkloadSpec, generate, load_workload

BASE = {
    "name": "conv",
    "duration_s": 60.0,
    "arrival": {"process": "poisson", "rate_rps": 2.0},
    "input": {"dist": "fixed", "value": 10},
    "output": {"dist": "fixed", "value": 20},
}
SESSIONS = {
    "turns": {"dist": "fixed", "value": 4},
    "think": {"dist": "fixed", "value_s": 2.0},
    "response_s_per_token": 0.01,
}


def spec(**extra) -> WorkloadSpec:
    return WorkloadSpec.from_dict({**BASE, **extra})


def by_session(reqs) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for r in reqs:
        out[r.session_id].append(r)
    return {k: sorted(v, key=lambda r: r.arrival_s) for k, v in out.items()}


def test_each_turn_resends_the_conversation_and_grows():
    reqs = generate(spec(sessions=SESSIONS, duration_s=1000.0), seed=1, num_requests=400)
    assert len(reqs) == 400 and all(r.session_id is not None for r in reqs)
    assert [r.request_id for r in reqs] == list(range(400))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    full = [turns for turns in by_session(reqs).values() if len(turns) == 4]
    assert len(full) > 50
    for turns in full:
        # previous prompt + previous answer (20) + new user tokens (10)
        assert [len(t.prompt) for t in turns] == [10, 40, 70, 100]
        assert [t.input_tokens for t in turns] == [10, 40, 70, 100]
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.prompt[: len(a.prompt)] == a.prompt
            # Scheduled from the previous turn's *scheduled* arrival: 20 tokens x 10 ms + 2 s think.
            assert b.arrival_s - a.arrival_s == pytest.approx(2.2)
    # Different conversations do not share a prefix by accident.
    firsts = [turns[0].prompt[:10] for turns in full]
    assert len(set(firsts)) == len(firsts)


def test_the_rate_counts_conversations():
    reqs = generate(spec(sessions={**SESSIONS, "mode": "scheduled"}, duration_s=200.0), seed=2)
    starts = [turns[0].arrival_s for turns in by_session(reqs).values()]
    assert len(starts) == pytest.approx(400, rel=0.12)  # 2 conversations/s x 200 s
    assert max(r.arrival_s for r in reqs) < 200.0  # turns past the duration are cut
    # waiting for the server, a session started within the run is planned whole (the runner cuts at the end)
    waiting = by_session(generate(spec(sessions=SESSIONS, duration_s=200.0), seed=2))
    assert len(waiting) == len(starts) and all(len(t) == 4 for t in waiting.values())
    assert all(t[0].think_s is None and [x.think_s for x in t[1:]] == [2.0] * 3 for t in waiting.values())


def test_max_context_ends_a_session():
    reqs = generate(spec(sessions={**SESSIONS, "max_context_tokens": 50}), seed=3)
    lengths = Counter(len(t) for t in by_session(reqs).values() if t[0].arrival_s < 50)
    assert set(lengths) == {2} and max(r.input_tokens for r in reqs) == 40


def test_random_turn_counts_and_think_times():
    sess = {"turns": {"dist": "uniform", "min": 1, "max": 6}, "think": {"dist": "exponential", "mean_s": 3.0}}
    reqs = generate(spec(sessions=sess, duration_s=2000.0), seed=4)
    sessions = by_session(reqs)
    counts = Counter(len(t) for t in sessions.values() if t[0].arrival_s < 1900)
    assert set(counts) == {1, 2, 3, 4, 5, 6}
    gaps = [b.arrival_s - a.arrival_s - 20 * 0.02 for t in sessions.values() for a, b in zip(t, t[1:], strict=False)]
    assert np.mean(gaps) == pytest.approx(3.0, rel=0.05) and min(gaps) >= 0


def test_chat_sessions_grow_as_text():
    reqs = generate(spec(sessions=SESSIONS, api="chat", prompt="text"), seed=5)
    for turns in by_session(reqs).values():
        assert all(isinstance(t.prompt, str) for t in turns)
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.prompt.startswith(a.prompt + " ")
        assert [len(t.prompt.split()) for t in turns][:2] in ([10], [10, 40])


SYSTEM = {"num_groups": 3, "tokens": [30, 20, 10], "zipf_s": 1.0}


def group_of(prompt: tuple[int, ...], prefixes: dict[int, tuple[int, ...]]) -> int:
    hits = [g for g, p in prefixes.items() if prompt[: len(p)] == p]
    assert len(hits) == 1
    return hits[0]


def test_system_prompt_groups_share_prefixes_with_zipf_popularity():
    reqs = generate(spec(system_prompts=SYSTEM, duration_s=1500.0), seed=6)
    assert len(reqs) > 2500
    # Lengths: prefix (30, 20 or 10) + user part (10).
    assert Counter(r.input_tokens for r in reqs).keys() == {40, 30, 20}
    prefixes = {n: next(r.prompt[: n - 10] for r in reqs if r.input_tokens == n) for n in (40, 30, 20)}
    for r in reqs:
        assert r.prompt[: r.input_tokens - 10] == prefixes[r.input_tokens]  # the whole group shares it
    share = Counter(group_of(r.prompt, prefixes) for r in reqs)
    h = 1 + 1 / 2 + 1 / 3
    for n, rank in ((40, 1), (30, 2), (20, 3)):
        assert share[n] / len(reqs) == pytest.approx(1 / rank / h, abs=0.03)
    # The user parts after the prefix are not shared.
    tails = {r.prompt[-10:] for r in reqs}
    assert len(tails) == len(reqs)


def test_sessions_open_with_their_group_prompt():
    reqs = generate(spec(sessions=SESSIONS, system_prompts=SYSTEM), seed=7)
    sessions = by_session(reqs)
    for turns in sessions.values():
        n = len(turns[0].prompt) - 10
        assert n in (30, 20, 10)
        assert all(t.prompt[:n] == turns[0].prompt[:n] for t in turns)
    assert len({turns[0].prompt[:10] for turns in sessions.values()}) == 3


def test_bundled_sessions_spec_reuses_most_prompt_tokens():
    reqs = generate(load_workload("sessions"), seed=0)
    sessions = by_session(reqs)
    assert len(sessions) == pytest.approx(150, rel=0.25)
    total = sum(r.input_tokens for r in reqs)
    # Tokens a prefix cache could have kept: everything a turn shares with its predecessor.
    reused = sum(len(a.prompt) for t in sessions.values() for a in t[:-1])
    assert reused / total > 0.5
    assert all(1000 <= x < 30000 for r in reqs[:50] for x in r.prompt)


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({**SESSIONS, "think": {"dist": "exponential", "value_s": 1}}, "sessions.dist"),
        ({**SESSIONS, "think": {"dist": "gauss", "mean_s": 1}}, "sessions.dist"),
        ({**SESSIONS, "thinks": 1}, "sessions.thinks"),
        ({"think": {"dist": "fixed", "value_s": 1}}, "sessions.turns"),
        ({**SESSIONS, "max_context_tokens": 0}, "sessions.max_context_tokens"),
        ({**SESSIONS, "response_s_per_token": -1}, "sessions.response_s_per_token"),
    ],
)
def test_bad_session_tables_name_the_field(table, field):
    with pytest.raises(SpecError) as info:
        spec(sessions=table)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"num_groups": 0, "tokens": 5}, "system_prompts.num_groups"),
        ({"num_groups": 2, "tokens": [5, 5, 5]}, "system_prompts.tokens"),
        ({"num_groups": 2}, "system_prompts.tokens"),
        ({"num_groups": 2, "tokens": 5, "zipf": 1}, "system_prompts.zipf"),
    ],
)
def test_bad_system_prompt_tables_name_the_field(table, field):
    with pytest.raises(SpecError) as info:
        spec(system_prompts=table)
    assert info.value.field == field
