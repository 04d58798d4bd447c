"""`workload fit` on a trace with Mooncake hash_ids: prefix reuse measured, fitted as shared-prefix groups,
generated and printed trace vs generated (issue 14, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.errors import SpecError
from slobench.run.records import RequestSpec
from slobench.workload import generate, load_workload
from slobench.workload.fit import fit_trace
from slobench.workload.prefix_fit import fit_prefix_groups, prompt_reuse, trace_reuse
from slobench.workload.sessions import SystemPrompts
from slobench.workload.traces import TraceEntry, load_trace


def mooncake_with_reuse(path: Path, n: int, *, p_followup: float, seed: int = 0, num_system: int = 30) -> Path:
    """Mooncake-format rows with chained hash ids: each request starts a conversation under one of
    `num_system` system prompts (1-3 blocks, Zipf), or with probability `p_followup` is the next turn of
    a recent conversation (its whole prompt so far + 1-3 new blocks)."""
    rng = np.random.default_rng(seed)
    next_id = 10_000
    system = []
    for g in range(num_system):
        system.append(list(range(next_id, next_id + 1 + g % 3)))
        next_id += 1 + g % 3
    pop = 1.0 / np.arange(1, num_system + 1) ** 1.1
    convs: list[list[int]] = []
    with open(path, "w") as fh:
        for i in range(n):
            if convs and rng.random() < p_followup:
                c = int(rng.integers(max(0, len(convs) - 50), len(convs)))
                k = int(rng.integers(1, 4))
                ids = convs[c] + list(range(next_id, next_id + k))
                convs[c] = ids
            else:
                k = int(rng.integers(2, 9))
                ids = system[int(rng.choice(num_system, p=pop / pop.sum()))] + list(range(next_id, next_id + k))
                convs.append(ids)
            next_id += k
            fh.write(json.dumps({"timestamp": i * 300 + int(rng.integers(0, 300)),
                                 "input_length": len(ids) * 512 - int(rng.integers(0, 400)),
                                 "output_length": int(rng.integers(20, 400)), "hash_ids": ids}) + "\n")
    return path


def entry(ids: list[int], n_in: int) -> TraceEntry:
    return TraceEntry(0.0, n_in, 10, 1, tuple(ids))


def test_trace_reuse_counts_the_leading_blocks_seen_before():
    entries = [entry([1, 2, 3], 1500),  # nothing seen: 0
               entry([1, 2, 4], 1400),  # 1, 2 seen: 1024
               entry([5, 2], 700),  # 5 is new: the 2 after it does not count (not a prefix)
               entry([1, 2, 3, 6], 1200)]  # 1, 2, 3 seen, but only 1200 tokens: 1200
    r = trace_reuse(entries, 512)
    assert (r.reused_tokens, r.prompt_tokens, r.num_requests_reusing) == (1024 + 1200, 4800, 2)
    assert r.share == pytest.approx(2224 / 4800)


def test_prompt_reuse_hashes_whole_blocks_in_a_chain():
    a = tuple(range(1000))
    specs = [RequestSpec(0, 0.0, a, 1000, 1),
             RequestSpec(1, 0.0, a[:600] + tuple(range(5000, 5400)), 1000, 1),  # block 0 shared, block 1 not
             RequestSpec(2, 0.0, tuple(range(7000, 7512)) + a[512:1000], 1000, 1)]  # block 1 equal, block 0 not
    r = prompt_reuse(specs, 512)
    assert (r.reused_tokens, r.prompt_tokens, r.num_requests_reusing) == (512, 3000, 1)


@pytest.mark.parametrize("p_followup", [0.15, 0.55])
def test_fit_keeps_the_traces_prefix_reuse_share(tmp_path, p_followup):
    trace = load_trace(mooncake_with_reuse(tmp_path / "m.jsonl", 1500, p_followup=p_followup))
    fit = fit_trace(trace, seed=1)
    assert fit.prefix is not None
    trace_share = fit.prefix.trace.share
    assert 0.3 < trace_share < 0.75  # the two kinds of trace: about 37% and 65% reused
    spec = fit.spec()
    assert spec.system_prompts is not None and spec.system_prompts.num_groups == 30
    generated = generate(spec, seed=3)
    got = prompt_reuse(generated, trace.block_tokens).share
    assert abs(got - trace_share) < 0.05, (got, trace_share)
    # without the groups the generated prompts share nothing (a 1-token prompt may repeat by chance)
    from dataclasses import replace
    assert prompt_reuse(generate(replace(spec, system_prompts=None), seed=3), 512).share < 0.001
    # and the prompts stay as long as the trace's
    g_in = np.array([len(s.prompt) for s in generated])
    assert np.median(g_in) == pytest.approx(np.median(trace.input_tokens), rel=0.1)
    lines = "\n".join(fit.comparison)
    assert "prefix reuse share" in lines and f"{trace_share:.1%}" in lines


def test_prefix_groups_are_whole_blocks_weighted_by_requests(tmp_path):
    entries = [entry([1, 10], 1000), entry([1, 11], 900), entry([1, 12], 800),  # group 1: reuse 512, 512
               entry([2, 20, 21], 1500), entry([2, 20, 22], 1400),  # group 2: reuse 1024
               entry([3], 300)]  # alone: no group
    pf = fit_prefix_groups(entries, 512)
    assert pf is not None
    assert pf.prompts.lengths() == [512, 1024] and pf.prompts.weights == (3.0, 2.0)
    assert pf.prompts.share == pytest.approx(5 / 6)
    assert pf.own_tokens.tolist() == [488, 388, 288, 476, 376, 300]
    assert fit_prefix_groups([entry([1], 10), entry([2], 10)], 512) is None  # nothing reused


def test_written_spec_round_trips_with_weights_and_share(tmp_path, capsys):
    path = mooncake_with_reuse(tmp_path / "m.jsonl", 600, p_followup=0.3)
    out = tmp_path / "fit.toml"
    assert main(["workload", "fit", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prefix reuse: " in printed and "prefix reuse share" in printed
    spec = load_workload(str(out))
    assert spec.system_prompts is not None and len(spec.system_prompts.weights) == spec.system_prompts.num_groups
    assert abs(len(generate(spec, seed=0)) - 600) < 30  # a Poisson count over the trace's span


def test_system_prompts_share_and_weights_are_validated():
    with pytest.raises(SpecError, match="weights"):
        SystemPrompts(2, (10,), weights=(1.0,))
    with pytest.raises(SpecError, match="share"):
        SystemPrompts(2, (10,), share=0.0)
    with pytest.raises(SpecError, match="weights"):
        SystemPrompts.from_dict({"num_groups": 2, "tokens": 10, "weights": "heavy"})
    sp = SystemPrompts(2, (10,), weights=(3.0, 1.0), share=0.5)
    assert sp.popularity().tolist() == [0.75, 0.25]
    assert SystemPrompts.from_dict(sp.to_dict()) == sp


def test_a_trace_without_hash_ids_fits_no_prefix(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{i:02d}.0000000,{100 + i},{10 + i}\n" for i in range(30)))
    fit = fit_trace(load_trace(p))
    assert fit.prefix is None and fit.spec().system_prompts is None
    assert not any("prefix" in line for line in fit.comparison)
