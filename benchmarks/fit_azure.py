"""Fit the bundled workload shapes to the Azure LLM inference traces (2023 sample).

Prints, per trace: request count and rate, the inter-arrival gaps' CV, and the prompt and output length
quantiles beside a lognormal fitted by median and p99 (what workloads/chat.toml and code.toml use) and by
maximum likelihood, with each fit's Kolmogorov–Smirnov distance; ends with the TOML lines to paste.
Data: Azure Public Dataset (CC-BY-4.0; Patel et al., "Splitwise", ISCA 2024), read from
../shared/traces/azure-llm-2023/ or a path argument, never copied into the repo.

    .venv/bin/python benchmarks/fit_azure.py [TRACE_DIR]"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

Z99 = 2.3263478740408408
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"
TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}


def load(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first request, prompt tokens, output tokens)."""
    stamps: list[str] = []
    ins: list[int] = []
    outs: list[int] = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            # Seven fractional digits; datetime64 takes at most microseconds, so cut the last one.
            stamps.append(row["TIMESTAMP"].strip().replace(" ", "T")[:26])
            ins.append(int(row["ContextTokens"]))
            outs.append(int(row["GeneratedTokens"]))
    t = np.array(stamps, dtype="datetime64[us]")
    t_s = (t - t.min()).astype(np.int64) / 1e6
    order = np.argsort(t_s, kind="stable")
    return t_s[order], np.array(ins)[order], np.array(outs)[order]


def lognormal_fits(x: np.ndarray) -> dict[str, float]:
    x = x[x > 0]
    median = float(np.median(x))
    p99 = float(np.quantile(x, 0.99))
    sigma_q = (math.log(p99) - math.log(median)) / Z99
    logs = np.log(x)
    mu_ml, sigma_ml = float(logs.mean()), float(logs.std())
    ks_q = stats.kstest(x, stats.lognorm(s=sigma_q, scale=median).cdf).statistic
    ks_ml = stats.kstest(x, stats.lognorm(s=sigma_ml, scale=math.exp(mu_ml)).cdf).statistic
    return {
        "n": len(x),
        "mean": float(x.mean()),
        "p10": float(np.quantile(x, 0.10)),
        "median": median,
        "p90": float(np.quantile(x, 0.90)),
        "p99": p99,
        "max": float(x.max()),
        "sigma_q": sigma_q,
        "ks_q": float(ks_q),
        "mu_ml": mu_ml,
        "sigma_ml": sigma_ml,
        "median_ml": math.exp(mu_ml),
        "p99_ml": math.exp(mu_ml + Z99 * sigma_ml),
        "ks_ml": float(ks_ml),
    }


def main(argv: list[str]) -> int:
    trace_dir = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    if not trace_dir.is_dir():
        print(f"trace directory not found: {trace_dir}", file=sys.stderr)
        return 2
    snippets: list[str] = []
    for name, fname in TRACES.items():
        t_s, ins, outs = load(trace_dir / fname)
        gaps = np.diff(t_s)
        span_s = float(t_s[-1] - t_s[0])
        cv = float(gaps.std() / gaps.mean())
        print(f"== {name}: {fname}")
        print(f"  requests {len(t_s)}  span {span_s:.0f} s  rate {len(t_s) / span_s:.2f} req/s")
        body = gaps[gaps < np.quantile(gaps, 0.99)]
        cv_body = float(body.std() / body.mean())
        print(
            f"  gaps: mean {gaps.mean() * 1e3:.1f} ms  p50 {np.median(gaps) * 1e3:.1f} ms  max {gaps.max():.1f} s  "
            f"cv {cv:.2f}  cv without the longest 1% {cv_body:.2f}"
        )
        print(
            f"  {'':7} {'n':>6} {'mean':>7} {'p10':>6} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6} "
            f"| sigma(q) KS(q) | mu(ml) sigma(ml) p50(ml) p99(ml) KS(ml)"
        )
        fits = {}
        for label, x in (("input", ins), ("output", outs)):
            f = lognormal_fits(x)
            fits[label] = f
            print(
                f"  {label:7} {f['n']:6d} {f['mean']:7.0f} {f['p10']:6.0f} {f['median']:6.0f} {f['p90']:6.0f} "
                f"{f['p99']:6.0f} {f['max']:6.0f} | {f['sigma_q']:8.3f} {f['ks_q']:5.3f} | "
                f"{f['mu_ml']:6.3f} {f['sigma_ml']:9.3f} {f['median_ml']:7.0f} {f['p99_ml']:7.0f} {f['ks_ml']:6.3f}"
            )
        snippets.append(
            f"# {name}: rate {len(t_s) / span_s:.2f} req/s, gap cv {cv:.2f} ({cv_body:.2f} without the longest 1%)\n"
            f'[input]\ndist = "lognormal"\nmedian = {fits["input"]["median"]:.0f}\np99 = {fits["input"]["p99"]:.0f}\n'
            f'[output]\ndist = "lognormal"\nmedian = {fits["output"]["median"]:.0f}\np99 = {fits["output"]["p99"]:.0f}\n'
        )
        print()
    print("== TOML (lognormal by median and p99)")
    print("\n".join(snippets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
