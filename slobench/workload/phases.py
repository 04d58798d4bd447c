"""Time-varying traffic: rate curves (non-homogeneous Poisson by thinning), request classes, and phases.

A phased run is a sequence of segments, each with its own arrival process (a rate, or a rate curve) and
its own mix of request classes (each class its own input and output length distributions): e.g. a
prefill-heavy morning of long documents, then a decode-heavy afternoon of short prompts and long answers.
Each request is tagged `phase/class`; `phase_boundaries` gives the segment starts for the manifest.

Thinning (Lewis & Shedler 1979): candidates come from a Poisson process at the curve's peak rate, and a
candidate at t is kept with probability rate(t) / peak, which yields exactly a Poisson process of
intensity rate(t). A curve's time is the phase's own time (0 at the phase start).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from slobench.errors import SpecError
from slobench.workload.arrivals import ArrivalProcess
from slobench.workload.lengths import LengthDist

__all__ = [
    "CurveArrivals",
    "DiurnalArrivals",
    "Phase",
    "RequestClass",
    "Schedule",
    "boundaries",
    "curve_from_dict",
    "mean_rate_rps",
    "rescale",
    "schedule_phases",
]


def _finite_positive(field: str, x: object) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not (math.isfinite(x) and x > 0):
        raise SpecError(field, x, "must be a finite number > 0")


def _check_bounds(num_requests: int | None, duration_s: float | None) -> None:
    if num_requests is None and duration_s is None:
        raise SpecError("num_requests", None, "set num_requests and/or duration_s to bound the schedule")


def _thin(
    rate_at: Callable[[np.ndarray], np.ndarray],
    peak_rps: float,
    rng: np.random.Generator,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Arrival times of the Poisson process of intensity rate_at(t) <= peak_rps, by thinning."""
    _check_bounds(num_requests, duration_s)
    cap = math.inf if num_requests is None else num_requests
    kept: list[np.ndarray] = []
    total = 0
    t_end = 0.0
    chunk = 4096  # fixed, so the candidates (and the kept times) do not depend on the bounds
    while total < cap and (duration_s is None or t_end < duration_s):
        t = t_end + np.cumsum(rng.standard_exponential(chunk) / peak_rps)
        u = rng.random(chunk)
        t_end = float(t[-1])
        t = t[u * peak_rps < rate_at(t)]
        if duration_s is not None:
            t = t[t < duration_s]
        kept.append(t)
        total += len(t)
    out = np.concatenate(kept) if kept else np.empty(0)
    return out if num_requests is None else out[:num_requests]


@dataclass(frozen=True, slots=True)
class DiurnalArrivals:
    """Poisson with a sinusoidal rate: mean `rate_rps`, peak/trough ratio `peak_to_trough`, `period_s`,
    peaking at `peak_s` (default half a period: a "day" that starts at its trough).

    rate(t) = rate_rps · (1 + a·cos(2π(t − peak_s)/period_s)), a = (R − 1)/(R + 1) for R = peak/trough, so
    peak/trough is exactly R and the mean over a whole period is rate_rps.
    """

    rate_rps: float
    peak_to_trough: float
    period_s: float
    peak_s: float | None = None

    name: ClassVar[str] = "diurnal"

    def __post_init__(self) -> None:
        _finite_positive("rate_rps", self.rate_rps)
        _finite_positive("period_s", self.period_s)
        if (
            isinstance(self.peak_to_trough, bool)
            or not isinstance(self.peak_to_trough, int | float)
            or not (math.isfinite(self.peak_to_trough) and self.peak_to_trough >= 1)
        ):
            raise SpecError("peak_to_trough", self.peak_to_trough, "must be a finite number >= 1")
        if self.peak_s is not None and not (isinstance(self.peak_s, int | float) and math.isfinite(self.peak_s)):
            raise SpecError("peak_s", self.peak_s, "must be a finite number")

    @property
    def _amplitude(self) -> float:
        return (self.peak_to_trough - 1.0) / (self.peak_to_trough + 1.0)

    def rate_at(self, t_s: np.ndarray) -> np.ndarray:
        peak = self.period_s / 2 if self.peak_s is None else self.peak_s
        return self.rate_rps * (1.0 + self._amplitude * np.cos(2 * np.pi * (t_s - peak) / self.period_s))

    def schedule(
        self, rng: np.random.Generator, *, num_requests: int | None = None, duration_s: float | None = None
    ) -> np.ndarray:
        return _thin(self.rate_at, self.rate_rps * (1 + self._amplitude), rng, num_requests, duration_s)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.diff(self.schedule(rng, num_requests=n), prepend=0.0)

    def with_rate(self, rate_rps: float) -> DiurnalArrivals:
        return replace(self, rate_rps=rate_rps)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"process": self.name, "rate_rps": self.rate_rps,
                                "peak_to_trough": self.peak_to_trough, "period_s": self.period_s}
        if self.peak_s is not None:
            d["peak_s"] = self.peak_s
        return d

    def __str__(self) -> str:
        return f"diurnal(x{self.peak_to_trough:g}/{self.period_s:g}s)@{self.rate_rps:.2f}rps"


