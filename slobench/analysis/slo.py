"""SLO specs, attainment, good throughput, and confidence intervals.

Attainment = requests meeting *every* SLO at once / *all* measured requests issued (failures are misses).
Latencies are taken from the *scheduled* arrival by default, so a client that fell behind (or a request
held by an in-flight cap) cannot hide queueing; `clock="sent"` gives the classic definition from the send.
Each interval is the envelope of a moving-block bootstrap over requests in arrival order (requests near
saturation are not independent) and an exact small-sample interval where the bootstrap is blind (every
request met the SLO; a p99 from a few hundred requests). Replicate runs (different seeds) remain the
honest unit for decisions; see slobench.gate.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from slobench.analysis.metrics import RecordArrays, finite_values
from slobench.errors import SpecError

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DUR_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us)?\s*$")
_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def parse_duration_s(text: str, field: str, *, allow_zero: bool = False) -> float:
    """'500ms' -> 0.5; '2s' -> 2.0; a bare number is seconds. 0 only with `allow_zero`."""
    m = _DUR_RE.match(str(text))
    if not m:
        raise SpecError(field, text, "expected a duration like 500ms, 0.5s or 0.5")
    v = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if v < 0 or (v == 0 and not allow_zero):
        raise SpecError(field, text, "must be >= 0" if allow_zero else "must be positive")
    return v


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    target: float = 0.9  # attainment target used for headlines, capacity and knees
    clock: Literal["scheduled", "sent"] = "scheduled"

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and np.isfinite(v)):
                raise SpecError(f"slo.{name[:-2]}", v, "must be a positive duration")
        if not 0 < self.target <= 1:
            raise SpecError("slo.target", self.target, "must be in (0, 1]")
        if self.clock not in ("scheduled", "sent"):
            raise SpecError("slo.clock", self.clock, "must be 'scheduled' or 'sent'")
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise SpecError("slo", "", "give at least one of ttft, tpot, e2e")

    @classmethod
    def parse(cls, text: str) -> SLO:
        """Parse `ttft=500ms,tpot=50ms[,e2e=10s][,target=0.9][,clock=sent]`."""
        kw: dict[str, Any] = {}
        seen: set[str] = set()
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise SpecError("slo", part, "expected key=value (e.g. ttft=500ms,tpot=50ms)")
            key, val = (s.strip() for s in part.split("=", 1))
            if key in seen:
                raise SpecError("slo", key, "given twice; give each of ttft, tpot, e2e, target, clock once")
            seen.add(key)
            if key in _KEYS:
                kw[_KEYS[key]] = parse_duration_s(val, f"slo.{key}")
            elif key == "target":
                kw["target"] = parse_fraction(val)
            elif key == "clock":
                kw["clock"] = val
            else:
                raise SpecError("slo", key, "unknown key; use ttft, tpot, e2e, target or clock")
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SLO:
        kw: dict[str, Any] = {}
        for key, val in d.items():
            if val is None:
                continue
            if key in _KEYS or key in _KEYS.values():
                name = _KEYS.get(key, key)
                if isinstance(val, str):
                    kw[name] = parse_duration_s(val, f"slo.{key}")
                elif isinstance(val, int | float) and not isinstance(val, bool):
                    kw[name] = float(val)
                else:  # a list, a table, true: TOML parses them, an SLO cannot use them
                    raise SpecError(f"slo.{key}", val, "must be a duration such as 500ms or a number of seconds")
            elif key == "target":
                kw["target"] = parse_fraction(val)
            elif key == "clock":
                kw["clock"] = val
            else:
                raise SpecError(f"slo.{key}", val, "unknown key; use ttft, tpot, e2e, target or clock")
        return cls(**kw)

    @classmethod
    def from_toml(cls, path: str | Path) -> SLO:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise SpecError("slo", str(path), "not a text file (not UTF-8): not an SLO TOML") from None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SpecError("slo", str(path), f"cannot read SLO file: {e}") from None
        slo = data.get("slo", data)
        if not isinstance(slo, dict):
            raise SpecError("slo", str(path), "[slo] must be a table of ttft, tpot, e2e, target, clock")
        return cls.from_dict(slo)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        parts = [f"{k}<={_fmt(getattr(self, v))}" for k, v in _KEYS.items() if getattr(self, v) is not None]
        return " & ".join(parts) + f" @ {self.target:.0%}"

    def meets(self, a: RecordArrays) -> np.ndarray:
        """Boolean per measured request: met every SLO. Failures and missing times are misses."""
        sched = self.clock == "scheduled"
        ok = a.is_ok.copy()
        if self.ttft_s is not None:
            ttft = a.ttft_from_scheduled_s if sched else a.ttft_s
            ok &= np.nan_to_num(ttft, nan=np.inf) <= self.ttft_s
        if self.tpot_s is not None:
            ok &= np.nan_to_num(a.tpot_s, nan=np.inf) <= self.tpot_s
        if self.e2e_s is not None:
            e2e = a.e2e_from_scheduled_s if sched else a.e2e_s
            ok &= np.nan_to_num(e2e, nan=np.inf) <= self.e2e_s
        return ok


def load_slo(text: str | None) -> SLO | None:
    """An SLO as given on the command line: a TOML file's path, or `ttft=500ms,...` (`SLO.parse`)."""
    if text is None:
        return None
    if text.endswith(".toml") or Path(text).is_file():
        return SLO.from_toml(text)
    return SLO.parse(text)


