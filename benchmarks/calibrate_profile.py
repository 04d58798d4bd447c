"""Calibrate the modeled executor's cost profile from the real engine, and check how well it predicts.

Runs the real LLMEngine with the TorchExecutor over a mix of steps (prompt chunks of many sizes, decode
batches of 1 to 64, contexts up to ~1k), timing every whole `engine.step()` beside its composition, fits
`step = a + b·prefill + c·decode + d·context` (`CostProfile.fit`) and prints its error on held-out steps.
Figures: docs/measurements/calibrate_profile.md.

    python benchmarks/calibrate_profile.py                      # tiny on CPU -> prints, writes nothing
    python benchmarks/calibrate_profile.py -o reference_engine/profiles/cpu-tiny.json
    python benchmarks/calibrate_profile.py --model llama-3.2-1b --device cuda -o my-gpu.json"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.builder import build_engine
from reference_engine.config import EngineSpec
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.modeled_executor import CostProfile


class TimedComposition:
    """Wraps an executor to remember the composition of the last step it ran."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.num_blocks = inner.num_blocks
        self.vocab_size = inner.vocab_size
        self.eos_token_id = inner.eos_token_id
        self.last: tuple[int, int, int] = (0, 0, 0)

    def execute(self, batch: StepBatch) -> StepResult:
        self.last = (batch.num_prefill_tokens, batch.num_decode_seqs, batch.num_context_tokens)
        return self.inner.execute(batch)


def collect(engine: Any, timed: TimedComposition, rng: np.random.Generator, num_rounds: int) -> list[tuple]:
    """Steps of varied composition: each round adds a burst of requests of random sizes and steps it dry."""
    rows = []
    vocab = min(timed.vocab_size, 256)
    for _ in range(num_rounds):
        for _ in range(int(rng.integers(1, 65))):
            n_in = int(rng.integers(8, 768))
            engine.add_request(rng.integers(32, vocab, n_in).tolist(), int(rng.integers(4, 96)), ignore_eos=True)
        while engine.has_work():
            before = engine.num_steps
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if engine.num_steps > before:
                rows.append((dt, *timed.last))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", default=None, help="write the fitted profile here")
    ap.add_argument("--name", default=None)
    ap.add_argument("--compare", default="cpu-tiny", help="also score this existing profile on the held-out steps")
    args = ap.parse_args()

    engine, _ = build_engine(EngineSpec(executor="torch", model=args.model, device=args.device, kv_blocks=2048,
                                        max_num_seqs=64, max_batched_tokens=1024, enable_prefix_caching=False))
    timed = TimedComposition(engine.executor)
    engine.executor = timed
    rng = np.random.default_rng(args.seed)
    collect(engine, timed, rng, 1)  # warm-up: first steps pay for allocations
    rows = collect(engine, timed, rng, args.rounds)
    arr = np.asarray(rows, dtype=float)
    idx = rng.permutation(len(arr))
    train, test = arr[idx[: len(arr) * 2 // 3]], arr[idx[len(arr) * 2 // 3:]]
    name = args.name or f"{args.device}-{args.model}"
    prof = CostProfile.fit(name, [tuple(r) for r in train])
    pred = np.array([prof.step_s(int(p), int(d), int(c)) for _, p, d, c in test])
    rel = np.abs(pred - test[:, 0]) / test[:, 0]
    print(f"{len(arr)} steps timed ({args.model} on {args.device}); fitted on {len(train)}, checked on {len(test)}")
    print(f"  a (per step)           {prof.step_overhead_s * 1e3:9.4f} ms")
    print(f"  b (per prefill token)  {prof.per_prefill_token_s * 1e6:9.3f} us")
    print(f"  c (per decode seq)     {prof.per_decode_seq_s * 1e6:9.3f} us")
    print(f"  d (per context token)  {prof.per_context_token_s * 1e9:9.3f} ns")
    print(f"  held-out step time error: median {np.median(rel):.1%}, p90 {np.quantile(rel, 0.9):.1%}; "
          f"total time predicted {pred.sum() / test[:, 0].sum() - 1:+.1%}")
    if args.compare:
        old = CostProfile.load(args.compare)
        pred_old = np.array([old.step_s(int(p), int(d), int(c)) for _, p, d, c in test])
        rel_old = np.abs(pred_old - test[:, 0]) / test[:, 0]
        print(f"  profile {args.compare!r} on the same steps: median {np.median(rel_old):.1%}, "
              f"p90 {np.quantile(rel_old, 0.9):.1%}; total {pred_old.sum() / test[:, 0].sum() - 1:+.1%}")
    if args.output:
        doc = json.loads(prof.to_json())
        doc["note"] = (f"Fitted {time.strftime('%Y-%m-%d')} by benchmarks/calibrate_profile.py from {len(train)} timed "
                       f"steps of the real engine ({args.model}, {args.device}); held-out median error "
                       f"{np.median(rel):.1%}. Rerun it on your machine to recalibrate.")
        Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"written: {args.output}")


if __name__ == "__main__":
    main()
