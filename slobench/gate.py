"""The CI regression gate: compare a candidate with a baseline, metric by metric, with a verdict per metric.

Either side is one or more files, merged: a capacity result, sweeps at the same rates (one seed each), a
run directory, or a committed baseline file (kind "baseline"). Each becomes `Samples`: per metric key
(`capacity`, `attainment@4`, `ttft.p99@4`) the replicate values by seed. A metric regresses only with both
a practical change beyond its threshold and statistical evidence (as asv and Bencher, NOTES-statistics):
  regression    degradation beyond the threshold, and a one-sided t-test (paired over common seeds, else
                Welch) says it is > 0 at alpha (default 0.01)
  pass          the degradation's upper bound at `pass_confidence` (default 90%) is within the threshold
  inconclusive  neither; a power calculation (80%) says how many replicates per side would decide it
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from slobench.analysis.summary import as_run_summary
from slobench.errors import SpecError, UsageError
from slobench.run.rundir import (
    BASELINE,
    CAPACITY,
    MANIFEST,
    SCHEMA_VERSION,
    SUMMARY,
    SWEEP,
    check_capacity,
    check_manifest,
    check_schema,
    check_sweep,
    read_json,
    read_manifest,
    read_summary,
)
from slobench.tune.gate_source import best_capacity_dir

BASELINE_KIND = "baseline"
EXIT_PASS, EXIT_REGRESSION, EXIT_INCONCLUSIVE = 0, 1, 4
POWER = 0.8

# Metrics where more is better; every other metric (latencies) is better lower.
HIGHER_IS_BETTER = ("capacity", "attainment", "good_throughput", "throughput", "session_attainment")
# Options that change which requests a run sends: part of the workload's identity.
WORKLOAD_OPTIONS = ("num_requests", "duration_s", "input_len", "output_len", "warmup")


# --- one side of a comparison ------------------------------------------------------------------------


@dataclass(slots=True)
class Samples:
    source: str
    workload: dict[str, Any]  # {"name", "hash", "spec"}
    slo: dict[str, Any] | None
    slobench_version: str
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)  # key -> {seed: value}
    inconclusive: dict[str, str] = field(default_factory=dict)  # key -> why it has no values (a capacity search's)

    def add(self, key: str, seed: int, value: float | None, where: str) -> None:
        if value is None or not math.isfinite(value):
            return
        per = self.metrics.setdefault(key, {})
        if seed in per and per[seed] != value:
            raise UsageError(f"{where}: two values for {key} with seed {seed} (the same run given twice?)")
        per[seed] = float(value)

    def to_baseline(self) -> dict[str, Any]:
        return {
            "kind": BASELINE_KIND,
            "schema_version": SCHEMA_VERSION,
            "slobench_version": self.slobench_version,
            "workload": self.workload,
            "slo": self.slo,
            "metrics": {
                k: {"replicates": [{"seed": s, "value": v} for s, v in sorted(per.items())]}
                for k, per in sorted(self.metrics.items())
            },
        }


def workload_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """Name, spec and a short hash of what decides the requests sent (the offered rate excepted)."""
    spec = manifest.get("workload")
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if k != "description"}
        arrival = spec.get("arrival")
        if isinstance(arrival, dict):  # the rate is the probe's variable, not the workload's identity
            spec["arrival"] = {k: v for k, v in arrival.items() if k != "rate_rps"}
    opts = manifest.get("options") or {}
    ident = {"spec": spec, **{k: opts.get(k) for k in WORKLOAD_OPTIONS if opts.get(k) is not None}}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"name": manifest.get("workload_name") or (spec or {}).get("name"), "hash": digest, "spec": ident}


def rate_key(metric: str, rate_rps: float) -> str:
    return f"{metric}@{rate_rps:.4g}"


def load_samples(paths: Sequence[str | Path]) -> Samples:
    """Read and merge result files. A directory stands for the capacity.json or sweep.json inside it."""
    if not paths:
        raise UsageError("no input files given")
    merged: Samples | None = None
    for raw in paths:
        raw = best_capacity_dir(Path(raw)) or raw  # a tune directory: its best configuration's search
        run_doc = _single_run_doc(Path(raw))
        path = Path(raw) if run_doc is not None else result_file(Path(raw))
        s = _load_one(path, run_doc if run_doc is not None else _read_doc(path))
        if merged is None:
            merged = s
            continue
        refuse_mismatch(merged, s)
        for key, per in s.metrics.items():
            for seed, v in per.items():
                merged.add(key, seed, v, str(path))
        merged.source += f", {s.source}"
    assert merged is not None
    return merged


def _single_run_doc(path: Path) -> dict[str, Any] | None:
    """A run directory (summary.json beside manifest.json, no sweep or capacity file) as a one-point sweep."""
    if not path.is_dir() or any((path / n).is_file() for n in (CAPACITY, SWEEP, BASELINE)):
        return None
    if not ((path / SUMMARY).is_file() and (path / MANIFEST).is_file()):
        return None
    manifest, summary = read_manifest(path), read_summary(path)
    rate = manifest.get("rate_rps")
    if not isinstance(rate, int | float) or summary is None:
        raise UsageError(f"{path}: a run directory without its offered rate (manifest rate_rps) or summary")
    return {"kind": "sweep", "manifest": manifest, "runs": [{"rate_rps": rate, "summary": summary}]}


def result_file(path: Path) -> Path:
    """A result file as given, or the capacity.json, sweep.json or baseline.json a directory holds."""
    if path.is_dir():
        for name in (CAPACITY, SWEEP, BASELINE):
            if (path / name).is_file():
                return path / name
            if (path / name).exists():
                raise UsageError(f"{path / name}: is a directory, not a file")
        raise UsageError(f"{path}: a directory with no {CAPACITY}, {SWEEP}, {BASELINE} or run summary in it")
    return path


def _read_doc(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("kind") not in ("capacity", "sweep", BASELINE_KIND):
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"{path}: not a capacity result, sweep or baseline file (kind {kind!r})")
    check_schema(path, doc)
    if doc["kind"] == "sweep":
        return check_sweep(path, doc, run_dirs=False)
    return check_capacity(path, doc, run_dirs=False) if doc["kind"] == "capacity" else doc


def _load_one(path: Path, doc: dict[str, Any]) -> Samples:
    try:
        if doc["kind"] == BASELINE_KIND:
            slo = doc.get("slo")
            if not isinstance(doc["workload"], dict) or (slo is not None and not isinstance(slo, dict)):
                raise TypeError("workload must be an object, slo an object or null")
            s = Samples(str(path), doc["workload"], doc.get("slo"), str(doc.get("slobench_version", "?")))
            for key, m in doc["metrics"].items():
                for r in m["replicates"]:
                    s.add(key, int(r["seed"]), float(r["value"]), str(path))
            return s
        manifest = check_manifest(path, doc["manifest"])
        s = Samples(str(path), workload_identity(manifest), manifest.get("slo"),
                    str(manifest.get("slobench_version", "?")))
        if doc["kind"] == "sweep":
            seed = int(manifest.get("seed", 0))
            for i, row in enumerate(doc["runs"]):
                try:
                    summary = as_run_summary(row["summary"])
                except UsageError as e:
                    raise UsageError(f"{path}: runs[{i}]: {e}") from None
                for name, v in summary.flat_metrics().items():
                    s.add(rate_key(name, float(row["rate_rps"])), seed, v, str(path))
            return s
        if doc.get("inconclusive"):  # its per-seed crossings are what made it inconclusive: never gate on them
            s.inconclusive["capacity"] = str(doc["inconclusive"])
        else:
            for rep in doc.get("replicates") or []:
                if rep.get("capacity_rps") is not None:
                    s.add("capacity", int(rep["seed"]), float(rep["capacity_rps"]), str(path))
        for p in doc.get("probes") or []:
            if p.get("phase") == "replicate":
                for name, v in (p.get("metrics") or {}).items():
                    s.add(rate_key(name, float(p["rate_rps"])), int(p["seed"]), v, str(path))
        return s
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise UsageError(f"{path}: corrupt {doc.get('kind')} file ({type(e).__name__}: {e})") from None


def refuse_mismatch(base: Samples, cand: Samples) -> None:
    """Results of different workloads or SLOs are not comparable: say exactly what differs."""
    diffs: list[str] = []
    bw, cw = base.workload, cand.workload
    if bw.get("name") != cw.get("name"):
        diffs.append(f"workload name {bw.get('name')!r} vs {cw.get('name')!r}")
    if bw.get("hash") != cw.get("hash"):
        fields = _dict_diff(bw.get("spec") or {}, cw.get("spec") or {})
        detail = "; ".join(fields[:6]) if fields else "contents"
        diffs.append(f"workload {detail} (hash {bw.get('hash')} vs {cw.get('hash')})")
    if _slo_key(base.slo) != _slo_key(cand.slo):
        fields = _dict_diff(_slo_key(base.slo) or {}, _slo_key(cand.slo) or {})
        diffs.append("SLO " + ("; ".join(fields) if fields else f"{base.slo} vs {cand.slo}"))
    if diffs:
        raise UsageError(
            f"refusing to compare {base.source} with {cand.source}: " + "; ".join(diffs)
        )


def _slo_key(slo: dict[str, Any] | None) -> dict[str, Any] | None:
    if slo is None:
        return None
    return {k: slo.get(k) for k in ("ttft_s", "ttfa_s", "tpot_s", "e2e_s", "session_s", "target", "clock")}


def _dict_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k), b.get(k)
        name = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, name + ".")
        elif va != vb:
            out.append(f"{name} {va!r} vs {vb!r}")
    return out


# --- thresholds ------------------------------------------------------------------------------------------

_THRESH_RE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:@[0-9.eE+-]+)?)\s*=\s*([0-9]*\.?[0-9]+)\s*(%|pt|ms|s|rps)?\s*$")


@dataclass(frozen=True, slots=True)
class Threshold:
    metric: str  # "capacity", "attainment@4", "ttft.p99" (no @: every rate both sides measured)
    direction: Literal["drop", "rise"]  # which way is bad
    amount: float  # relative fraction for "%", else absolute in the metric's unit
    is_relative: bool
    text: str

    def __post_init__(self) -> None:
        if not self.amount >= 0:
            raise SpecError(f"--max-{self.direction}", self.text, "threshold must be >= 0")

    @classmethod
    def parse(cls, text: str, direction: Literal["drop", "rise"]) -> Threshold:
        m = _THRESH_RE.match(text)
        if not m:
            raise SpecError(f"--max-{direction}", text, "expected METRIC=AMOUNT, e.g. capacity=5% or attainment@4=2pt")
        metric, num, unit = m.group(1), float(m.group(2)), m.group(3) or ""
        if unit == "%":
            return cls(metric, direction, num / 100, True, text.strip())
        if unit == "pt":
            return cls(metric, direction, num / 100, False, text.strip())  # points of a fraction
        scale = {"ms": 1e-3, "s": 1.0, "rps": 1.0, "": 1.0}[unit]
        return cls(metric, direction, num * scale, False, text.strip())

    def describe(self) -> str:
        return f"max {self.direction} {self.text.split('=', 1)[1].strip()}"


def default_thresholds(base: Samples, cand: Samples) -> list[Threshold]:
    """What to check when no threshold is named: capacity -5%, attainment -2pt, TTFT/TPOT p99 +10%, the time
    to the first answer's p99 +10% where both sides measured reasoning answers, and the session SLO's
    attainment -2pt where both sides ran sessions under an SLO."""
    common = (set(base.metrics) | set(base.inconclusive)) & (set(cand.metrics) | set(cand.inconclusive))
    out = []
    if "capacity" in common:
        out.append(Threshold.parse("capacity=5%", "drop"))
    for name, t, d in (("attainment", "2pt", "drop"), ("ttft.p99", "10%", "rise"), ("tpot.p99", "10%", "rise"),
                       ("ttfa.p99", "10%", "rise"), ("session_attainment", "2pt", "drop")):
        if any(k.startswith(name + "@") for k in common):
            out.append(Threshold.parse(f"{name}={t}", d))  # type: ignore[arg-type]
    return out


def expand(th: Threshold, base: Samples, cand: Samples) -> list[str]:
    """The metric keys one threshold applies to; UsageError naming what is missing."""
    if "@" in th.metric or th.metric == "capacity":
        key = th.metric
        if "@" in key:  # normalise the rate's spelling (attainment@4.0 == attainment@4)
            name, rate = key.split("@", 1)
            try:
                key = rate_key(name, float(rate))
            except ValueError:
                raise SpecError(f"--max-{th.direction}", th.text, "the rate after @ must be a number") from None
        for side, s in (("baseline", base), ("candidate", cand)):
            if key not in s.metrics and key not in s.inconclusive:
                raise UsageError(f"{th.metric}: not in the {side} ({s.source}); it has {_available(s)}")
        return [key]
    keys = sorted(
        (k for k in set(base.metrics) & set(cand.metrics) if k.split("@", 1)[0] == th.metric),
        key=lambda k: float(k.split("@", 1)[1]),
    )
    if not keys:
        raise UsageError(
            f"{th.metric}: no offered rate measured by both baseline and candidate "
            f"(baseline has {_available(base)}; candidate has {_available(cand)}). Compare at the same rates "
            f"(capacity --rates R1,R2 or sweeps at the same rates), or gate on capacity."
        )
    return keys


def _available(s: Samples) -> str:
    keys = sorted(s.metrics)
    shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
    return shown or "no metrics"


# --- the test ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    key: str
    threshold: str
    verdict: Literal["pass", "regression", "inconclusive"]
    baseline_mean: float
    candidate_mean: float
    change: float  # degradation in the threshold's terms (relative fraction or absolute); > 0 is worse
    limit: float
    p_value: float
    upper_bound: float
    num_baseline: int
    num_candidate: int
    is_paired: bool
    more_replicates: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_metric(
    key: str, th: Threshold, base: dict[int, float], cand: dict[int, float], *,
    alpha: float = 0.01, pass_confidence: float = 0.9,
) -> Check:
    from scipy import stats

    b_mean = float(np.mean(list(base.values())))
    c_mean = float(np.mean(list(cand.values())))
    sign = 1.0 if th.direction == "drop" else -1.0  # degradation = sign * (baseline - candidate)
    scale = abs(b_mean) if th.is_relative else 1.0
    if scale == 0:
        scale = 1.0
    common = sorted(set(base) & set(cand))
    paired = len(common) >= 2
    if paired:
        d = np.array([sign * (base[s] - cand[s]) / scale for s in common])
        est, n = float(d.mean()), len(d)
        sd = float(d.std(ddof=1))
        se, df = sd / math.sqrt(n), float(n - 1)
        n_b = n_c = n
    else:
        b = np.array(list(base.values())) / scale
        c = np.array(list(cand.values())) / scale
        est = float(sign * (b.mean() - c.mean()))
        n_b, n_c = len(b), len(c)
        vb = b.var(ddof=1) if n_b > 1 else float("nan")
        vc = c.var(ddof=1) if n_c > 1 else float("nan")
        se = float(math.sqrt(vb / n_b + vc / n_c))
        sd = float(math.sqrt((vb + vc) / 2))
        df = float((vb / n_b + vc / n_c) ** 2 / ((vb / n_b) ** 2 / (n_b - 1) + (vc / n_c) ** 2 / (n_c - 1))
                   if se > 0 else 1.0)
    limit = th.amount
    if math.isnan(se):
        p = float("nan")
        ub = float("inf")
    elif se == 0:
        p = 0.0 if est > 0 else 1.0
        ub = est
    else:
        p = float(stats.t.sf(est / se, df))
        ub = est + float(stats.t.ppf(pass_confidence, df)) * se
    more: int | None = None
    change_txt = _fmt_change(est, th)
    if est > limit and p < alpha:
        verdict: Literal["pass", "regression", "inconclusive"] = "regression"
        msg = f"{key}: {change_txt} worse, beyond the {th.describe()} (p={p:.2g} < {alpha:g})"
    elif ub <= limit:
        verdict = "pass"
        msg = f"{key}: {change_txt} {'worse' if est > 0 else 'better'}; within the {th.describe()}"
    else:
        verdict = "inconclusive"
        needed = _replicates_needed(est, limit, sd, alpha, pass_confidence, paired)
        have = min(n_b, n_c)
        if needed is None:
            msg = (f"{key}: {change_txt} {'worse' if est > 0 else 'better'} from {have} replicate(s) a side: no spread "
                   f"to test with; run at least 5 replicates per side")
            more = max(5 - have, 1)
        else:
            more = max(needed - have, 1)
            why = (f"beyond the {th.describe()} but not significant (p={p:.2g} >= {alpha:g})" if est > limit
                   else f"within the {th.describe()} but the {pass_confidence:.0%} upper bound "
                        f"{_fmt_change(ub, th)} is not")
            msg = (f"{key}: {change_txt} {'worse' if est > 0 else 'better'}, {why}; about {needed} replicates "
                   f"per side ({more} more) would decide it at this effect and spread")
    return Check(key, th.text, verdict, b_mean, c_mean, est, limit, p, ub, n_b, n_c, paired, more, msg)


def _fmt_change(x: float, th: Threshold) -> str:
    if th.is_relative:
        return f"{abs(x) * 100:.1f}%"
    if th.metric.startswith(("attainment", "session_attainment")):
        return f"{abs(x) * 100:.1f}pt"
    return f"{abs(x):.4g}"


def _replicates_needed(
    est: float, limit: float, sd: float, alpha: float, pass_confidence: float, paired: bool
) -> int | None:
    """Replicates per side for 80% power, from the observed effect and spread (normal approximation,
    then grown until the t quantiles agree)."""
    from scipy import stats

    if not (math.isfinite(sd) and sd > 0):
        return None
    if est > limit:  # show the degradation is > 0 (the practical part already holds)
        gap, q = est, 1 - alpha
    else:  # show the degradation is below the limit
        gap, q = limit - est, pass_confidence
    if gap <= 0:
        return None
    factor = 1 if paired else 2  # a difference of two independent means has twice the variance
    for n in range(2, 10_000):
        df = n - 1 if paired else 2 * n - 2
        if (stats.t.ppf(q, df) + stats.t.ppf(POWER, df)) * sd * math.sqrt(factor / n) <= gap:
            return n
    return 10_000


@dataclass(frozen=True, slots=True)
class GateResult:
    baseline: str
    candidate: str
    checks: list[Check]

    @property
    def verdict(self) -> str:
        vs = {c.verdict for c in self.checks}
        return "regression" if "regression" in vs else "inconclusive" if "inconclusive" in vs else "pass"

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "regression": EXIT_REGRESSION, "inconclusive": EXIT_INCONCLUSIVE}[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "gate", "verdict": self.verdict, "exit_code": self.exit_code, "baseline": self.baseline,
                "candidate": self.candidate, "checks": [c.to_dict() for c in self.checks]}


def gate(
    base: Samples, cand: Samples, thresholds: Iterable[Threshold] = (), *,
    alpha: float = 0.01, pass_confidence: float = 0.9,
) -> GateResult:
    if not 0 < alpha < 0.5:
        raise SpecError("alpha", alpha, "must be in (0, 0.5)")
    if not 0.5 < pass_confidence < 1:
        raise SpecError("pass_confidence", pass_confidence, "must be in (0.5, 1)")
    refuse_mismatch(base, cand)
    ths = list(thresholds) or default_thresholds(base, cand)
    if not ths:
        raise UsageError(
            f"nothing to compare: no metric measured by both {base.source} and {cand.source} "
            f"(baseline has {_available(base)}; candidate has {_available(cand)})"
        )
    checks = [
        unmeasured(key, th, base, cand) if key in base.inconclusive or key in cand.inconclusive else
        compare_metric(key, th, base.metrics[key], cand.metrics[key], alpha=alpha, pass_confidence=pass_confidence)
        for th in ths
        for key in expand(th, base, cand)
    ]
    return GateResult(base.source, cand.source, checks)


def unmeasured(key: str, th: Threshold, base: Samples, cand: Samples) -> Check:
    """An inconclusive check for a metric one side could not measure (a capacity search that located no
    capacity): no verdict on it can be a pass."""
    why = "; ".join(f"{side}: {s.inconclusive[key]}" for side, s in (("baseline", base), ("candidate", cand))
                    if key in s.inconclusive)
    nan = float("nan")
    return Check(key, th.text, "inconclusive", nan, nan, nan, th.amount, nan, nan,
                 len(base.metrics.get(key, {})), len(cand.metrics.get(key, {})), False, None,
                 f"{key}: not measured ({why})")


# --- reports for CI ------------------------------------------------------------------------------------


def junit_xml(res: GateResult) -> str:
    """One testcase per metric; a <failure> for a regression, <skipped> for an inconclusive one."""
    import xml.etree.ElementTree as ET

    failures = sum(c.verdict == "regression" for c in res.checks)
    skipped = sum(c.verdict == "inconclusive" for c in res.checks)
    suites = ET.Element("testsuites", name="slobench gate", tests=str(len(res.checks)), failures=str(failures))
    suite = ET.SubElement(
        suites, "testsuite", name="slobench.gate", tests=str(len(res.checks)), failures=str(failures),
        errors="0", skipped=str(skipped),
    )
    for c in res.checks:
        case = ET.SubElement(suite, "testcase", classname="slobench.gate", name=f"{c.key} ({c.threshold})")
        if c.verdict == "regression":
            ET.SubElement(case, "failure", message=c.message, type="regression").text = _details(c)
        elif c.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=c.message)
        ET.SubElement(case, "system-out").text = _details(c)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _details(c: Check) -> str:
    return (
        f"baseline mean {c.baseline_mean:.6g} (n={c.num_baseline}), candidate mean {c.candidate_mean:.6g} "
        f"(n={c.num_candidate}), {'paired by seed' if c.is_paired else 'unpaired (Welch)'}, "
        f"degradation {c.change:+.4g} vs limit {c.limit:.4g}, p={c.p_value:.3g}, upper bound {c.upper_bound:.4g}"
    )


def _cell(x: float, fmt: str) -> str:
    return "–" if math.isnan(x) else format(x, fmt)


_ICON = {"pass": "✅ pass", "regression": "❌ regression", "inconclusive": "⚠️ inconclusive"}


def markdown(res: GateResult) -> str:
    lines = [
        f"### slobench gate: {_ICON[res.verdict]}",
        "",
        f"baseline `{res.baseline}` · candidate `{res.candidate}`",
        "",
        "| metric | threshold | baseline | candidate | change | p | n (b/c) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in res.checks:
        rel = (c.candidate_mean - c.baseline_mean) / c.baseline_mean if c.baseline_mean else float("nan")
        p = "–" if math.isnan(c.p_value) else f"{c.p_value:.2g}"
        pair = " paired" if c.is_paired else ""
        lines.append(
            f"| `{c.key}` | {c.threshold} | {_cell(c.baseline_mean, '.4g')} | {_cell(c.candidate_mean, '.4g')} "
            f"| {_cell(rel * 100, '+.1f')}% "
            f"| {p} | {c.num_baseline}/{c.num_candidate}{pair} | {_ICON[c.verdict]} |"
        )
    notes = [c.message for c in res.checks if c.verdict != "pass"]
    if notes:
        lines += [""] + [f"- {m}" for m in notes]
    return "\n".join(lines) + "\n"
