"""Fit a workload spec to a trace: arrivals that keep the trace's burstiness (a rate curve, or a gamma
renewal process), token lengths (lognormal or an empirical table), request classes from the trace's tags,
and shared-prefix groups from its `hash_ids`. `fit_trace` says how each is fitted."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats

from slobench.errors import SpecError, UsageError
from slobench.workload.arrivals import ArrivalProcess, GammaArrivals
from slobench.workload.lengths import EmpiricalLength, LengthDist, LogNormalLength
from slobench.workload.phases import CurveArrivals, RequestClass
from slobench.workload.prefix_fit import PrefixFit, fit_prefix_groups, prompt_reuse
from slobench.workload.spec import WorkloadSpec, generate
from slobench.workload.traces import Trace

__all__ = ["ArrivalFit", "LengthFit", "TraceFit", "dispersion", "dumps_toml", "fit_rate_curve", "fit_trace"]

CHECK_QUANTILES = (0.5, 0.9, 0.99)
TOLERANCE = 0.10
_GRID = np.unique(np.concatenate([np.linspace(0, 1, 101), [0.001, 0.005, 0.995, 0.999]]))
_CHECK_SAMPLES = 200_000  # enough that the regenerated p99 is not itself noisy
MAX_CURVE_STEPS = 21_600  # six hours at one step per second; longer traces get wider steps
MIN_CLASS_REQUESTS = 20
ARRIVAL_MODELS = ("curve", "gamma")


def dispersion(t: np.ndarray, bin_s: float, span_s: float | None = None) -> float:
    """Variance / mean of the counts in consecutive `bin_s` bins from 0 over whole bins of `span_s`
    (default: the last arrival); nan with fewer than two bins."""
    span = float(t[-1]) if span_s is None else span_s
    num_bins = int(span // bin_s)
    if num_bins < 2:
        return math.nan
    counts = np.bincount((np.asarray(t) // bin_s).astype(np.int64), minlength=num_bins)[:num_bins]
    return float(counts.var() / counts.mean()) if counts.mean() > 0 else math.nan


@dataclass(frozen=True, slots=True)
class ArrivalFit:
    rate_rps: float
    gap_cv_moments: float
    gap_cv_gamma_mle: float
    ks_gamma: float
    dispersion_per_minute: float  # variance / mean of per-minute counts; nan when the trace is < 2 min
    dispersion_per_second: float = math.nan

    def __str__(self) -> str:
        d1, d60 = (("n/a" if math.isnan(d) else f"{d:.1f}") for d in (self.dispersion_per_second,
                                                                         self.dispersion_per_minute))
        return (
            f"arrivals: {self.rate_rps:.3f} req/s; gap CV {self.gap_cv_moments:.2f} (moments), "
            f"{self.gap_cv_gamma_mle:.2f} (gamma MLE, KS {self.ks_gamma:.3f}); "
            f"count variance/mean {d1} per second, {d60} per minute (1 = Poisson)"
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
    return ArrivalFit(rate, cv_mom, cv_mle, ks, dispersion(t - t[0], 60.0), dispersion(t - t[0], 1.0))


@dataclass(frozen=True, slots=True)
class CurveFit:
    """The modulated-Poisson rate curve (see `fit_trace`): one rate per `step_s` step."""

    step_s: float
    rates_rps: np.ndarray
    a: float  # weight of the minute-scale swings
    b: float  # weight of the step-scale swings within a minute

    def arrival(self) -> CurveArrivals:
        """Steps as a piecewise-linear curve: each run of equal rates is flat, with 1 µs ramps between;
        after the trace's span the rate is the mean."""
        r = np.round(self.rates_rps, 6)
        starts = np.flatnonzero(np.diff(r, prepend=np.nan))  # the first step of each run of equal rates
        ends = np.append(starts[1:], len(r))
        points: list[tuple[float, float]] = []
        for i, j in zip(starts.tolist(), ends.tolist(), strict=True):
            points += [(i * self.step_s, float(r[i])), (j * self.step_s - 1e-6, float(r[i]))]
        points.append((len(r) * self.step_s, round(float(self.rates_rps.mean()), 6)))
        return CurveArrivals(tuple(points))

    def __str__(self) -> str:
        return (f"arrival model: Poisson modulated by the trace's rate curve, {len(self.rates_rps)} steps of "
                f"{self.step_s:g} s (minute-scale weight a = {self.a:.3f}, within-minute b = {self.b:.3f})")