def parse_fraction(val: Any, field: str = "slo.target", example: str = "0.9 or 90%") -> float:
    """'90%' -> 0.9; '0.9' -> 0.9. A bad value is a SpecError naming `field`."""
    s = str(val).strip()
    try:
        return float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise SpecError(field, val, f"expected a fraction like {example}") from None


def _fmt(v: float) -> str:
    return f"{v * 1e3:g}ms" if v < 1 else f"{v:g}s"


# --- intervals -------------------------------------------------------------------------------------
# Requests in one run are correlated near saturation (NOTES-statistics: variance inflated 3-50x), hence
# blocks, not an i.i.d. resample. The exact partners: Wilson's interval for attainment (every resample of a
# run where all requests met the SLO says 100%), and the distribution-free order-statistic interval for
# quantiles (as asv's `quantile_ci`), whose upper end is None where the sample cannot bound it (a p99 from
# 100 requests).


def block_length(n: int) -> int:
    """Block length for the moving-block bootstrap: long against a busy period, yet >= ~10 blocks."""
    return int(max(1, min(250, n // 10)))


def block_starts(n: int, num_resamples: int, rng: np.random.Generator, length: int | None = None) -> np.ndarray:
    """Each resample's block starts, (num_resamples, blocks): enough blocks of `block_length(n)` values
    drawn from x's n to make `length` values (default n), the last block cut short."""
    b = block_length(n)
    return rng.integers(0, n - b + 1, size=(num_resamples, -(-(length or n) // b)))


def bootstrap_mean_ci(x: np.ndarray, *, level: float = 0.95, num_resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile moving-block bootstrap interval for the mean of x (x in arrival order).

    Each resample's sum is taken through a prefix sum over its blocks, so the cost is
    O(resamples x blocks), not O(resamples x n): 100,000 requests would otherwise need ~1.6 GB.
    """
    n = len(x)
    if n == 0:
        return (float("nan"), float("nan"))
    b = block_length(n)
    starts = block_starts(n, num_resamples, np.random.default_rng(seed))
    num_blocks = starts.shape[1]
    cs = np.concatenate([[0.0], np.cumsum(x, dtype=float)])
    last = n - (num_blocks - 1) * b  # the final block is cut to make exactly n values
    full = (cs[starts[:, :-1] + b] - cs[starts[:, :-1]]).sum(axis=1)
    means = (full + cs[starts[:, -1] + last] - cs[starts[:, -1]]) / n
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


# Up to this many values a quantile's bootstrap resamples the whole run (1,000 resamples: 20M values drawn);
# beyond it each resample draws this many values in the run's blocks and the spread is scaled by
# sqrt(m / n) (the m-out-of-n bootstrap, consistent for quantiles), so a million requests cost what 20,000 do.
FULL_RESAMPLE_MAX = 20_000


def bootstrap_quantile_ci(
    x: np.ndarray, q: float, *, level: float = 0.95, num_resamples: int | None = None, seed: int = 0
) -> tuple[float | None, float | None]:
    """Percentile moving-block bootstrap interval for the q-quantile of x (NaNs dropped first)."""
    return bootstrap_quantile_cis(x, (q,), level=level, num_resamples=num_resamples, seed=seed)[0]


RESAMPLE_CHUNK_VALUES = 2_000_000  # resampled values held at once (16 MB)


def bootstrap_quantile_cis(
    x: np.ndarray, qs: Sequence[float], *, level: float = 0.95, num_resamples: int | None = None, seed: int = 0
) -> list[tuple[float | None, float | None]]:
    """`bootstrap_quantile_ci` of each of `qs` over one set of resamples of x (NaNs dropped): the same numbers
    as one call per quantile with the same seed, for the cost of one. The resamples are taken a chunk at a
    time (bounded memory); past FULL_RESAMPLE_MAX values, 1,000 m-out-of-n resamples of m = FULL_RESAMPLE_MAX
    values, their spread scaled by sqrt(m / n), so a million values cost what 20,000 do."""
    x = finite_values(x)
    n = len(x)
    if n < 2:
        return [(None, None)] * len(qs)
    full = n <= FULL_RESAMPLE_MAX or num_resamples is not None
    b = (num_resamples or int(max(100, min(1000, 20_000_000 // n)))) if full else 1000
    m = n if full else FULL_RESAMPLE_MAX
    starts = block_starts(n, b, np.random.default_rng(seed), m)
    rows = min(b, max(1, RESAMPLE_CHUNK_VALUES // m))
    # every block x could give, as a view (no copy): a resample is the blocks at its starts, copied whole
    blocks = np.lib.stride_tricks.sliding_window_view(x, block_length(n))
    chunks = []
    for k in range(0, b, rows):
        part = starts[k : k + rows]
        values = blocks[part].reshape(len(part), -1)[:, :m]  # each block copied whole, not value by value
        # (quantile, resample); the values are this chunk's alone, so partitioned where they lie
        chunks.append(np.quantile(values, list(qs), axis=1, overwrite_input=True))
    ends = np.quantile(np.concatenate(chunks, axis=1), [(1 - level) / 2, (1 + level) / 2], axis=1)
    if not full:
        centre = np.quantile(x, list(qs))
        ends = centre[None, :] + np.sqrt(m / n) * (ends - centre[None, :])
    return [(float(lo), float(hi)) for lo, hi in ends.T]




def wilson_ci(num_met: int, n: int, *, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (i.i.d.; sensible at 0 or n successes, unlike the bootstrap)."""
    if n == 0:
        return (float("nan"), float("nan"))
    z = normal_quantile((1 + level) / 2)
    p = num_met / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return float(max(0.0, center - half)), float(min(1.0, center + half))


def t_interval(x: Sequence[float], level: float) -> tuple[float, float]:
    """Student-t interval for the mean of replicate values (one per seed); the point itself from one."""
    from scipy import stats

    v = np.asarray(x, dtype=float)
    m = float(v.mean())
    if len(v) < 2:
        return (m, m)
    half = float(stats.t.ppf((1 + level) / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return (m - half, m + half)


# scipy.stats.norm.ppf(0.975), to the bit (tests hold it): the one level every summary and report uses,
# without importing scipy.stats (a second of CPU) at the end of every run
Z_95 = 1.959963984540054


def normal_quantile(p: float) -> float:
    if p == 0.975:
        return Z_95
    from scipy.stats import norm

    return float(norm.ppf(p))


def binomial_quantile(p: float, n: int, q: float) -> int:
    """The smallest k with P(Binomial(n, q) <= k) >= p, for 0 < p < 1 and 0 < q < 1: scipy's
    `binom.ppf(p, n, q)`. Computed over the pmf within 5 sqrt(n) of the mean (Hoeffding: the mass beyond
    is under 2e-22), each value's log summed outwards from the mode so that those near it stay exact; only
    where the CDF lies within a relative 1e-9 of p is scipy asked (a second of CPU to import)."""
    mean = n * q
    half = 5.0 * math.sqrt(n) + 10.0
    k0, k1 = max(0, math.floor(mean - half)), min(n, math.ceil(mean + half))
    k = np.arange(k0, k1 + 1, dtype=float)
    mode = min(max(math.floor((n + 1) * q), k0), k1) - k0
    step = np.log((n - k[:-1]) / (k[:-1] + 1)) + math.log(q / (1 - q))  # log pmf(k+1) - log pmf(k)
    log_pmf = np.empty(len(k))
    log_pmf[mode] = 0.0
    log_pmf[mode + 1:] = np.cumsum(step[mode:])
    log_pmf[:mode] = -np.cumsum(step[:mode][::-1])[::-1]
    cdf = np.cumsum(np.exp(log_pmf))
    cdf /= cdf[-1]
    i = int(np.searchsorted(cdf, p, side="left"))
    if any(abs(cdf[j] - p) <= 1e-9 * min(p, 1 - p) for j in (i - 1, i) if 0 <= j < len(cdf)):
        from scipy.stats import binom

        return int(binom.ppf(p, n, q))
    return k0 + i


def order_statistic_ci(x: np.ndarray, q: float, *, level: float = 0.95) -> tuple[float | None, float | None]:
    """Distribution-free interval for the q-quantile from the sorted sample (i.i.d.): [x_(l), x_(u)] with
    l, u from Binomial(n, q). An end the sample cannot bound is None (the upper end of a p99 from 100
    values: at least 5% of the time all 100 fall below the true p99)."""
    return order_statistic_cis(x[~np.isnan(x)], (q,), level=level)[0]


def order_statistic_cis(x: np.ndarray, qs: Sequence[float], *, level: float = 0.95) -> list[tuple[float | None, float | None]]:
    """`order_statistic_ci` of each of `qs` for x (no NaNs), from one partial sort."""
    n = len(x)
    if n == 0:
        return [(None, None)] * len(qs)
    alpha = 1 - level
    # x_(rank), 1-based; lo 0 = below the smallest value, hi n + 1 = above the largest
    ranks = [(binomial_quantile(alpha / 2, n, q), binomial_quantile(1 - alpha / 2, n, q) + 1) for q in qs]
    kth = sorted({r - 1 for pair in ranks for r in pair if 1 <= r <= n})
    part = np.partition(x, kth) if kth else x
    return [(float(part[lo - 1]) if lo >= 1 else None, float(part[hi - 1]) if hi <= n else None) for lo, hi in ranks]


def samples_beyond(n: int, q: float) -> int:
    """How many of n values lie above the q-quantile: NOTES-statistics asks for >= 100 to estimate it."""
    return int(np.floor(n * (1 - q) + 1e-9))


def quantile_ci(x: np.ndarray, q: float, *, level: float = 0.95, seed: int = 0) -> tuple[float | None, float | None]:
    """The envelope of the block-bootstrap and order-statistic intervals for the q-quantile of x."""
    return quantile_cis(x, (q,), level=level, seed=seed)[0]


def quantile_cis(x: np.ndarray, qs: Sequence[float], *, level: float = 0.95,
                 seed: int = 0) -> list[tuple[float | None, float | None]]:
    """`quantile_ci` of each of `qs`: one set of resamples and one partial sort for all of them."""
    x = finite_values(x)
    out: list[tuple[float | None, float | None]] = []
    for (b_lo, b_hi), (o_lo, o_hi) in zip(bootstrap_quantile_cis(x, qs, level=level, seed=seed),
                                          order_statistic_cis(x, qs, level=level), strict=True):
        if b_lo is None or b_hi is None:
            out.append((None, None))
            continue
        lo = b_lo if o_lo is None else min(b_lo, o_lo)  # below the smallest value: the bootstrap's end stands
        out.append((lo, None if o_hi is None else max(b_hi, o_hi)))
    return out


@dataclass(frozen=True, slots=True)
class Attainment:
    value: float
    ci_low: float | None  # None: a summary built without intervals (summarize(intervals="none"))
    ci_high: float | None
    num_requests: int
    num_met: int
    good_throughput_rps: float  # SLO-meeting requests per second over the run (vLLM's "--goodput" number)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attainment(a: RecordArrays, slo: SLO, *, duration_s: float, seed: int = 0) -> Attainment:
    met = slo.meets(a).astype(float)
    n = len(met)
    if n == 0:
        return Attainment(float("nan"), float("nan"), float("nan"), 0, 0, 0.0)
    b_lo, b_hi = bootstrap_mean_ci(met, seed=seed)
    w_lo, w_hi = wilson_ci(int(met.sum()), n)
    lo, hi = min(b_lo, w_lo), max(b_hi, w_hi)
    return Attainment(
        value=float(met.mean()),
        ci_low=lo,
        ci_high=hi,
        num_requests=n,
        num_met=int(met.sum()),
        good_throughput_rps=float(met.sum()) / duration_s if duration_s > 0 else 0.0,
    )
