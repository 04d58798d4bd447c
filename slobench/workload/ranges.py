"""What one run may ask for, wherever the value comes from: a flag, a workload TOML or the Python API.

Past these the schedule or the prompts would not fit in memory (a typo such as `num_requests = 1e12`, or a
duration of 1e300 s), or the arithmetic that draws them would overflow; the run would end in a MemoryError
or a traceback, not an answer. The typed values (`RunShape`, `WorkloadSpec`, the length distributions and
arrival processes) check against these in their `__post_init__`, so every entry point meets one check.
"""

from __future__ import annotations

import math
import numbers

from slobench.errors import SpecError

MAX_NUM_REQUESTS = 10_000_000
MAX_TOKENS = 10_000_000  # a prompt's or an output's length, tokens
MAX_DURATION_S = 7 * 86_400.0  # a week
MIN_RATE_RPS = 1 / 86_400  # one request a day: anything slower is a typo, and would wait for ever
MAX_TOKEN_ID = (1 << 31) - 1  # token ids are drawn as int32; no vocabulary comes near this
MAX_USERS = 100_000  # --concurrency, --max-in-flight


def is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))  # type: ignore[arg-type]


def check_count(field: str, value: object, limit: int, *, low: int = 1) -> None:
    """An integer from `low` to `limit`, or a SpecError naming the field, the value and the range."""
    if not is_int(value) or not low <= value <= limit:  # type: ignore[operator]
        raise SpecError(field, value, f"must be an integer from {low} to {limit:,}")


def check_duration_s(field: str, value: object) -> None:
    if not is_real(value) or not 0 < value <= MAX_DURATION_S:  # type: ignore[operator]
        raise SpecError(field, value, f"must be a number of seconds above 0 and at most {MAX_DURATION_S:,.0f} (a week)")


def check_rate_rps(field: str, value: object) -> None:
    if not is_real(value) or not value > 0:  # type: ignore[operator]
        raise SpecError(field, value, "must be a finite number > 0")
    if value < MIN_RATE_RPS:  # type: ignore[operator]
        raise SpecError(field, value, f"below {MIN_RATE_RPS:g} req/s, one request a day; the run would wait for ever")


def check_requests_in(rate_rps: float | None, duration_s: float | None) -> None:
    """A duration-bounded run at `rate_rps` would hold about rate·duration requests: at most MAX_NUM_REQUESTS."""
    if rate_rps is not None and duration_s is not None and rate_rps * duration_s > MAX_NUM_REQUESTS:
        raise SpecError("duration_s", duration_s, f"at {rate_rps:g} req/s that is {rate_rps * duration_s:,.0f} "
                        f"requests, more than {MAX_NUM_REQUESTS:,} a run")