def fit_rate_curve(t: np.ndarray) -> CurveFit:
    """Per-step rates whose modulated Poisson process has the trace's count dispersion at one step and at
    60 steps (1 s and 1 min for traces up to MAX_CURVE_STEPS seconds)."""
    t = np.sort(np.asarray(t, dtype=np.float64))
    t = t - t[0]
    span = float(t[-1])
    if span <= 0:
        raise UsageError("fitting a rate curve needs arrivals at two or more distinct times")
    step = float(max(1, math.ceil(span / MAX_CURVE_STEPS)))
    num_steps = max(1, math.ceil(span / step))
    c = np.bincount(np.minimum((t // step).astype(np.int64), num_steps - 1), minlength=num_steps).astype(float)
    mu = float(c.mean())
    num_minutes = num_steps // 60
    m = np.repeat([c[i : i + 60].mean() for i in range(0, num_steps, 60)], 60)[:num_steps]
    if num_minutes >= 2:
        minutes = c[: num_minutes * 60].reshape(num_minutes, 60).sum(axis=1)
        var_min = float(minutes.var())
        d_min = var_min / float(minutes.mean())
        a2 = min(1.0, max(0.0, (d_min - 1.0) / d_min)) if d_min > 0 else 0.0
    else:  # under two minutes: no minute scale to keep
        m = np.full(num_steps, mu)
        var_min, a2 = 0.0, 0.0
    within = float(((c - m) ** 2).mean())
    d_step = float(c.var()) / mu
    b2 = (mu * (d_step - 1.0) - a2 * var_min / 3600.0) / within if within > 0 else 0.0
    a, b = math.sqrt(a2), math.sqrt(min(1.0, max(0.0, b2)))
    rates = np.maximum(mu + a * (m - mu) + b * (c - m), 0.0)
    rates *= mu / rates.mean()  # clipping at 0 must not move the mean
    return CurveFit(step, rates / step, a, b)


@dataclass(frozen=True, slots=True)
class ClassFit:
    name: str
    tags: tuple[str, ...]  # the trace tags it stands for ("other" gathers the small ones)
    num_requests: int
    input: LengthFit
    output: LengthFit

    def __str__(self) -> str:
        return (f"class {self.name}: {self.num_requests} requests; input p50/p99 "
                f"{self.input.trace_quantiles[0]:g}/{self.input.trace_quantiles[2]:g} ({self.input.chosen}), "
                f"output p50/p99 {self.output.trace_quantiles[0]:g}/{self.output.trace_quantiles[2]:g} "
                f"({self.output.chosen})")


def _class_name(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", tag).strip("-") or "untagged"


def fit_classes(trace: Trace, *, choose: str = "auto", seed: int = 0,
                ins: np.ndarray | None = None) -> tuple[ClassFit, ...]:
    """One class per tag with at least MIN_CLASS_REQUESTS requests, the rest as "other"; () when the trace
    has fewer than two such groups. `ins`: the input lengths to fit (default the trace's)."""
    tags = np.array([e.tag for e in trace.entries])
    names, counts = np.unique(tags, return_counts=True)
    big = [str(n) for n, k in zip(names, counts, strict=True) if k >= MIN_CLASS_REQUESTS]
    small = [str(n) for n, k in zip(names, counts, strict=True) if k < MIN_CLASS_REQUESTS]
    groups: list[tuple[str, tuple[str, ...]]] = [(_class_name(t), (t,)) for t in big]
    if sum(int(k) for n, k in zip(names, counts, strict=True) if str(n) in small) >= MIN_CLASS_REQUESTS:
        groups.append(("other", tuple(small)))
    if len(groups) < 2 or len({g for g, _ in groups}) != len(groups):
        return ()
    ins = trace.input_tokens if ins is None else ins
    outs = trace.output_tokens
    out: list[ClassFit] = []
    for i, (name, members) in enumerate(groups):
        sel = np.isin(tags, members)
        out.append(ClassFit(name, members, int(sel.sum()),
                            fit_lengths(ins[sel], f"{name} input", choose=choose, seed=seed + 2 + 2 * i),
                            fit_lengths(outs[sel], f"{name} output", choose=choose, seed=seed + 3 + 2 * i)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TraceFit:
    trace_name: str
    trace_path: str
    num_requests: int
    span_s: float
    arrival: ArrivalFit
    input: LengthFit
    output: LengthFit
    curve: CurveFit | None = None  # None: the gamma renewal process
    classes: tuple[ClassFit, ...] = ()
    comparison: tuple[str, ...] = ()  # trace against generated, filled by fit_trace
    prefix: PrefixFit | None = None  # shared-prefix groups from hash_ids

    def _arrival_process(self) -> ArrivalProcess:
        if self.curve is not None:
            return self.curve.arrival()
        return GammaArrivals(round(self.arrival.rate_rps, 6), round(self.arrival.gap_cv_gamma_mle, 4))

    def spec(self) -> WorkloadSpec:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.trace_name).strip("-") or "fitted"
        return WorkloadSpec(
            name=name,
            description=f"fitted to {self.trace_name}: {self.num_requests} requests over {self.span_s:.0f} s",
            input=self.input.dist,
            output=self.output.dist,
            arrival=self._arrival_process(),
            num_requests=self.num_requests,
            duration_s=round(self.span_s, 6) if self.curve is not None else None,
            classes=tuple(RequestClass(c.name, c.input.dist, c.output.dist) for c in self.classes),
            mix=tuple((c.name, float(c.num_requests)) for c in self.classes),
            system_prompts=self.prefix.prompts if self.prefix is not None else None,
        )

    def report(self) -> str:
        lines = [f"{self.trace_path}: {self.num_requests} requests over {self.span_s:.1f} s", str(self.arrival)]
        lines += [str(self.curve)] if self.curve is not None else [
            "arrival model: gamma renewal process (rate and gamma-MLE CV above)"]
        lines += [str(self.prefix)] if self.prefix is not None else []
        if self.prefix is not None:
            lines += ["input lengths below are each request's own part, beside its group's shared prefix"]
        lines += [str(self.input), str(self.output), *(str(c) for c in self.classes), *self.comparison]
        return "\n".join(lines)

    def to_toml(self) -> str:
        header = [
            f"Fitted by `slobench workload fit` to {self.trace_path}.",
            *self.report().splitlines()[1:],
        ]
        if self.curve is None:
            header += ["A gamma renewal process holds the gaps' bulk, not long pauses or rate swings: fit with",
                       "--arrivals curve, or replay the trace itself (slobench run --trace), when those matter."]
        return dumps_toml(self.spec().to_dict(), header)


def _quantiles(x: np.ndarray) -> str:
    return "/".join(f"{v:.0f}" for v in np.quantile(x, CHECK_QUANTILES)) if len(x) else "-"


def compare(trace: Trace, spec: WorkloadSpec, classes: tuple[ClassFit, ...], seed: int,
            prefix: PrefixFit | None = None) -> tuple[str, ...]:
    """Trace against one run generated from the spec (its own bounds, `seed`): what `fit` prints."""
    reqs = generate(spec, seed=seed, api="completions")
    g_t = np.array([r.arrival_s for r in reqs])
    g_in = np.array([r.input_tokens for r in reqs])
    g_out = np.array([r.max_tokens for r in reqs])
    t = trace.arrival_s
    span = float(t[-1] - t[0])

    def cv(x: np.ndarray) -> float:
        gaps = np.diff(x)
        return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else math.nan

    def off(a: float, b: float) -> str:
        return "" if not (math.isfinite(a) and math.isfinite(b) and a) else f"{b / a - 1:+.0%}"

    rows = [("requests", float(len(t)), float(len(g_t))),
            ("mean rate, req/s", len(t) / span if span else math.nan, len(g_t) / span if span else math.nan),
            ("gap CV", cv(t), cv(g_t)),
            ("dispersion, 1 s", dispersion(t - t[0], 1.0, span), dispersion(g_t, 1.0, span)),
            ("dispersion, 1 min", dispersion(t - t[0], 60.0, span), dispersion(g_t, 60.0, span))]
    out = [f"trace vs generated (seed {seed}, {len(g_t)} requests from the spec written):",
           f"  {'':<20}{'trace':>18}{'generated':>18}"]
    out += [f"  {k:<20}{a:>18.4g}{b:>18.4g}  {off(a, b)}" for k, a, b in rows]
    if prefix is not None:
        g = prompt_reuse(reqs, trace.block_tokens)
        t_r = prefix.trace
        out += [f"  {'prefix reuse share':<20}{t_r.share:>17.1%} {g.share:>17.1%}  {off(t_r.share, g.share)}",
                f"  {'requests reusing':<20}{t_r.num_requests_reusing / t_r.num_requests:>17.1%} "
                f"{g.num_requests_reusing / max(g.num_requests, 1):>17.1%}"]
    out += [f"  {'input p50/p90/p99':<20}{_quantiles(trace.input_tokens):>18}{_quantiles(g_in):>18}",
            f"  {'output p50/p90/p99':<20}{_quantiles(trace.output_tokens):>18}{_quantiles(g_out):>18}"]
    tags = np.array([e.tag for e in trace.entries])
    g_tags = np.array([r.tag.rsplit("/", 1)[-1] for r in reqs])
    for c in classes:
        sel, g_sel = np.isin(tags, c.tags), g_tags == c.name
        out += [f"  class {c.name}: share {sel.mean():.1%} vs {g_sel.mean():.1%}; input p50/p90/p99 "
                f"{_quantiles(trace.input_tokens[sel])} vs {_quantiles(g_in[g_sel])}; output "
                f"{_quantiles(trace.output_tokens[sel])} vs {_quantiles(g_out[g_sel])}"]
    return tuple(out)


def fit_trace(trace: Trace, *, choose: str = "auto", seed: int = 0, arrivals: str = "curve",
              check: bool = True) -> TraceFit:
    """Fit `trace`; with `check`, one run generated from the fitted spec is compared with the trace.

    Arrivals: the rate is the trace's mean ((n − 1) / span); the gaps' coefficient of variation is reported
    two ways, by moments (std/mean, dominated by a few long pauses) and by gamma maximum likelihood, with the
    Kolmogorov–Smirnov distance of the fitted gamma; and the index of dispersion (variance/mean of counts)
    per second and per minute (1 for Poisson; the Azure code trace is ~13 and ~160). A renewal process
    cannot hold those, so by default (`arrivals="curve"`) the spec's arrivals are a rate curve taken from the
    trace, one step per second, for a Poisson process modulated by it (thinning, `CurveArrivals`). The curve
    is not the trace's counts themselves, which would add Poisson noise on top of the trace's own: with c_s
    the count in second s, m_s its minute's mean count and μ the overall mean,

        rate_s = μ + a·(m_s − μ) + b·(c_s − m_s),   a² = (D_min − 1) / D_min,   b² from D_sec likewise,

    chosen so that the generated counts' dispersion equals the trace's at both 1 s and 1 min (to Poisson
    noise; `fit` prints trace against generated). Long traces get wider steps (at most `MAX_CURVE_STEPS`).
    `arrivals="gamma"` writes the compact gamma renewal process instead.

    Classes: when the trace's requests carry two or more tags (BurstGPT's model), each tag with at least
    `MIN_CLASS_REQUESTS` requests becomes a request class with its own fitted lengths, weighted by its share.

    Prefix reuse: a trace whose requests carry `hash_ids` (Mooncake) gets shared-prefix groups fitted from
    them (`slobench.workload.prefix_fit`): the spec's `system_prompts`, and input lengths that are each
    request's own part beside its group's prefix; `fit` prints the share of prompt tokens reused, trace
    against generated.

    Lengths: a lognormal by maximum likelihood on ln(tokens) with its KS distance, and an empirical inverse
    CDF through ~100 quantiles. `choose="auto"` writes the lognormal when regenerating from it lands p50,
    p90 and p99 within 10% of the trace's, else the empirical table (real traces are seldom lognormal in the
    tail: the Azure samples are not). The choice is printed and written as a comment in the spec.
    """
    if arrivals not in ARRIVAL_MODELS:
        raise SpecError("arrivals", arrivals, f"must be one of {list(ARRIVAL_MODELS)}")
    prefix = fit_prefix_groups(trace.entries, trace.block_tokens) if any(e.hash_ids for e in trace.entries) else None
    ins = trace.input_tokens if prefix is None else prefix.own_tokens
    fit = TraceFit(
        trace.name, trace.path, len(trace.entries), trace.span_s, fit_arrivals(trace.arrival_s),
        fit_lengths(ins, "input", choose=choose, seed=seed),
        fit_lengths(trace.output_tokens, "output", choose=choose, seed=seed + 1),
        fit_rate_curve(trace.arrival_s) if arrivals == "curve" else None,
        fit_classes(trace, choose=choose, seed=seed, ins=ins),
        prefix=prefix,
    )
    if not check:
        return fit
    return replace(fit, comparison=compare(trace, fit.spec(), fit.classes, seed, prefix))


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
        if isinstance(v, list | tuple) and len(v) > 8 and all(isinstance(x, list | tuple) for x in v):
            out.append(f"{_key(k)} = [\n" + "".join(f"  {_value(x)},\n" for x in v) + "]")  # a long curve
        else:
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
