"""The engine's step log: one JSON line per step, with what the step held and how long it took.

`python -m reference_engine.server --step-log steps.jsonl` (and `slobench serve --step-log`) writes, after a
header line, one line per executed step (`StepLog`'s doc gives its fields). These are the quantities `CostProfile.step_s` takes, so any profile can be scored against the steps a served
run actually made (`predicted_s`, `speed_ratio`), and the machine's speed during a run compared with its speed
when a profile was fitted (`machine_speed`: a model of step time fitted on the reference steps scores both on
their own compositions): on a shared machine whose speed drifts, that tells a simulator's error from the
machine's (benchmarks/validate_sim.py). Each line is written whole as the step ends (line-buffered), so a
reader sees every finished step without the server stopping; ~2 µs a step.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from reference_engine.errors import ConfigError
from reference_engine.executor.base import StepBatch
from reference_engine.executor.modeled_executor import CostProfile

log = logging.getLogger(__name__)
FIELDS = ("t", "s", "p", "d", "c", "a", "f", "n")
FORMAT = "slobench-step-log/1"


class StepLog:
    """Appends one line per step to `path` (created, or truncated, with a header line):

        {"t": 12.3456, "s": 0.0071, "p": 128, "d": 7, "c": 1534, "a": 17040, "f": 1, "n": 8}

    - `t`: when the step started, seconds on the engine's clock (the header's `origin_unix` + t is Unix time);
    - `s`: its duration, the executor's forward and sampling (what a cost profile models), in seconds;
    - `p` prompt tokens computed, `d` sequences decoding one token, `c` tokens in context (the KV attended
      over), `a` (query, key) attention pairs, `f` requests sampling their first token, `n` sequences in it.
    """

    def __init__(self, path: str | Path, *, clock_now_s: float = 0.0, header: dict[str, Any] | None = None) -> None:
        try:
            self._f: IO[str] = open(path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise ConfigError("step_log", str(path), f"cannot be written: {e.strerror}") from None
        self.path = Path(path)
        self.failed: str | None = None  # why the log stopped, if it did (the engine serves on)
        head = {"format": FORMAT, "origin_unix": time.time() - clock_now_s, **(header or {})}
        self._f.write(json.dumps(head) + "\n")

    def record(self, t0: float, t1: float, batch: StepBatch) -> None:
        if self.failed is not None:
            return
        p, d, c, a, f = batch.features()
        try:
            self._f.write(f'{{"t":{t0:.6f},"s":{t1 - t0:.6f},"p":{p},"d":{d},"c":{c},"a":{a},"f":{f},'
                          f'"n":{len(batch.chunks)}}}\n')
        except (OSError, ValueError) as e:  # a full disk must not stop the serving: the log stops, said once
            self.failed = str(e)
            log.warning("step log %s: stopped after an error (%s); the engine serves on", self.path, e)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


@dataclass(frozen=True, slots=True)
class StepRows:
    """A step log read back: its header and one dict per step (keys FIELDS)."""

    header: dict[str, Any]
    steps: list[dict[str, float]]

    def between(self, start_unix: float, end_unix: float) -> list[dict[str, float]]:
        """The steps that started in [start_unix, end_unix) (Unix seconds)."""
        origin = float(self.header.get("origin_unix", 0.0))
        return [s for s in self.steps if start_unix <= origin + s["t"] < end_unix]


def read_step_log(path: str | Path) -> StepRows:
    """Read a step log; a line cut off by a step still being written (the last one) is left out. Anything
    else malformed is an error naming the file and line."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{path}: empty, not a step log (no header line)")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}: line 1 is not a step log header (format {FORMAT!r})")
    steps = []
    for i, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break  # the step being written as we read
            raise ValueError(f"{path}: line {i} is not JSON") from None
        if not isinstance(row, dict) or any(k not in row for k in FIELDS):
            raise ValueError(f"{path}: line {i} lacks one of the fields {', '.join(FIELDS)}")
        steps.append(row)
    return StepRows(header, steps)


def predicted_s(profile: Any, steps: list[dict[str, float]]) -> float:
    """What `profile` (a CostProfile) says the given steps took in all."""
    return sum(profile.step_s(int(s["p"]), int(s["d"]), int(s["c"]), int(s["a"]), int(s["f"])) for s in steps)


def fit_steps(steps: list[dict[str, float]], name: str = "steps") -> Any:
    """A linear CostProfile (a + b·prompt tokens + c·decoding sequences + d·context) fitted by least squares
    on logged steps: the executor's own time, a reference to score other steps against (`machine_speed`)."""
    return CostProfile.fit(name, ((s["s"], int(s["p"]), int(s["d"]), int(s["c"])) for s in steps))


def machine_speed(reference: list[dict[str, float]], steps: list[dict[str, float]]) -> float | None:
    """How much slower (>1) the machine ran `steps` than `reference`: a linear model of step time fitted on
    `reference` (`fit_steps`) scores both sets on their own compositions, and the ratio of their measured over
    predicted time is the answer. None when either set is empty."""
    return speeds_across([steps], reference)[0]


def speeds_across(parts: list[list[dict[str, float]]],
                  reference: list[dict[str, float]] | None = None) -> list[float | None]:
    """Each part's machine speed against `reference` (by default all the parts' steps together: 1.2, that part
    ran 20% slower than the mean of the whole), from one step-time model fitted once on the reference; None
    for a part with no steps, or every part when the reference has under 4."""
    if reference is None:
        reference = [s for part in parts for s in part]
    if len(reference) < 4:
        return [None] * len(parts)
    model = fit_steps(reference)
    base = speed_ratio(model, reference)
    out: list[float | None] = []
    for part in parts:
        now = speed_ratio(model, part)
        out.append(None if now is None or base is None else now / base)
    return out


def speed_ratio(profile: Any, steps: list[dict[str, float]]) -> float | None:
    """Measured over predicted time of `steps` (None for no steps): above 1, the machine ran them slower
    than `profile` says."""
    if not steps:
        return None
    pred = predicted_s(profile, steps)
    return sum(s["s"] for s in steps) / pred if pred > 0 else None
