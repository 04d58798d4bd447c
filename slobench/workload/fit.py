"""Fit a workload spec to a trace: arrival burstiness (a gamma renewal process) and token lengths.

Arrivals: the rate is the trace's mean ((n − 1) / span); the gaps' coefficient of variation is reported
two ways, by moments (std/mean, dominated by a few long pauses) and by gamma maximum likelihood (what the
spec uses, as the bulk of the gaps sees it), with the Kolmogorov–Smirnov distance of the fitted gamma.
The per-minute index of dispersion (variance/mean of counts) says how much burstiness a renewal
process cannot hold (1 for Poisson; the Azure code trace is ~160): replay the trace when that matters.

Lengths: a lognormal by maximum likelihood on ln(tokens) with its KS distance, and an empirical inverse
CDF through ~100 quantiles. `choose="auto"` writes the lognormal when regenerating from it lands p50,
p90 and p99 within 10% of the trace's, else the empirical table (real traces are seldom lognormal in the
tail: the Azure samples are not). The choice is printed and written as a comment in the spec.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from slobench.errors import SpecError, UsageError
from slobench.workload.arrivals import GammaArrivals
from slobench.workload.lengths import EmpiricalLength, LengthDist, LogNormalLength
from slobench.workload.spec import WorkloadSpec
from slobench.workload.traces import Trace

__all__ = ["ArrivalFit", "LengthFit", "TraceFit", "dumps_toml", "fit_trace"]

CHECK_QUANTILES = (0.5, 0.9, 0.99)
TOLERANCE = 0.10
_GRID = np.unique(np.concatenate([np.linspace(0, 1, 101), [0.001, 0.005, 0.995, 0.999]]))
_CHECK_SAMPLES = 200_000  # enough that the regenerated p99 is not itself noisy


@dataclass(frozen=True, slots=True)
class ArrivalFit:
    rate_rps: float
    gap_cv_moments: float
    gap_cv_gamma_mle: float
    ks_gamma: float
    dispersion_per_minute: float  # variance / mean of per-minute counts; nan when the trace is < 2 min

    def __str__(self) -> str:
        disp = "n/a" if math.isnan(self.dispersion_per_minute) else f"{self.dispersion_per_minute:.1f}"
        return (
            f"arrivals: {self.rate_rps:.3f} req/s; gap CV {self.gap_cv_moments:.2f} (moments), "
            f"{self.gap_cv_gamma_mle:.2f} (gamma MLE, KS {self.ks_gamma:.3f}); "
            f"per-minute count variance/mean {disp} (1 = Poisson)"
        )


@dataclass(frozen=True, slots=True)
class LengthFit:
    what: str  # "input" or "output"
    trace_quantiles: tuple[float, ...]  # at CHECK_QUANTILES
    mu: float
    sigma: float
    ks_lognormal: float
    lognormal: LogNormalLength
    empirical: EmpiricalLength
    lognormal_errors: tuple[float, ...]  # relative error of regenerated quantiles, at CHECK_QUANTILES
    empirical_errors: tuple[float, ...]
    chosen: str  # "lognormal" or "empirical"

    @property
    def dist(self) -> LengthDist:
        return self.lognormal if self.chosen == "lognormal" else self.empirical

    def __str__(self) -> str:
        qs = ", ".join(f"p{round(q * 100)} {v:g}" for q, v in zip(CHECK_QUANTILES, self.trace_quantiles, strict=True))
        ln = ", ".join(f"{e:+.1%}" for e in self.lognormal_errors)
        em = ", ".join(f"{e:+.1%}" for e in self.empirical_errors)
        return (
            f"{self.what}: trace {qs}\n"
            f"  lognormal mu {self.mu:.3f} sigma {self.sigma:.3f}, KS {self.ks_lognormal:.3f}; "
            f"regenerated p50/p90/p99 off by {ln}\n"
            f"  empirical ({len(self.empirical.quantiles)} quantiles): off by {em}\n"
            f"  spec uses: {self.chosen}"
        )


def _regen_errors(dist: LengthDist, target: tuple[float, ...], seed: int) -> tuple[float, ...]:
    x = dist.sample(_CHECK_SAMPLES, np.random.default_rng(seed))
    got = np.quantile(x, CHECK_QUANTILES)
    return tuple(float(g / t - 1.0) for g, t in zip(got, target, strict=True))


def fit_lengths(x: np.ndarray, what: str, *, choose: str = "auto", seed: int = 0) -> LengthFit:
    if choose not in ("auto", "lognormal", "empirical"):
        raise SpecError("lengths", choose, "must be auto, lognormal or empirical")
    x = np.asarray(x, dtype=np.float64)
    lo, hi = int(x.min()), int(x.max())
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    ks = float(stats.kstest(x, stats.lognorm(s=max(sigma, 1e-9), scale=math.exp(mu)).cdf).statistic)
    target = tuple(float(v) for v in np.quantile(x, CHECK_QUANTILES))
    lognormal = LogNormalLength.from_mu_sigma(mu, sigma, lo, hi)
    table = [(float(q), round(float(v), 2)) for q, v in zip(_GRID, np.quantile(x, _GRID), strict=True)]
    empirical = EmpiricalLength(quantiles=tuple(table), min_len=lo, max_len=hi)
    ln_err = _regen_errors(lognormal, target, seed)
    em_err = _regen_errors(empirical, target, seed)
    if choose == "auto":
        choose = "lognormal" if max(abs(e) for e in ln_err) <= TOLERANCE else "empirical"
    return LengthFit(what, target, mu, sigma, ks, lognormal, empirical, ln_err, em_err, choose)


def fit_arrivals(t: np.ndarray) -> ArrivalFit:
    t = np.sort(np.asarray(t, dtype=np.float64))
    if len(t) < 3 or t[-1] <= t[0]:
        raise UsageError("fitting arrivals needs at least 3 requests at distinct times")
    gaps = np.diff(t)
    rate = (len(t) - 1) / float(t[-1] - t[0])
    cv_mom = float(gaps.std() / gaps.mean())
    pos = gaps[gaps > 0]
    if len(pos) >= 2 and pos.std() > 0:
        shape, _, scale = stats.gamma.fit(pos, floc=0)
        ks = float(stats.kstest(pos, stats.gamma(shape, scale=scale).cdf).statistic)
        cv_mle = 1.0 / math.sqrt(shape)
    else:  # evenly spaced: a constant process is the honest fit
        cv_mle, ks = 1e-3, 0.0
    span = float(t[-1] - t[0])
    if span >= 120:
        counts = np.bincount(((t - t[0]) // 60).astype(np.int64))[: int(span // 60)]
        disp = float(counts.var() / counts.mean()) if counts.mean() > 0 else math.nan
    else:
        disp = math.nan
    return ArrivalFit(rate, cv_mom, cv_mle, ks, disp)


@dataclass(frozen=True, slots=True)
class TraceFit:
    trace_name: str
    trace_path: str
    num_requests: int
    span_s: float
    arrival: ArrivalFit
    input: LengthFit
    output: LengthFit

    def spec(self) -> WorkloadSpec:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.trace_name).strip("-") or "fitted"
        return WorkloadSpec(
            name=name,
            description=f"fitted to {self.trace_name}: {self.num_requests} requests over {self.span_s:.0f} s",
            input=self.input.dist,
            output=self.output.dist,
            arrival=GammaArrivals(round(self.arrival.rate_rps, 6), round(self.arrival.gap_cv_gamma_mle, 4)),
            num_requests=self.num_requests,
        )

    def report(self) -> str:
        return "\n".join([
            f"{self.trace_path}: {self.num_requests} requests over {self.span_s:.1f} s",
            str(self.arrival), str(self.input), str(self.output),
        ])  # fmt: skip

    def to_toml(self) -> str:
        header = [
            f"Fitted by `slobench workload fit` to {self.trace_path}.",
            *self.report().splitlines()[1:],
            "A gamma renewal process holds the gaps' bulk, not long pauses or rate swings: replay the",
            "trace itself (slobench run --trace) when those matter.",
        ]
        return dumps_toml(self.spec().to_dict(), header)


def fit_trace(trace: Trace, *, choose: str = "auto", seed: int = 0) -> TraceFit:
    return TraceFit(
        trace.name, trace.path, len(trace.entries), trace.span_s, fit_arrivals(trace.arrival_s),
        fit_lengths(trace.input_tokens, "input", choose=choose, seed=seed),
        fit_lengths(trace.output_tokens, "output", choose=choose, seed=seed + 1),
    )  # fmt: skip


# ---- a small TOML writer (what WorkloadSpec.to_dict produces; no dates, no nulls) ----------------------

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) + '"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _emit(path: list[str], d: dict[str, Any], out: list[str]) -> None:
    for k, v in d.items():
        if v is None or isinstance(v, dict) or _is_table_array(v):
            continue
        out.append(f"{_key(k)} = {_value(v)}")
    for k, v in d.items():
        sub = [*path, _key(k)]
        if isinstance(v, dict):
            out += ["", f"[{'.'.join(sub)}]"]
            _emit(sub, v, out)
        elif _is_table_array(v):
            for item in v:
                out += ["", f"[[{'.'.join(sub)}]]"]
                _emit(sub, item, out)


def dumps_toml(d: dict[str, Any], comments: list[str] | tuple[str, ...] = ()) -> str:
    """TOML text for a dict of scalars, lists, tables and arrays of tables, with leading comment lines."""
    out = [f"# {c}".rstrip() for c in comments]
    _emit([], d, out)
    return "\n".join(out) + "\n"
