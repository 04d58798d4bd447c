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
from slobench.errors import SpecError, UsageError
from slobench.input_file import SETTINGS, read_input_bytes

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DUR_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us)?\s*$")
_KEYS = {"ttft": "ttft_s", "ttfa": "ttfa_s", "tpot": "tpot_s", "e2e": "e2e_s", "session": "session_s"}
_NAMES = "ttft, ttfa, tpot, e2e, session"


def parse_duration_s(text: str, field: str, *, allow_zero: bool = False) -> float:
    """'500ms' -> 0.5; '2s' -> 2.0; a bare number is seconds. 0 only with `allow_zero`."""
    m = _DUR_RE.match(str(text))
    if not m:
        raise SpecError(field, text, "expected a duration like 500ms, 0.5s or 0.5")
    v = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if v < 0 or (v == 0 and not allow_zero):
        raise SpecError(field, text, "must be >= 0" if allow_zero else "must be positive")
    return v


def parse_slo_limit_s(val: Any, key: str) -> float:
    """One SLO limit: a duration that carries its unit ('500ms', '0.5s'). A bare number is refused, because
    `ttft=500` reads as milliseconds to one user and seconds to another; the message names the fix."""
    if isinstance(val, bool) or not isinstance(val, str | int | float):
        raise SpecError(f"slo.{key}", val, "must be a duration such as 500ms or 0.5s")
    m = _DUR_RE.match(str(val))
    if m and m.group(2) is None:
        v = float(m.group(1))
        ms, s = f"{key}={v:g}ms", f"{key}={v:g}s"
        hint = f"{ms} or {key}={v / 1000:g}s" if v >= 1 else f"{s} or {key}={v * 1000:g}ms"
        raise SpecError(f"slo.{key}", val, f"give a unit, e.g. {hint}")
    return parse_duration_s(str(val), f"slo.{key}")


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    target: float = 0.9  # attainment target used for headlines, capacity and knees
    clock: Literal["scheduled", "sent"] = "scheduled"
    # time to the first answer token (after a reasoning model's reasoning; TTFT where there is none): a
    # request that reasoned and never answered misses it. Last, and written only when set: older
    # summaries read the same.
    ttfa_s: float | None = None
    # a session's bound: a session (`slobench.analysis.sessions`) meets the session SLO when every turn met
    # the limits above and it ended within this long of its first turn's scheduled send. No request's own
    # limit; written only when set.
    session_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "ttfa_s", "tpot_s", "e2e_s", "session_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and np.isfinite(v)):
                raise SpecError(f"slo.{name[:-2]}", v, "must be a positive duration")
        if not 0 < self.target <= 1:
            raise SpecError("slo.target", self.target, "must be in (0, 1]")
        if self.clock not in ("scheduled", "sent"):
            raise SpecError("slo.clock", self.clock, "must be 'scheduled' or 'sent'")
        if all(getattr(self, name) is None for name in _KEYS.values()):
            raise SpecError("slo", "", f"give at least one of {_NAMES}")

    @classmethod
    def parse(cls, text: str) -> SLO:
        """Parse `ttft=500ms,tpot=50ms[,ttfa=2s][,e2e=10s][,session=60s][,target=0.9][,clock=sent]`."""
        kw: dict[str, Any] = {}
        seen: set[str] = set()
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise SpecError("slo", part, "expected key=value (e.g. ttft=500ms,tpot=50ms)")
            key, val = (s.strip() for s in part.split("=", 1))
            if key in seen:
                raise SpecError("slo", key, f"given twice; give each of {_NAMES}, target, clock once")
            seen.add(key)
            if key in _KEYS:
                kw[_KEYS[key]] = parse_slo_limit_s(val, key)
            elif key == "target":
                kw["target"] = parse_fraction(val)
            elif key == "clock":
                kw["clock"] = val
            else:
                raise SpecError("slo", key, f"unknown key; use {_NAMES}, target or clock")
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SLO:
        kw: dict[str, Any] = {}
        for key, val in d.items():
            if val is None:
                continue
            if key in _KEYS:  # `ttft = "500ms"`: the unit travels with the value
                kw[_KEYS[key]] = parse_slo_limit_s(val, key)
            elif key in _KEYS.values():  # `ttft_s = 0.5`: the name carries the unit (as summary.json writes it)
                if isinstance(val, int | float) and not isinstance(val, bool):
                    kw[key] = float(val)
                elif isinstance(val, str):
                    kw[key] = parse_duration_s(val, f"slo.{key}")
                else:  # a list, a table, true: TOML parses them, an SLO cannot use them
                    raise SpecError(f"slo.{key}", val, "must be a number of seconds")
            elif key == "target":
                kw["target"] = parse_fraction(val)
            elif key == "clock":
                kw["clock"] = val
            else:
                raise SpecError(f"slo.{key}", val, f"unknown key; use {_NAMES}, target or clock")
        return cls(**kw)

    @classmethod
    def from_toml(cls, path: str | Path) -> SLO:
        try:
            data = tomllib.loads(read_input_bytes(path, SETTINGS).decode("utf-8"))
        except UnicodeDecodeError:
            raise SpecError("slo", str(path), "not a text file (not UTF-8): not an SLO TOML") from None
        except (OSError, tomllib.TOMLDecodeError, UsageError) as e:  # UsageError: not a regular file, too large
            raise SpecError("slo", str(path), f"cannot read SLO file: {e}") from None
        except RecursionError:  # the standard library's reader recurses once per nested array or table
            raise SpecError("slo", str(path), "arrays or inline tables nested too deeply to read") from None
        slo = data.get("slo", data)
        if not isinstance(slo, dict):
            raise SpecError("slo", str(path), f"[slo] must be a table of {_NAMES}, target, clock")
        return cls.from_dict(slo)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("ttfa_s", "session_s"):
            if d[name] is None:
                del d[name]
        return d

    def as_flag(self) -> str:
        """The `--slo` text that parses back to this SLO."""
        parts = [f"{k}={getattr(self, v):g}s" for k, v in _KEYS.items() if getattr(self, v) is not None]
        return ",".join([*parts, f"target={self.target:g}"] + (["clock=sent"] if self.clock == "sent" else []))

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
        if self.ttfa_s is not None:
            ttfa = a.ttfa_from_scheduled_s if sched else a.ttfa_s
            ok &= np.nan_to_num(ttfa, nan=np.inf) <= self.ttfa_s
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
    O(resamples x blocks), not O(resamples x n): 100,000 requests would otherwise need ~1.6 GB. Every
    whole block's sum is one difference of the prefix sums, taken once for each start; of 0/1 values
    (attainment's) a count in a byte, a table that stays in the cache (the same sums, exact integers).
    """
    n = len(x)
    if n == 0:
        return (float("nan"), float("nan"))
    b = block_length(n)
    starts = block_starts(n, num_resamples, np.random.default_rng(seed))
    num_blocks = starts.shape[1]
    cs = np.concatenate([[0.0], np.cumsum(x, dtype=float)])
    last = n - (num_blocks - 1) * b  # the final block is cut to make exactly n values
    block_sums = cs[b:] - cs[:-b]
    if b <= 255 and ((x == 0) | (x == 1)).all():
        full = block_sums.astype(np.uint8)[starts][:, :-1].sum(axis=1, dtype=np.int64).astype(float)
    else:
        full = block_sums[starts][:, :-1].sum(axis=1)
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
    as one call per quantile with the same seed, for the cost of one. Past FULL_RESAMPLE_MAX values,
    1,000 m-out-of-n resamples of m = FULL_RESAMPLE_MAX values, their spread scaled by sqrt(m / n), so a
    million values cost what 20,000 do. The interval's ends are the order statistics of the resamples'
    quantiles that `np.quantile` reads; `resample_quantile_ends` finds them without sorting every resample."""
    x = finite_values(x)
    n = len(x)
    if n < 2:
        return [(None, None)] * len(qs)
    full = n <= FULL_RESAMPLE_MAX or num_resamples is not None
    b = (num_resamples or int(max(100, min(1000, 20_000_000 // n)))) if full else 1000
    m = n if full else FULL_RESAMPLE_MAX
    starts = block_starts(n, b, np.random.default_rng(seed), m)
    ends = resample_quantile_ends(x, starts, m, qs, ((1 - level) / 2, (1 + level) / 2))
    if not full:
        centre = np.quantile(x, list(qs))
        ends = centre[None, :] + np.sqrt(m / n) * (ends - centre[None, :])
    return [(float(lo), float(hi)) for lo, hi in ends.T]


def resample_quantiles(x: np.ndarray, starts: np.ndarray, m: int, qs: Sequence[float]) -> np.ndarray:
    """(quantile, resample): each of `qs` of each resample, the first m values of the blocks of
    `block_length(len(x))` values at its row of `starts`. Taken a chunk of resamples at a time (bounded
    memory), each block copied whole from a sliding-window view, then partitioned where it lies."""
    blocks = np.lib.stride_tricks.sliding_window_view(x, block_length(len(x)))  # a view: no copy
    rows = max(1, RESAMPLE_CHUNK_VALUES // m)
    chunks = [np.empty((len(qs), 0))]
    for k in range(0, len(starts), rows):
        part = starts[k : k + rows]
        values = blocks[part].reshape(len(part), -1)[:, :m]
        chunks.append(np.quantile(values, list(qs), axis=1, overwrite_input=True))
    return np.concatenate(chunks, axis=1)


PILOT_RESAMPLES = 64  # resamples whose quantiles are found first, to place the thresholds
SELECT_MIN_VALUES = 4_000_000  # below this many resampled values every resample is simply partitioned
BYTE_FIELDS = 8  # thresholds counted in one pass over x: one byte of a uint64 each (a block holds <= 250 values)
THRESHOLDS_PER_LEVEL = 4
SPLIT_ABOVE = 200  # more resamples than this in the cells read: a few are found to split the cells


def resample_quantile_ends(x: np.ndarray, starts: np.ndarray, m: int, qs: Sequence[float],
                           levels: Sequence[float]) -> np.ndarray:
    """`np.quantile(resample_quantiles(x, starts, m, qs), levels, axis=1)`, to the bit, without finding
    every resample's quantiles: of 1,000 resamples' quantiles `levels` read 2 each, and the others need
    only be placed on the right side of those. Counting a resample's values below a threshold places its
    quantile, at the cost of its blocks, not of its values (`counts_below`):

    1. the quantiles of PILOT_RESAMPLES resamples are found by partitioning; their order statistics nearest
       each level become thresholds;
    2. each resample's counts below the thresholds place its quantile in a cell between two of them (or a
       few cells, where a threshold falls between the two order statistics the quantile interpolates);
    3. the resamples that may lie in a cell holding an order statistic read are found, each from its values
       inside its cells alone; every other one stands in as the lower threshold of its lowest cell, on the
       same side as the found ones of every order statistic read, so those are the same.
    """
    num = len(starts)
    if num * m < SELECT_MIN_VALUES or num < 4 * PILOT_RESAMPLES:
        return np.quantile(resample_quantiles(x, starts, m, qs), list(levels), axis=1)
    pilot = resample_quantiles(x, starts[:PILOT_RESAMPLES], m, qs)
    ends = np.empty((len(levels), len(qs)))
    for i, q in enumerate(qs):
        found = np.full(num, np.nan)
        found[:PILOT_RESAMPLES] = pilot[i]
        ends[:, i] = quantile_ends(x, starts, m, q, found, levels)
    return ends


def quantile_ends(x: np.ndarray, starts: np.ndarray, m: int, q: float, found: np.ndarray,
                  levels: Sequence[float]) -> np.ndarray:
    """`resample_quantile_ends` of one quantile q: `found` holds the resamples' q-quantiles found so far
    (NaN for the others: filled in where needed)."""
    known = ~np.isnan(found)
    # the q-quantile interpolates a resample's order statistics lo_k and hi_k (np.quantile's "linear")
    virtual = np.float64(m - 1) * np.float64(q)
    lo_k = m - 1 if virtual >= m - 1 else int(np.floor(virtual))
    hi_k = min(lo_k + 1, m - 1)
    gamma = virtual - (-1 if virtual >= m - 1 else lo_k)
    thresholds, counts = np.empty(0), np.empty((len(starts), 0), dtype=np.int64)
    groups = threshold_groups(np.sort(found[known]), levels)
    while True:
        if groups:  # count below the new thresholds too; (resample, threshold), thresholds ascending
            thresholds, first = np.unique(np.concatenate([thresholds, *groups]), return_index=True)
            counts = np.concatenate([counts, counts_below(x, starts, m, groups)], axis=1)[:, first]
            groups = []
        # a count of at most lo_k: the quantile is at or above the threshold; over hi_k: below it; between,
        # the threshold lies between the two order statistics: in cells lowest..highest (cell c: between
        # thresholds c - 1 and c; 0 below them all)
        lowest = (counts <= lo_k).sum(axis=1)
        highest = (counts <= hi_k).sum(axis=1)
        floor_of = np.concatenate([[-np.inf], thresholds])
        ceiling_of = np.concatenate([thresholds, [np.inf]])
        # a cell from a threshold to the next float holds one value: that is the quantile
        single = (lowest == highest) & (np.nextafter(floor_of, np.inf) == ceiling_of)[lowest] & ~known
        found[single] = floor_of[lowest[single]]
        known |= single
        lowest[known] = highest[known] = np.searchsorted(thresholds, found[known], side="right")
        read = np.concatenate([[0], np.cumsum(cells_read(lowest, highest, len(thresholds), levels))])
        rows = np.flatnonzero((read[highest + 1] > read[lowest]) & ~known)  # a cell read among its possible
        if not len(rows):
            break
        split = len(rows) > SPLIT_ABOVE
        if split:  # too many to find: find a few, their quantiles new thresholds among them
            rows = np.unique(rows[np.linspace(0, len(rows) - 1, BYTE_FIELDS).astype(np.int64)])
        below = np.where(lowest[rows] > 0, counts[rows, np.maximum(lowest[rows] - 1, 0)], 0)
        found[rows] = window_quantiles(x, starts[rows], m, (lo_k, hi_k, gamma), floor_of[lowest[rows]],
                                       ceiling_of[highest[rows]], below)
        known[rows] = True
        if split and not np.isin(found[rows], thresholds).all():
            groups = [np.setdiff1d(found[rows], thresholds)]
    stand_in = np.where(known, found, np.concatenate([[x.min()], thresholds])[lowest])
    return np.quantile(stand_in, list(levels))


def threshold_groups(pilot: np.ndarray, levels: Sequence[float]) -> list[np.ndarray]:
    """Thresholds from the sorted pilot quantiles: the THRESHOLDS_PER_LEVEL nearest each level's position,
    and where the pilot repeats a value, the next float above it too (a resample's quantile there is that
    value), in groups of at most BYTE_FIELDS."""
    p = len(pilot)
    picks = []
    for lv in levels:
        first = min(max(0, round(lv * (p - 1)) - THRESHOLDS_PER_LEVEL // 2), max(0, p - THRESHOLDS_PER_LEVEL))
        picks.append(pilot[first:first + THRESHOLDS_PER_LEVEL])
    t = np.unique(np.concatenate(picks))
    repeated = pilot[1:][pilot[1:] == pilot[:-1]]
    t = np.unique(np.concatenate([t, np.nextafter(t[np.isin(t, repeated)], np.inf)]))
    return [t[i:i + BYTE_FIELDS] for i in range(0, len(t), BYTE_FIELDS)]


def counts_below(x: np.ndarray, starts: np.ndarray, m: int, groups: Sequence[np.ndarray]) -> np.ndarray:
    """(resample, threshold): how many of each resample's m values lie below each threshold of `groups`
    (each at most BYTE_FIELDS sorted thresholds), in the order given. Per group, each value's below-flags
    are packed one threshold a byte into a uint64 and prefix-summed over x: a block's difference of two
    sums holds each of its counts, at most `block_length` <= 255, in its own byte (no carries), so a
    resample's counts cost its blocks, not its values."""
    b = block_length(len(x))
    if b > 255:
        raise ValueError(f"blocks of {b} values overflow a byte's count")
    lens = np.full(starts.shape[1], b, dtype=np.int64)
    lens[-1] = m - (starts.shape[1] - 1) * b  # the last block cut short, as the resamples are
    ends = starts + lens
    shifts = np.arange(BYTE_FIELDS, dtype=np.uint64) * np.uint64(8)
    sums = np.zeros(len(x) + 1, dtype=np.uint64)
    out = []
    for t in groups:
        # flags[r]: a value with r of the thresholds at or below it is below thresholds r, r + 1, ...
        flags = ((np.arange(len(t))[None, :] >= np.arange(len(t) + 1)[:, None]).astype(np.uint64)
                 << shifts[:len(t)]).sum(axis=1, dtype=np.uint64)
        below = x < t[0]
        packed = np.where(below, flags[0], np.uint64(0))
        between = np.flatnonzero(~below & (x < t[-1]))  # the few values among the thresholds
        packed[between] = flags[np.searchsorted(t, x[between], side="right")]
        np.cumsum(packed, out=sums[1:])
        diff = sums[ends] - sums[starts]  # (resample, block), wrapping as uint64 does: exact
        per_block = diff.astype("<u8", copy=False).view(np.uint8).reshape(len(starts), -1, BYTE_FIELDS)
        out.append(per_block.sum(axis=1, dtype=np.int64)[:, :len(t)])
    return np.concatenate(out, axis=1)


def cells_read(lowest: np.ndarray, highest: np.ndarray, num_thresholds: int, levels: Sequence[float]) -> np.ndarray:
    """Whether each cell between thresholds may hold an order statistic `np.quantile(..., levels)` reads of
    values each known to lie in cells lowest..highest: a cell's values are at positions from the number
    surely below it to the number perhaps at or below it."""
    size = num_thresholds + 1
    surely_below = np.concatenate([[0], np.cumsum(np.bincount(highest, minlength=size))[:-1]])
    perhaps_upto = np.cumsum(np.bincount(lowest, minlength=size))
    read = np.zeros(size, dtype=bool)
    for k in read_positions(len(lowest), levels):
        read |= (surely_below <= k) & (perhaps_upto > k)
    return read


def read_positions(n: int, levels: Sequence[float]) -> np.ndarray:
    """The positions in n sorted values that `np.quantile(..., levels)` ("linear") interpolates between."""
    virtual = np.float64(n - 1) * np.asarray(levels, dtype=float)
    below = np.floor(virtual).astype(np.int64)
    return np.unique(np.clip(np.concatenate([below, below + 1]), 0, n - 1))


def window_quantiles(x: np.ndarray, starts: np.ndarray, m: int, order: tuple[int, int, float],
                     lower: np.ndarray, upper: np.ndarray, below: np.ndarray) -> np.ndarray:
    """Each resample's quantile that interpolates its order statistics order = (lo_k, hi_k, gamma) as
    np.quantile does, where both lie in [lower, upper) and `below` of its values lie below `lower`: from the
    resample's values in that window alone, sorted."""
    lo_k, hi_k, gamma = order
    blocks = np.lib.stride_tricks.sliding_window_view(x, block_length(len(x)))
    rows = max(1, RESAMPLE_CHUNK_VALUES // m)
    out = np.empty(len(starts))
    for k in range(0, len(starts), rows):
        part = slice(k, k + rows)
        values = blocks[starts[part]].reshape(len(starts[part]), -1)[:, :m]
        inside = (values >= lower[part, None]) & (values < upper[part, None])
        for r, (row, keep) in enumerate(zip(values, inside, strict=True), start=k):
            kept = row[keep]
            kept.partition([lo_k - below[r], hi_k - below[r]])
            a, b = kept[lo_k - below[r]], kept[hi_k - below[r]]
            # np.quantile's interpolation (numpy.lib._function_base_impl._lerp), to the bit
            diff = b - a
            out[r] = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
    return out


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
