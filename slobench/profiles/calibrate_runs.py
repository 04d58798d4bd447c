"""`slobench calibrate --from-runs`: a base profile's host costs fitted on request logs, checked on held-out
runs, written as a profile with its provenance (the inputs' sha256, the base, the engine's flags, the fit).

The runs are split by rate (`split_by_rate`: the fit on the lower-rate half, the error on the rest) unless
the caller fits on all of them; the check replays every run with the base and with the calibrated profile.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reference_engine.executor.modeled_executor import CostProfile
from slobench.fleet.published import NO_HOST, FleetBuilder, Run, ScaledBuilder, scaled_kv_blocks
from slobench.profiles.from_runs import (
    FitPlan,
    HostFit,
    decode_step_scale_s,
    fit_host_costs,
    fit_with_scales,
    fleet_replayer,
    run_errors,
    split_by_rate,
)


@dataclass(frozen=True, slots=True)
class RunsCalibration:
    """The fit, the runs held out of it, and each run's errors (% of measured) with the base and the fit."""

    fit: HostFit
    held_out: tuple[str, ...]
    errors: tuple[tuple[str, float, dict[str, float], dict[str, float]], ...]  # (run, rate, base, calibrated)
    fit_s: float


def calibrate_runs(runs: Sequence[Run], base: CostProfile, build: FleetBuilder, *, fit_all: bool = False,
                   bootstrap: int = 200, seed: int = 0, scaled: ScaledBuilder | None = None,
                   fit_prefill: bool = False, fit_kv: bool = False) -> RunsCalibration:
    """Fit `base`'s host costs on `runs` (or their lower-rate half) replayed on `build`'s fleet; with
    `fit_prefill` and `fit_kv`, the scale of the prefill price and of the KV blocks too (on `scaled`'s fleets)."""
    if (fit_prefill or fit_kv) and scaled is None:
        raise ValueError("fitting a scale needs the scaled fleet builder")
    fit_runs, held = (list(runs), []) if fit_all else split_by_rate(runs)
    replay = fleet_replayer(build, seed)
    plan = FitPlan(decode_step_scale_s(base, fit_runs), bootstrap=bootstrap, seed=seed)
    t0 = time.perf_counter()
    if scaled is None or not (fit_prefill or fit_kv):
        fit = fit_host_costs(fit_runs, replay, plan)
    else:
        fit = fit_with_scales(fit_runs, lambda p, k: fleet_replayer(scaled(p, k), seed), plan, prefill=fit_prefill,
                              kv=fit_kv)
        replay = fleet_replayer(scaled(fit.prefill_scale, fit.kv_scale), seed)
    fit_s = time.perf_counter() - t0
    rows = []
    for r in sorted(runs, key=lambda r: r.rate_rps):
        ttft, tpot = replay(r, fit.step_s, fit.per_seq_s)
        rows.append((r.name, r.rate_rps, run_errors(r, *replay(r, *NO_HOST[:2])),
                     run_errors(r, ttft + fit.request_overhead_s * 1e3, tpot)))
    return RunsCalibration(fit, tuple(r.name for r in held), tuple(rows), fit_s)