@dataclass(frozen=True, slots=True)
class CurveArrivals:
    """Poisson with a piecewise-linear rate through `points` [(t_s, rate_rps), ...], flat outside them.
    `rate_rps` is the time-average over the points' span (what --rate rescales)."""

    points: tuple[tuple[float, float], ...]

    name: ClassVar[str] = "curve"

    def __post_init__(self) -> None:
        if len(self.points) < 1:
            raise SpecError("points", self.points, "needs at least one [t_s, rate_rps] pair")
        ts = [p[0] for p in self.points]
        rs = [p[1] for p in self.points]
        if any(not math.isfinite(t) or t < 0 for t in ts) or any(b <= a for a, b in zip(ts, ts[1:], strict=False)):
            raise SpecError("points", self.points, "times must be >= 0 and strictly increasing")
        if any(not math.isfinite(r) or r < 0 for r in rs) or max(rs) <= 0:
            raise SpecError("points", self.points, "rates must be >= 0 with at least one > 0")

    @property
    def rate_rps(self) -> float:
        if len(self.points) == 1:
            return float(self.points[0][1])
        ts, rs = np.array(self.points).T
        return float(np.trapezoid(rs, ts) / (ts[-1] - ts[0]))

    def rate_at(self, t_s: np.ndarray) -> np.ndarray:
        ts, rs = np.array(self.points, dtype=np.float64).T
        return np.interp(t_s, ts, rs)

    def schedule(
        self, rng: np.random.Generator, *, num_requests: int | None = None, duration_s: float | None = None
    ) -> np.ndarray:
        return _thin(self.rate_at, max(r for _, r in self.points), rng, num_requests, duration_s)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.diff(self.schedule(rng, num_requests=n), prepend=0.0)

    def with_rate(self, rate_rps: float) -> CurveArrivals:
        c = rate_rps / self.rate_rps
        return CurveArrivals(tuple((t, r * c) for t, r in self.points))

    def to_dict(self) -> dict[str, object]:
        return {"process": self.name, "points": [[t, r] for t, r in self.points]}

    def __str__(self) -> str:
        return f"curve({len(self.points)} points)@{self.rate_rps:.2f}rps"


def curve_from_dict(d: Mapping[str, Any]) -> ArrivalProcess:
    """[arrival] tables with process = "diurnal" or "curve" (the renewal ones live in arrivals.py)."""
    process = d.get("process")
    if process == "diurnal":
        allowed = {"process", "rate_rps", "peak_to_trough", "period_s", "peak_s"}
        _no_unknown(d, allowed)
        for key in ("rate_rps", "peak_to_trough", "period_s"):
            if key not in d:
                raise SpecError(key, None, "diurnal needs rate_rps, peak_to_trough and period_s")
        return DiurnalArrivals(d["rate_rps"], d["peak_to_trough"], d["period_s"], d.get("peak_s"))
    _no_unknown(d, {"process", "points"})
    pts = d.get("points")
    if not isinstance(pts, list) or not all(
        isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(x, int | float) for x in p) for p in pts
    ):
        raise SpecError("points", pts, "must be a list of [t_s, rate_rps] pairs")
    return CurveArrivals(tuple((float(t), float(r)) for t, r in pts))


def _no_unknown(d: Mapping[str, Any], allowed: set[str]) -> None:
    for key in d:
        if key not in allowed:
            raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(allowed)}")


# ---- classes and phases ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestClass:
    name: str
    input: LengthDist
    output: LengthDist

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise SpecError("name", self.name, "a class needs a non-empty name without '/'")

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input.to_dict(), "output": self.output.to_dict()}


@dataclass(frozen=True, slots=True)
class Phase:
    """A segment of the run: `duration_s` long, arrivals from `arrival`, classes drawn by `mix` weights
    (empty: the spec's default class)."""

    name: str
    duration_s: float
    arrival: ArrivalProcess
    mix: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise SpecError("name", self.name, "a phase needs a non-empty name without '/'")
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not d > 0:  # inf: unbounded (internal)
            raise SpecError("duration_s", d, "must be a finite number > 0")
        for cls_name, w in self.mix:
            if isinstance(w, bool) or not isinstance(w, int | float) or not (math.isfinite(w) and w >= 0):
                raise SpecError(f"mix.{cls_name}", w, "a weight must be a finite number >= 0")
        if self.mix and sum(w for _, w in self.mix) <= 0:
            raise SpecError("mix", dict(self.mix), "needs at least one weight > 0")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "duration_s": self.duration_s, "arrival": self.arrival.to_dict()}
        if self.mix:
            d["mix"] = dict(self.mix)
        return d


