"""Variants of calibrate's refinement, compared offline on the runs of one `validate_sim.py --repeat`.

Refits the refinement's factors (slobench.profiles.refine.fit_factors) on the first measurement of one
workload at three of its rates, with each variant of the fit, and scores every fitted profile, and the
probe fit alone, by validate_sim's targets on the runs it did not see: the other workload's two
measurements and this workload's second. No server, no new measurement. Variants: o held at the probes'
value or fitted; TTFT of the shorter and longer half of the prompts fitted beside the whole run's or not
(`RefinePlan.fit_overhead`, `by_prompt_length`). Figures: docs/measurements/refit_offline.md.

    python benchmarks/refit_offline.py runs/validate-YYYYMMDD-HHMMSS"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_sim  # noqa: E402  (the validated workloads, SLOs and engine limits)

from reference_engine.executor.modeled_executor import CostProfile  # noqa: E402
from slobench.analysis.slo import SLO  # noqa: E402
from slobench.cli.profile import live_setup  # noqa: E402
from slobench.fleet.simulate import simulate_records  # noqa: E402
from slobench.profiles.refine import (  # noqa: E402
    COEFFICIENTS,
    RefinePlan,
    fit_factors,
    median_prompt,
    percentiles,
)
from slobench.run.records import RequestRecord, RequestSpec  # noqa: E402
from slobench.run.rundir import load_run  # noqa: E402

VARIANTS = {"o fitted": (True, False, False), "o held": (False, False, False),
            "o fitted + TTFT by prompt length": (True, True, False), "o held + TTFT by prompt length": (False, True, False),
            "o fitted + r inside": (True, False, True)}
DEFAULT_VARIANTS = "o fitted,o held,o fitted + TTFT by prompt length,o held + TTFT by prompt length"


class Runs:
    """One validate_sim --repeat output directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        prov = json.loads((root / "calibrated.json").read_text()).get("provenance") or {}
        base = CostProfile.load(root / "calibrated.json")
        probe = prov.get("probe_fit")  # a refined calibrated.json (validate_sim's older layout) keeps it here
        if probe:
            self.probe = replace(base, provenance=None, **{k: probe[k] for k in COEFFICIENTS})
            self.o_s = float(probe["request_overhead_s"])
        else:
            self.probe, self.o_s = replace(base, provenance=None), float(prov.get("request_overhead_s", 0.0))
        self.workloads = {"tiny": "tiny", "prefill-heavy": str(root / "prefill-heavy.toml")}
        self.limits = validate_sim.engine_limits()

    def rates(self, w: str) -> list[float]:
        return sorted(float(p.name.rsplit("-", 1)[1]) for p in (self.root / w).glob("measured-again-*"))

    def specs(self, w: str, rate: float, n: int) -> list[RequestSpec]:
        setup = live_setup("http://127.0.0.1:9/v1", "tiny", RefinePlan(self.workloads[w], None, n, 0, self.limits))
        return list(setup.specs(rate, seed=0))  # validate_sim's seed 0; nothing is sent

    def records(self, w: str, rate: float, again: bool = False) -> list[RequestRecord]:
        return load_run(self.root / w / f"measured-{'again-' if again else ''}{rate:.4g}").records


def fit(job: tuple[str, str, str, tuple[int, ...]]) -> dict[str, Any]:
    root, variant, w, idx = job
    runs = Runs(Path(root))
    fit_o, split, inside = VARIANTS[variant]
    rates = runs.rates(w)
    train = []
    for i in idx:
        recs = runs.records(w, rates[i])
        specs = runs.specs(w, rates[i], len(recs))
        train.append((specs, percentiles(recs, smooth=True, split_tokens=median_prompt(specs) if split else None)))
    f = fit_factors(runs.probe, runs.o_s, train, runs.limits, "completions", fit_overhead=fit_o, fit_inside=inside)
    return {"variant": variant, "on": w, "factors": f.factors, "noise": f.jitter_sd, "o_s": f.overhead_s,
            "profile": f.profile, "r_s": f.profile.per_request_s}


def score(root: str, profile: CostProfile, o_s: float, noise: float, fitted_on: str) -> tuple[int, int, float]:
    """(comparisons within target, comparisons, median |relative error| of the percentiles)."""
    runs = Runs(Path(root))
    hits = total = 0
    errs = []
    for w in runs.workloads:
        slo = SLO.parse(validate_sim.SERVER["slos"][w])
        for rate in runs.rates(w):
            n = len(runs.records(w, rate))
            sim = validate_sim.judge(simulate_records(runs.specs(w, rate, n), runs.limits.engine(profile), jitter_sd=noise,
                                          request_overhead_s=o_s, seed=0), slo)
            for again in (False, True):
                if w == fitted_on and not again:
                    continue  # the fit saw (some of) these
                m = validate_sim.judge(runs.records(w, rate, again), slo)
                ok = validate_sim.within_target(m, sim)
                hits += sum(ok.values())
                total += len(ok)
                errs += [abs(sim[k] - m[k]) / m[k] for k in validate_sim.PERCENTILES]
    return hits, total, float(np.median(errs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", help="a validate_sim.py --repeat output directory")
    ap.add_argument("--fit-rates", default="1,2,3", help="which of each workload's rates to fit on (0-based)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--server", choices=("engine", "llamacpp"), default="engine",
                    help="the server the runs measured (validate_sim --server): its limits and SLOs")
    args = ap.parse_args()
    if args.server == "llamacpp":
        validate_sim.SERVER.update(name="llamacpp", model="tiny-gguf", limits=validate_sim.LLAMACPP_LIMITS,
                                   slos=validate_sim.LLAMACPP_SLOS)
    root = str(Path(args.runs).resolve())
    idx = tuple(int(i) for i in args.fit_rates.split(","))
    variants = [v.strip() for v in args.variants.split(",")]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"refit_offline: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    runs = Runs(Path(root))
    jobs = [(root, v, w, idx) for w in runs.workloads for v in variants]
    with Pool(2) as pool:
        fits = pool.map(fit, jobs)
        scores = pool.starmap(score, [(root, f["profile"], f["o_s"], f["noise"], f["on"]) for f in fits]
                              + [(root, runs.probe, runs.o_s, 0.0, w) for w in runs.workloads])
    print(f"probe fit of {root}/calibrated.json; o {runs.o_s * 1e3:.1f} ms; fitted on rates {idx} (0-based) of each "
          "workload's first measurement; scored on every run the fit did not see")
    print("\n| fitted on | fit | factors a / b / c / o | noise sd | within target | median |error| |")
    print("|---|---|---|---|---|---|")
    for f, (hits, total, med) in zip(fits, scores, strict=False):
        fa = f["factors"]
        r = f" (r {f['r_s'] * 1e3:.1f} ms)" if f["r_s"] else ""
        print(f"| {f['on']} | {f['variant']}{r} | x{fa['a']:.2f} / x{fa['b']:.2f} / x{fa['c']:.2f} / x{fa['o']:.2f} | "
              f"{f['noise']:.2f} | {hits}/{total} | {med:.1%} |")
    for w, (hits, total, med) in zip(runs.workloads, scores[len(fits):], strict=True):
        print(f"| (none: scored without {w}'s first runs) | probe fit alone | - | 0 | {hits}/{total} | {med:.1%} |")


if __name__ == "__main__":
    main()