def sha256_of(path: str | Path) -> str:
    """The file's sha256, or a run directory's requests.jsonl's."""
    p = Path(path)
    if p.is_dir():
        p = p / "requests.jsonl"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def calibrated_profile(base: CostProfile, cal: RunsCalibration, inputs: Sequence[str | Path],
                       engine_flags: dict[str, Any], columns: str | None) -> CostProfile:
    """`base` with the fitted host costs; its provenance keeps the base's and adds `calibrated_from_runs`."""
    f = cal.fit
    section = {
        "base_profile": base.name, "inputs": [{"path": str(p), "sha256": sha256_of(p)} for p in inputs],
        "columns": columns, "engine": engine_flags,
        "served_kv_blocks": scaled_kv_blocks(engine_flags["kv_blocks"], f.kv_scale) if f.kv_losses else None,
        "host_step_s": f.step_s, "host_step_sd_s": f.step_sd_s, "host_per_seq_s": f.per_seq_s,
        "host_per_seq_sd_s": f.per_seq_sd_s, "request_overhead_s": f.request_overhead_s,
        "prefill_scale": f.prefill_scale, "prefill_scale_sd": f.prefill_scale_sd,
        "kv_blocks_scale": f.kv_scale, "kv_blocks_scale_sd": f.kv_scale_sd,
        "request_overhead_sd_s": f.request_overhead_sd_s, "uncertainty": f"bootstrap over requests, {len(f.bootstrap)} resamples",
        "fit_runs": list(f.fit_runs), "held_out_runs": list(cal.held_out), "replays": f.num_replays,
        "loss_per_request": {"base": f.base_loss, "calibrated": f.loss},
        "held_out_errors_pct": {name: calibrated for name, _, _, calibrated in cal.errors if name in cal.held_out},
    }
    # the request overhead where `--simulate` and plan read a calibrated profile's (`calibrated_extras`)
    prov = {**(base.provenance or {}), "calibrated_from_runs": section, "request_overhead_s": f.request_overhead_s}
    note = (f"{base.note + '; ' if base.note else ''}host costs fitted on {len(f.fit_runs)} measured runs "
            f"(slobench calibrate --from-runs)")
    fitted = base.with_prefill_scale(f.prefill_scale).with_host_costs(f.step_s, f.per_seq_s)
    return replace(fitted, name=f"{base.name}+host", note=note, provenance=prov)


_COLS = (("ttft_mean", "TTFT mean"), ("ttft_p50", "p50"), ("ttft_p90", "p90"), ("tpot_mean", "TPOT mean"),
         ("tpot_p50", "p50"), ("tpot_p90", "p90"))


def print_calibration(cal: RunsCalibration, write: Callable[[str], None] = print) -> None:
    f = cal.fit
    write(f"fitted on {', '.join(f.fit_runs)} ({f.num_replays} points replayed, {cal.fit_s:.1f} s):")
    write(f"  host step       {f.step_s * 1e3:8.3f} ms  +- {f.step_sd_s * 1e3:.3f} (sd)")
    write(f"  host per seq    {f.per_seq_s * 1e3:8.4f} ms  +- {f.per_seq_sd_s * 1e3:.4f} (sd; each sequence sampling "
          "a token in the step)")
    write(f"  request         {f.request_overhead_s * 1e3:8.2f} ms  +- {f.request_overhead_sd_s * 1e3:.2f} (sd; each "
          "request, outside the steps: every time after the send)")
    if f.kv_losses:
        write(f"  KV blocks       {f.kv_scale:8.3f} x the engine's  +- {f.kv_scale_sd:.3f} (sd; the served engine's "
              "cache as the runs show it; loss at each scale tried: "
              + ", ".join(f"{a:g}: {b:.4f}" for a, b in f.kv_losses) + ")")
    if f.prefill_losses:
        write(f"  prefill price   {f.prefill_scale:8.3f} x the base's  +- {f.prefill_scale_sd:.3f} (sd; its per-token "
              "terms; loss at each scale tried: " + ", ".join(f"{a:g}: {b:.4f}" for a, b in f.prefill_losses) + ")")
    write(f"  loss a request  {f.base_loss:.4f} with the base profile, {f.loss:.4f} calibrated "
          f"(squared log ratios: each request's TPOT, each run's TTFT deciles; sd over {len(f.bootstrap)} bootstrap "
          "resamples of the requests)")
    head = f"{'run':28s} {'rate':>6s} {'':5s} " + " ".join(f"{n:>9s}" for _, n in _COLS)
    write("error of the simulation, % of measured (base -> calibrated)" + ("" if cal.held_out else
          "; no runs held out: every run was fitted on"))
    write(head)
    for name, rate, b, c in cal.errors:
        tag = "held" if name in cal.held_out else "fit"
        write(f"{name:28s} {rate:6.2f} {tag:5s} " + " ".join(f"{b[k + '_err_pct']:+4.0f}>{c[k + '_err_pct']:+4.0f}"
                                                            for k, _ in _COLS))
