"""The day a fleet plan is made for: its requests, cut into windows the planner sizes a fleet for.

A day comes from a workload spec (the bundled `day`: 24 hours compressed 60x, one phase an hour) or from
traces (`--trace A --trace B`: their requests interleaved by arrival, each tagged with its trace's name,
e.g. the Azure 2023 code and conversation traces). `compression` says how many seconds of the real day one
second of the workload stands for (60 for the bundled day, 1 for a trace replayed as it was): rates are
real rates, durations are compressed, so a window of `--window 1h` is 60 s of the bundled day's traffic.
A `DayRecipe` is everything needed to rebuild the windows (`build_windows`): workers rebuild them from it
once per process instead of receiving every prompt by pickle.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import SpecError, UsageError
from slobench.run.records import RequestSpec
from slobench.workload.phases import CurveArrivals, DiurnalArrivals, Phase, rescale
from slobench.workload.replay import replay
from slobench.workload.spec import generate
from slobench.workload.traces import Trace, load_trace

__all__ = ["DayRecipe", "Window", "build_windows", "day_length_s", "interleave"]


@dataclass(frozen=True, slots=True)
class DayRecipe:
    """`workload`: a WorkloadSpec (or None with `traces`); `traces`: trace paths, interleaved."""

    workload: Any = None
    traces: tuple[str, ...] = ()
    rate_rps: float | None = None  # a spec's mean rate (None: the spec's own)
    time_scale: float | None = None  # traces: multiply trace time by this
    seed: int = 0
    compression: float = 1.0
    window_s: float = 3600.0  # real seconds
    lead_s: float | None = None  # workload seconds; None: a quarter of a window's workload span
    max_requests: int = 1000
    api: str = "completions"

    def __post_init__(self) -> None:
        if (self.workload is None) == (not self.traces):
            raise UsageError("give a workload or traces for the day, not both and not neither")
        for name in ("compression", "window_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
                raise SpecError(name, v, "must be a finite number > 0")
        if self.lead_s is not None and not (math.isfinite(self.lead_s) and self.lead_s >= 0):
            raise SpecError("lead_s", self.lead_s, "must be a finite number >= 0")
        if isinstance(self.max_requests, bool) or not isinstance(self.max_requests, int) or self.max_requests < 10:
            raise SpecError("max_requests", self.max_requests, "must be an integer >= 10")

    @property
    def window_workload_s(self) -> float:
        return self.window_s / self.compression

    @property
    def name(self) -> str:
        if self.workload is not None:
            return str(self.workload.name)
        from pathlib import Path

        return "+".join(Path(p).name.split(".")[0] for p in self.traces)


@dataclass(frozen=True, slots=True)
class Window:
    index: int
    start_s: float  # workload time
    end_s: float
    specs: tuple[RequestSpec, ...]  # the lead-in, then the counted sample; arrivals from 0 at the lead-in
    num_lead: int  # the first num_lead specs are lead-in, not counted
    num_requests: int  # requests of the whole window (the sample may hold fewer)
    stats: dict[str, Any]

    @property
    def counted(self) -> tuple[RequestSpec, ...]:
        return self.specs[self.num_lead :]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def rate_rps(self) -> float:
        return self.num_requests / self.duration_s if self.duration_s > 0 else 0.0

    def sample_span(self) -> tuple[float, float]:
        """Rebased arrival times of the counted sample: first and one past the last (by the window's rate)."""
        c = self.counted
        if not c:
            return 0.0, 0.0
        lo = c[0].arrival_s
        hi = c[-1].arrival_s + (1.0 / self.rate_rps if self.rate_rps > 0 else 0.0)
        return lo, hi


def _day_phases(recipe: DayRecipe) -> tuple[Any, ...]:
    """The spec's phases over the whole day, rescaled to `rate_rps`; a spec without phases is one phase."""
    spec = recipe.workload
    if spec.phases:
        phases = spec.phases
    else:
        if spec.duration_s is None:
            raise SpecError("duration_s", None, f"workload {spec.name!r}: a day needs phases or a duration_s")
        phases = (Phase(spec.name, spec.duration_s, spec.arrival, spec.mix),)
    return rescale(phases, recipe.rate_rps) if recipe.rate_rps is not None else tuple(phases)


def _shifted(arrival: Any, offset_s: float) -> Any:
    """An arrival process whose time 0 is `offset_s` into the original (stationary ones are unchanged)."""
    if offset_s == 0:
        return arrival
    if isinstance(arrival, DiurnalArrivals):
        peak = arrival.period_s / 2 if arrival.peak_s is None else arrival.peak_s
        return replace(arrival, peak_s=peak - offset_s)
    if isinstance(arrival, CurveArrivals):
        ts = np.array([t for t, _ in arrival.points])
        rs = np.array([r for _, r in arrival.points])
        keep = ts > offset_s
        pts = [(0.0, float(np.interp(offset_s, ts, rs)))] + [(float(t - offset_s), float(r))
                                                            for t, r in zip(ts[keep], rs[keep], strict=True)]
        return CurveArrivals(tuple(pts))
    return arrival


def _slice(phases: tuple[Any, ...], a: float, b: float) -> tuple[Any, ...]:
    """The phases' traffic between day times a and b, as phases (names kept, so tags are too)."""
    out = []
    start = 0.0
    for p in phases:
        lo, hi = max(a, start), min(b, start + p.duration_s)
        if hi > lo:
            out.append(replace(p, duration_s=hi - lo, arrival=_shifted(p.arrival, lo - start)))
        start += p.duration_s
    return tuple(out)


def _mean_rate(phases: tuple[Any, ...], a: float, b: float) -> float:
    """Expected requests per second between a and b (a rate curve's mean over each slice, numerically)."""
    total = 0.0
    for p in _slice(phases, a, b):
        rate_at = getattr(p.arrival, "rate_at", None)
        if rate_at is None:
            total += p.arrival.rate_rps * p.duration_s
        else:
            t = np.linspace(0.0, p.duration_s, 257)
            total += float(np.trapezoid(rate_at(t), t))
    return total / (b - a) if b > a else 0.0


def day_length_s(recipe: DayRecipe) -> float:
    if recipe.workload is not None:
        return float(sum(p.duration_s for p in _day_phases(recipe)))
    return _trace_times(recipe)[-1] + 1e-9


def _trace_times(recipe: DayRecipe) -> np.ndarray:
    trace = interleave(recipe.traces, seed=recipe.seed)
    k = recipe.time_scale or 1.0
    return trace.arrival_s * k


def _spec_windows(recipe: DayRecipe) -> list[Window]:
    spec = recipe.workload
    phases = _day_phases(recipe)
    length = float(sum(p.duration_s for p in phases))
    step = recipe.window_workload_s
    out = []
    for k in range(max(1, math.ceil(length / step - 1e-9))):
        start, end = k * step, min((k + 1) * step, length)
        rate = _mean_rate(phases, start, end)
        span = min(end - start, recipe.max_requests / rate) if rate > 0 else end - start
        s0 = start + (end - start - span) / 2  # the sample: a stretch from the window's middle
        lead = recipe.lead_s if recipe.lead_s is not None else 0.25 * span
        a = max(0.0, s0 - lead)
        sub = replace(spec, phases=_slice(phases, a, s0 + span), num_requests=None, duration_s=None)
        specs = generate(sub, seed=_window_seed(recipe.seed, k), api=recipe.api)
        num_lead = sum(1 for s in specs if s.arrival_s < s0 - a)
        counted = specs[num_lead:][: recipe.max_requests]
        specs = specs[: num_lead + len(counted)]
        out.append(Window(k, start, end, tuple(specs), num_lead, round(rate * (end - start)),
                          _stats(counted, rate, end - start)))
    return out


def _window_seed(seed: int, k: int) -> int:
    return int(np.random.SeedSequence([seed, 0xDA7, k]).generate_state(1)[0])


def _trace_windows(recipe: DayRecipe) -> list[Window]:
    trace = interleave(recipe.traces, seed=recipe.seed)
    k_scale = recipe.time_scale or 1.0
    times = trace.arrival_s * k_scale
    length = float(times[-1]) + 1e-9
    step = recipe.window_workload_s
    out = []
    for k in range(max(1, math.ceil(length / step - 1e-9))):
        start, end = k * step, min((k + 1) * step, length)
        lo, hi = (int(x) for x in np.searchsorted(times, [start, end], side="left"))
        a, b = lo, hi
        if hi - lo > recipe.max_requests:
            a = lo + (hi - lo - recipe.max_requests) // 2
            b = a + recipe.max_requests
        if b == a:
            out.append(Window(k, start, end, (), 0, 0, _stats([], 0.0, end - start)))
            continue
        sample_span = times[b - 1] - times[a] if b - a > 1 else step
        lead = recipe.lead_s if recipe.lead_s is not None else 0.25 * sample_span
        first = int(np.searchsorted(times, times[a] - lead, side="left"))
        t0 = trace.entries[first].arrival_s
        sub = Trace(trace.path, trace.format, tuple(replace(e, arrival_s=e.arrival_s - t0)
                                                    for e in trace.entries[first:b]),
                    block_tokens=trace.block_tokens)
        specs = replay(sub, time_scale=k_scale, seed=_window_seed(recipe.seed, k), api=recipe.api)
        out.append(Window(k, start, end, tuple(specs), a - first, hi - lo,
                          _stats(specs[a - first:], (hi - lo) / (end - start), end - start)))
    return out


def interleave(paths: tuple[str, ...], *, seed: int) -> Any:
    """One trace from several: every request keeps its own time (each trace from its first request) and
    is tagged with its trace's name, so code and conversation traffic share one day."""
    traces = [load_trace(p, seed=seed) for p in paths]
    if len(traces) == 1:
        return traces[0]
    entries = sorted(
        (replace(e, tag=e.tag or Path(t.path).name.split(".")[0]) for t in traces for e in t.entries),
        key=lambda e: e.arrival_s,
    )
    with_blocks = [t for t in traces if any(e.hash_ids for e in t.entries)]
    block_tokens = with_blocks[0].block_tokens if with_blocks else traces[0].block_tokens
    return Trace("+".join(t.path for t in traces), traces[0].format, tuple(entries),
                 num_rows=sum(t.num_rows for t in traces), block_tokens=block_tokens)


def _stats(specs: list[RequestSpec], rate_rps: float, duration_s: float) -> dict[str, Any]:
    """The window's traffic: its expected rate, and lengths and classes from its sample."""
    n = len(specs)
    ins = np.array([s.input_tokens for s in specs], dtype=np.float64)
    outs = np.array([s.max_tokens for s in specs], dtype=np.float64)
    classes = Counter(s.tag.split("/")[-1] for s in specs)
    return {
        "rate_rps": rate_rps,
        "num_requests": round(rate_rps * duration_s),
        "mean_input_tokens": float(ins.mean()) if n else 0.0,
        "mean_output_tokens": float(outs.mean()) if n else 0.0,
        "p99_input_tokens": float(np.quantile(ins, 0.99)) if n else 0.0,
        "p99_output_tokens": float(np.quantile(outs, 0.99)) if n else 0.0,
        "prefill_decode_ratio": float(ins.sum() / max(outs.sum(), 1.0)),
        "classes": dict(sorted(classes.items())),
    }


def build_windows(recipe: DayRecipe) -> list[Window]:
    """The day's windows. A window's evaluation sample is its requests, or a contiguous stretch of at most
    `max_requests` of them from its middle when it has more (the rate is kept, the stretch is shorter),
    preceded by a lead-in: the requests of the `lead_s` before the stretch, simulated on the same fleet but
    not counted, so the fleet starts the window with the queue and the prefix cache it would have."""
    windows = _spec_windows(recipe) if recipe.workload is not None else _trace_windows(recipe)
    if not any(w.counted for w in windows):
        raise UsageError(f"{recipe.name}: the day has no requests")
    return windows
