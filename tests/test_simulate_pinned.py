"""Pinned virtual-clock runs: the simulator's hot path may get faster, never different.

Each digest is a SHA-256 over the JSON of every record of a fixed-seed run (times to the nanosecond, token
counts, cached tokens, replica), recorded before the hot path was optimised. A change that moves any
scheduling decision or any modeled time changes a digest.
"""

from __future__ import annotations

import hashlib

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.fleet.simulate import simulate_records
from slobench.workload import generate, load_workload

CI_PROFILE = CostProfile.load("baselines/ci-profile.json")


def digest(records: list) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(r.to_json().encode())
        h.update(b"\n")
    return h.hexdigest()


CASES = {
    # chat lengths on a small cache: chunked prefill, preemption by recompute
    "chat-preempting": (dict(workload="chat", rate=30.0, n=300, seed=7),
                        dict(engine={"profile": "h100-llama-1b", "kv_blocks": 400})),
    # the gate's engine and workload, past its cliff
    "gate-tiny": (dict(workload="tiny", rate=30.0, n=400, seed=3, input_len=32, output_len=16),
                  dict(engine={"profile": "baselines/ci-profile.json", "kv_blocks": 60})),
    # shared prefixes through the prefix cache on a routed, jittered fleet
    "prefix-fleet": (dict(workload="system-prompts", rate=12.0, n=300, seed=5),
                     dict(engine={"profile": "h100-llama-1b", "kv_blocks": 300}, replicas=2,
                          router="prefix-balanced", jitter_sd=0.02, seed=11)),
    "chat-fleet-tokens": (dict(workload="chat", rate=80.0, n=300, seed=2),
                          dict(engine={"profile": "h100-llama-1b", "kv_blocks": 2048}, replicas=3,
                               router="least-tokens")),
}


def run_case(name: str) -> list:
    load, kw = CASES[name]
    wl = load_workload(load["workload"])
    specs = generate(wl, rate_rps=load["rate"], num_requests=load["n"], seed=load["seed"],
                     input_len=load.get("input_len"), output_len=load.get("output_len"))
    kw = dict(kw)
    engine = kw.pop("engine")
    return simulate_records(specs, engine, **kw)


PINNED = {
    "chat-fleet-tokens": "0a4ce96454415bd95d0f5828c9a71c3d85a532d5b0f5060a31613cef170fb7ea",
    "chat-preempting": "6916698a3c81f0ed5bcd3221b99f30f9b5216477a39980a65e6c2b4e727516f2",
    "gate-tiny": "eca207c8a0f4d1d2b721e1513758290ebccaa9f0da80b033c1fdc9f8452a4ac0",
    "prefix-fleet": "d4b3d4dea983eed3f3b1cbf85aa5255dd594ae1edc33e96560c23baac12bde57",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_records_match_the_pinned_digest(name: str) -> None:
    assert digest(run_case(name)) == PINNED[name]


if __name__ == "__main__":  # print the digests to pin
    for n in sorted(CASES):
        print(f'    "{n}": "{digest(run_case(n))}",')