def mean_rate_rps(phases: Sequence[Phase]) -> float:
    """The run's mean offered rate: each phase's mean rate weighted by its duration."""
    total = sum(p.duration_s for p in phases)
    return sum(p.arrival.rate_rps * p.duration_s for p in phases) / total


def rescale(phases: Sequence[Phase], rate_rps: float) -> tuple[Phase, ...]:
    """The same phases with every rate multiplied by one factor, so the mean rate is `rate_rps`."""
    c = rate_rps / mean_rate_rps(phases)
    return tuple(replace(p, arrival=p.arrival.with_rate(p.arrival.rate_rps * c)) for p in phases)


def boundaries(phases: Sequence[Phase], duration_s: float | None = None) -> list[dict[str, Any]]:
    """[{name, start_s}, ...] in run time; phases starting at or after `duration_s` are left out."""
    out: list[dict[str, Any]] = []
    start = 0.0
    for p in phases:
        if duration_s is not None and start >= duration_s:
            break
        out.append({"name": p.name, "start_s": start})
        start += p.duration_s
    return out


@dataclass(frozen=True, slots=True)
class Schedule:
    """One row per arrival, in time order: when, which class (index into `classes`), which tag, lengths."""

    times_s: np.ndarray
    class_index: np.ndarray
    tags: list[str]
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def schedule_phases(
    phases: Sequence[Phase],
    classes: Sequence[RequestClass],
    ss: np.random.SeedSequence,
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> Schedule:
    """Arrivals and lengths for each phase in turn, cut at `duration_s` (run time) and the first
    `num_requests`. Each phase draws from its own streams keyed by its index, and each class's lengths
    from streams keyed by (phase, class), so changing the rate keeps the k-th request of a class its
    lengths (common random numbers across a sweep)."""
    index = {c.name: i for i, c in enumerate(classes)}
    times: list[np.ndarray] = []
    which: list[np.ndarray] = []
    ins: list[np.ndarray] = []
    outs: list[np.ndarray] = []
    tags: list[str] = []
    start = 0.0
    for pi, phase in enumerate(phases):
        if duration_s is not None and start >= duration_s:
            break
        length = phase.duration_s if duration_s is None else min(phase.duration_s, duration_s - start)
        s_arr, s_mix, s_len = np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 0x50, pi)).spawn(3)
        rng = np.random.default_rng(s_arr)
        if math.isinf(length):  # a spec without phases, bounded by its request count alone
            t = phase.arrival.schedule(rng, num_requests=num_requests)
        else:
            t = phase.arrival.schedule(rng, duration_s=length, num_requests=num_requests)
        mix = phase.mix or ((classes[0].name, 1.0),)
        names = [n for n, _ in mix]
        w = np.array([x for _, x in mix], dtype=np.float64)
        pick = np.random.default_rng(s_mix).choice(len(names), size=len(t), p=w / w.sum())
        cls = np.array([index[names[k]] for k in range(len(names))], dtype=np.int64)[pick]
        n_in = np.empty(len(t), dtype=np.int64)
        n_out = np.empty(len(t), dtype=np.int64)
        for k, name in enumerate(names):
            sel = pick == k
            s_in, s_out = np.random.SeedSequence(s_len.entropy, spawn_key=(*s_len.spawn_key, k)).spawn(2)
            c = classes[index[name]]
            n_in[sel] = c.input.sample(int(sel.sum()), np.random.default_rng(s_in))
            n_out[sel] = c.output.sample(int(sel.sum()), np.random.default_rng(s_out))
        times.append(t + start)
        which.append(cls)
        ins.append(n_in)
        outs.append(n_out)
        tags += [f"{phase.name}/{names[k]}" for k in pick.tolist()]
        start += phase.duration_s
    cut = None if num_requests is None else num_requests
    return Schedule(
        np.concatenate(times)[:cut] if times else np.empty(0),
        np.concatenate(which)[:cut] if which else np.empty(0, np.int64),
        tags[:cut],
        np.concatenate(ins)[:cut] if ins else np.empty(0, np.int64),
        np.concatenate(outs)[:cut] if outs else np.empty(0, np.int64),
    )
