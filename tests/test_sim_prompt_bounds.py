"""A simulated run bounds and sizes its requests by the engine's context and count, as a live run does.

A live run cuts a request whose prompt + output pass the server's `max_model_len` before sending it
(`ServerLimits.bound`) and sends text prompts as the words the server counts as the asked length; the
simulator used to hand such requests to its engine whole, which refused them as too long (~1.5% of the chat
workload at a 4096 context), and to send chat text word for word to a byte tokenizer (~5 tokens a word).
"""

from __future__ import annotations

import statistics
from dataclasses import astuple

from slobench.fleet.simulate import simulate_records, simulate_run
from slobench.workload import load_workload
from slobench.workload.base import RunShape
from slobench.workload.limits import BoundedSpecs, ServerLimits

CHAT = load_workload("chat")
KNOBS = {"profile": "h100-llama-1b", "kv_blocks": 4096, "max_num_seqs": 32, "max_model_len": 1024}


def shape(n: int, **kw: object) -> RunShape:
    return RunShape(rate_rps=kw.pop("rate_rps", 20.0), num_requests=n, seed=5, **kw)  # type: ignore[arg-type]


def test_token_prompts_past_the_context_are_cut_as_a_live_run_cuts_them_and_said() -> None:
    specs = CHAT.specs(shape(200))
    live = BoundedSpecs(specs, ServerLimits(max_model_len=1024))  # the live run's rule, token-id prompts
    assert live.num_shortened > 20
    records, summary = simulate_run(specs, KNOBS, intervals=False)
    assert summary.num_ok == 200 and not summary.error_counts, summary.error_counts
    assert [(r.input_tokens, r.max_tokens) for r in records] == [(s.input_tokens, s.max_tokens) for s in live.specs]
    assert summary.notes == (f"{live.num_shortened} requests shortened to fit the server's max_model_len 1024 "
                             "(prompt + max_tokens; the prompt's end cut first, down to half of it, then the output)",)


def test_chat_text_is_counted_as_asked_and_held_within_the_context() -> None:
    records, summary = simulate_run(CHAT.specs(shape(120, api="chat")), KNOBS, api="chat", intervals=False)
    assert summary.num_ok == 120 and not summary.error_counts, summary.error_counts
    errors = [r.prompt_tokens / r.input_tokens - 1 for r in records]
    assert abs(statistics.median(errors)) <= 0.03, sorted(errors)
    assert all(r.prompt_tokens + r.max_tokens <= 1024 for r in records)
    assert summary.notes and "shortened to fit the server's max_model_len 1024" in summary.notes[0]


def test_a_shortened_stand_in_prompt_is_drawn_at_its_cut_length_when_preempted() -> None:
    # a small cache preempts requests whose prompts came as stand-ins, some of them shortened
    knobs = {**KNOBS, "kv_blocks": 300}
    listed = simulate_records(CHAT.specs(shape(150, rate_rps=60.0)), knobs)
    streamed: list = []  # type: ignore[type-arg]
    simulate_records(CHAT.stream_specs(shape(150, rate_rps=60.0)), knobs, on_record=streamed.append)
    assert [astuple(r) for r in streamed] == [astuple(r) for r in listed]
    assert all(r.status == "ok" for r in listed) and any(r.input_tokens + r.max_tokens == 1024 for r in listed)


def test_a_prefill_decode_fleet_bounds_its_requests_too() -> None:
    specs = CHAT.specs(shape(100))
    live = BoundedSpecs(specs, ServerLimits(max_model_len=1024))
    records, summary = simulate_run(specs, {**KNOBS, "prefill_replicas": 1, "decode_replicas": 1}, intervals=False)
    assert summary.num_ok == 100 and not summary.error_counts, summary.error_counts
    assert sorted((r.input_tokens, r.max_tokens) for r in records) == sorted(
        (s.input_tokens, s.max_tokens) for s in live.specs)
    assert summary.notes and summary.notes[0].startswith(f"{live.num_shortened} requests shortened")
