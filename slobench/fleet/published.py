"""Published serving measurements replayed on the simulator: DistServe's OPT-13B runs on A100-80GB (vLLM
co-located on 1 GPU; DistServe with a TP-2 prefill and a TP-1 decode instance), one JSON line per request.

Each run is replayed with its own arrivals and lengths (the client asked for exactly `output_len` tokens)
on the engine each system ran, as its server flags describe it (`setup_fleet`): the vllm-v0 scheduler, the
token and batch limits, KV blocks from the GPU's memory x utilisation less the fp16 weights. Step times come
from DistServe's own per-phase fits ("fitted") or from a roofline of the A100's and the model's
specifications ("roofline", nothing fitted to these runs). `compare` gives each run's figures, measured and
simulated: attainment of TTFT < 200 ms and TPOT < 100 ms, and TTFT/TPOT p50 and p90.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError
from slobench.fleet.disagg import DisaggFleet, KVLink
from slobench.fleet.simulate import ModeledEngine, SimOptions, simulate_records
from slobench.input_file import RECORDS, read_input_bytes
from slobench.profiles.roofline import kv_capacity_tokens, roofline, vllm_kv_blocks
from slobench.profiles.specs import ModelConfig, get_gpu, model_from_hf_config
from slobench.run.records import RequestRecord, RequestSpec, with_drawn_ids

SETUPS = ("vllm", "distserve-c21d11")
PROFILES = ("fitted", "roofline")
TTFT_SLO_MS = 200.0
TPOT_SLO_MS = 100.0
GPU = "a100"
MEMORY_UTILIZATION = 0.95  # --gpu-memory-utilization of both systems in these runs (DistServe's launch script)
BLOCK_SIZE = 16
HF_MODEL = "facebook/opt-13b"  # the key of DistServe's profiler files
FIELDS = ("start_s", "prompt_len", "output_len", "ttft_ms", "tpot_ms")
_IDS = (32, 127)  # prompt ids drawn from printable ASCII, within the modeled executor's vocabulary


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run: per request, its arrival, lengths and measured TTFT and TPOT (ms)."""

    name: str
    start_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray

    @property
    def rate_rps(self) -> float:
        span = float(self.start_s[-1] - self.start_s[0]) if len(self.start_s) > 1 else 0.0
        return (len(self.start_s) - 1) / span if span > 0 else math.nan


def read_run(path: str | Path) -> Run:
    """A run file: one JSON object a line with `FIELDS` (more are ignored). A SpecError names the file, the
    line and what is wrong with it."""
    p = Path(path)
    try:
        lines = read_input_bytes(p, RECORDS).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError("run file", str(p), f"cannot be read: {e}") from None
    cols: dict[str, list[float]] = {k: [] for k in FIELDS}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p.name}:{i}"
        try:
            row = json.loads(line)
        except ValueError:
            raise SpecError("run file", where, "is not a JSON object") from None
        if not isinstance(row, dict):
            raise SpecError("run file", where, "is not a JSON object")
        for k in FIELDS:
            v: Any = row.get(k)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            if k in ("prompt_len", "output_len"):
                ok = ok and isinstance(v, int) and v >= 1
            if not ok:
                raise SpecError("run file", where, f"field {k!r} is {v!r}: needs "
                                + ("an integer >= 1" if k.endswith("_len") else "a number >= 0"))
            cols[k].append(v)
    if not cols["start_s"]:
        raise SpecError("run file", str(p), "holds no requests")
    order = np.argsort(np.asarray(cols["start_s"]), kind="stable")
    a = {k: np.asarray(v)[order] for k, v in cols.items()}
    return Run(p.stem, a["start_s"] - a["start_s"][0], a["prompt_len"].astype(int), a["output_len"].astype(int),
               a["ttft_ms"].astype(float), a["tpot_ms"].astype(float))


def specs_of(run: Run, seed: int = 0) -> list[RequestSpec]:
    """The run's requests as sent: its arrivals, prompts of its lengths (ids drawn, nothing shared), exactly
    `output_len` tokens asked for."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (t, n, m) in enumerate(zip(run.start_s.tolist(), run.prompt_len.tolist(), run.output_len.tolist(),
                                      strict=True)):
        prompt = tuple(rng.integers(*_IDS, size=n).tolist())
        out.append(with_drawn_ids(RequestSpec(i, t, prompt, n, m, min_tokens=m), _IDS))
    return out


def opt13b(data_dir: Path) -> ModelConfig:
    return model_from_hf_config(data_dir / "opt-13b-config.json")


# DistServe's workers keep 1% of each GPU's memory for their own work before sizing the KV cache
# (`_profile_num_available_blocks`); vLLM sizes its own with `vllm_blocks`
RESERVE_FRACTION = {"vllm": 0.0, "distserve": 0.01}


def vllm_blocks(model: ModelConfig) -> int:
    """KV blocks of the vLLM server: as vLLM sizes them (`vllm_kv_blocks`: memory x 0.95 less the weights and
    its profiling pass's activation peak at 16,384 tokens and 1,024 sequences)."""
    return vllm_kv_blocks(model, GPU, 1, block_size=BLOCK_SIZE, max_num_batched_tokens=16384, max_num_seqs=1024,
                          gpu_memory_utilization=MEMORY_UTILIZATION)


def kv_blocks(model: ModelConfig, tp: int, system: str) -> int:
    """KV blocks of one instance: `tp` A100-80GBs (81,920 MiB each) x 0.95, less what `system` reserves and
    the fp16 weights, over the KV bytes a token."""
    return kv_capacity_tokens(model, GPU, tp, MEMORY_UTILIZATION, RESERVE_FRACTION[system]) // BLOCK_SIZE


# the serving loop's host work: (s a step, s per sequence sampling a token, s a request outside the steps: the
# request overhead, added to every time after the send as `--simulate` adds a calibrated profile's)
HostCosts = tuple[float, float, float]
NO_HOST: HostCosts = (0.0, 0.0, 0.0)
# host costs -> the engine (and fleet) to replay on, its profiles carrying those costs
FleetBuilder = Callable[[HostCosts], tuple[ModeledEngine, SimOptions]]
# (prefill scale, KV blocks scale) -> the fleet with the base's prefill price and the engines' KV blocks times them
ScaledBuilder = Callable[[float, float], FleetBuilder]


def scaled_kv_blocks(kv_blocks: int, scale: float) -> int:
    """An engine's KV blocks times a fitted scale, at least one."""
    return max(1, round(kv_blocks * scale))


def cost_profile(kind: str, system: str, tp: int, data_dir: Path, host_overhead_s: float = 0.0,
                 host: HostCosts = NO_HOST, prefill_scale: float = 1.0) -> CostProfile:
    """`fitted`: DistServe's fit for the system's engine at `tp` (the `vllm` file for vLLM, the `distserve`
    file for DistServe's instances); `roofline`: the A100's and OPT-13B's specifications alone; anything else,
    a profile file (`CostProfile.load`). Every step `host_overhead_s` longer (0: the profile as it is; a
    diagnosis, not part of either profile); `host`: the serving loop's host costs (calibrated, or the file's);
    `prefill_scale`: the prompts' price per token times it (`CostProfile.with_prefill_scale`, calibrated)."""
    if kind == "fitted":
        prof = CostProfile.load(f"distserve:{data_dir / f'profiler-a100-80g.{system}.json'}@{HF_MODEL}/tp{tp}")
    elif kind == "roofline":
        prof = roofline(opt13b(data_dir), GPU, tp)
    else:
        prof = CostProfile.load(kind)
    prof = prof.with_step_overhead(host_overhead_s).with_prefill_scale(prefill_scale)
    return prof.with_host_costs(host[0], host[1]) if host[:2] != NO_HOST[:2] else prof


def setup_fleet(setup: str, profile: str, data_dir: Path, host_overhead_s: float = 0.0,
                host: HostCosts = NO_HOST, prefill_host: bool = False, prefill_scale: float = 1.0,
                kv_scale: float = 1.0) -> tuple[ModeledEngine, SimOptions]:
    """The engine (and fleet) each system ran, from its server flags (the data's README), with the `host`
    costs. DistServe's go on its decode instance, and on its prefill instance too with `prefill_host`: which
    of the two a profile needs is the calibration's to find (`benchmarks/validate_published.py` fits both and
    keeps the better). With DistServe's own fit the prefill instance needs none: its measured TTFT carries no
    cost that grows with the prefill queue (the same step cost there put TTFT p50 from 4% low at 3 req/s to
    12% high at 12), and a request's fixed cost is the request overhead. DistServe's decode instance admits as
    its decoding-stage scheduler does (`decode_admission="distserve"`). `prefill_scale`: every instance's
    prompts priced that many times the profile's, per token; `kv_scale`: every instance's KV blocks that many
    times (a calibration's)."""
    model = opt13b(data_dir)
    extra = host_overhead_s
    limits: dict[str, Any] = {"block_size": BLOCK_SIZE, "max_model_len": model.max_positions or 2048,
                              "enable_prefix_caching": False, "scheduler": "vllm-v0"}
    if setup == "vllm":
        engine = ModeledEngine(cost_profile(profile, "vllm", 1, data_dir, extra, host, prefill_scale), kv_blocks=scaled_kv_blocks(vllm_blocks(model), kv_scale),
                               max_num_seqs=1024, max_batched_tokens=16384, name="vllm", **limits)
        return engine, SimOptions(request_overhead_s=host[2])
    if setup == "distserve-c21d11":
        prefill = ModeledEngine(cost_profile(profile, "distserve", 2, data_dir, extra, host if prefill_host else NO_HOST, prefill_scale), kv_blocks=scaled_kv_blocks(kv_blocks(model, 2, "distserve"), kv_scale),
                                max_num_seqs=128, max_batched_tokens=8192, name="distserve-prefill", **limits)
        decode = ModeledEngine(cost_profile(profile, "distserve", 1, data_dir, extra, host, prefill_scale), kv_blocks=scaled_kv_blocks(kv_blocks(model, 1, "distserve"), kv_scale),
                               max_num_seqs=1024, max_batched_tokens=65536, name="distserve-decode", **limits)
        link = KVLink(get_gpu(GPU).link_gb_s * 1e9, 0.0)  # NVLink between the instances' GPUs, one way
        fleet = DisaggFleet(prefill=1, decode=1, link=link, bytes_per_token=model.kv_bytes_per_token,
                            decode_engine=decode, first_token_from="prefill",
                            decode_admission="distserve")
        return prefill, SimOptions(disagg=fleet, request_overhead_s=host[2])
    raise SpecError("setup", setup, f"must be one of {list(SETUPS)}")


def simulate(run: Run, setup: str, profile: str, data_dir: Path, host_overhead_s: float = 0.0,
             host: HostCosts = NO_HOST, build: FleetBuilder | None = None) -> list[RequestRecord]:
    """`run` replayed on the setup's fleet, or on the one `build` makes (then setup and profile are labels)."""
    engine, opts = (build(host) if build is not None
                    else setup_fleet(setup, profile, data_dir, host_overhead_s, host))
    return simulate_records(specs_of(run), engine, opts)


def simulated_times_ms(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT (ms) of simulated records in request order; inf for a request that never got its first
    token (or its last), TPOT 0 for a one-token answer (as the measured runs write it)."""
    recs = sorted(records, key=lambda r: r.request_id)
    ttft = np.full(len(recs), np.inf)
    tpot = np.full(len(recs), np.inf)
    for i, r in enumerate(recs):
        if r.first_token_s is not None and r.sent_s is not None:
            ttft[i] = (r.first_token_s - r.sent_s) * 1e3
        if r.done_s is not None and r.first_token_s is not None and r.status == "ok":
            tpot[i] = (r.done_s - r.first_token_s) * 1e3 / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
    return ttft, tpot


def figures(ttft_ms: np.ndarray, tpot_ms: np.ndarray, output_len: np.ndarray) -> dict[str, float]:
    """Attainment (%, TTFT < 200 ms and TPOT < 100 ms both met; a request without times is not attained) and
    TTFT/TPOT p50/p90 and mean (ms, over the requests that have the time; TPOT over answers of more than one
    token)."""
    met = (ttft_ms < TTFT_SLO_MS) & (tpot_ms < TPOT_SLO_MS)
    multi = tpot_ms[output_len > 1]

    def q(x: np.ndarray, p: float) -> float:
        x = x[np.isfinite(x)]
        return float(np.percentile(x, p)) if len(x) else math.nan
    def mean(x: np.ndarray) -> float:
        x = x[np.isfinite(x)]
        return float(x.mean()) if len(x) else math.nan
    return {"attainment": 100.0 * float(met.mean()), "ttft_p50_ms": q(ttft_ms, 50), "ttft_p90_ms": q(ttft_ms, 90),
            "tpot_p50_ms": q(multi, 50), "tpot_p90_ms": q(multi, 90), "ttft_mean_ms": mean(ttft_ms),
            "tpot_mean_ms": mean(multi)}


# answer lengths (tokens after the first) that split a run's requests for `tpot_gap_by_length`
GAP_BINS = (1, 10, 50, 150, 400)


def tpot_gap_by_length(run: Run, tpot_sim_ms: np.ndarray) -> list[dict[str, Any]]:
    """Measured less simulated TPOT (ms, median per bin) of the requests whose answer has its tokens after the
    first in [lo, hi): a gap that stays level across the bins is a cost every step pays; one that shrinks as
    answers lengthen is a cost paid once a request (a transfer, a queue before its second token)."""
    k = run.output_len - 1
    ok = (k >= 1) & np.isfinite(tpot_sim_ms) & np.isfinite(run.tpot_ms)
    out = []
    for lo, hi in zip(GAP_BINS, (*GAP_BINS[1:], None), strict=True):
        sel = ok & (k >= lo) & ((k < hi) if hi is not None else True)
        if not sel.any():
            continue
        meas, sim = run.tpot_ms[sel], tpot_sim_ms[sel]
        out.append({"tokens_after_first": [lo, hi], "num_requests": int(sel.sum()),
                    "gap_ms": float(np.median(meas - sim)), "measured_ms": float(np.median(meas)),
                    "simulated_ms": float(np.median(sim))})
    return out


def compare(run: Run, setup: str, profile: str, data_dir: Path, host_overhead_s: float = 0.0,
            host: HostCosts = NO_HOST, build: FleetBuilder | None = None) -> dict[str, Any]:
    """One run's figures, measured and simulated, and the TPOT gap by answer length (`tpot_gap_by_length`)."""
    records = simulate(run, setup, profile, data_dir, host_overhead_s, host, build)
    ttft, tpot = simulated_times_ms(records)
    return {"run": run.name, "setup": setup, "profile": profile, "num_requests": len(run.start_s),
            "num_failed_simulated": sum(r.status != "ok" for r in records),  # refused (too long), never attained
            "host_overhead_ms": host_overhead_s * 1e3,
            "rate_rps": round(run.rate_rps, 3),
            "measured": figures(run.ttft_ms, run.tpot_ms, run.output_len),
            "simulated": figures(ttft, tpot, run.output_len),
            "tpot_gap_by_output_len": tpot_gap_by_length(run, tpot)}


SATURATED_TTFT_P90_MS = 1000.0  # a run whose measured TTFT p90 passes this is past saturation: no latency targets


def targets_met(row: dict[str, Any]) -> dict[str, bool]:
    """Which targets a compared run meets. Fitted: attainment within 3 points; below saturation (measured TTFT
    p90 < 1 s) TTFT and TPOT p50 within 10% and p90 within 20%. Roofline: attainment within 8 points."""
    m, s = row["measured"], row["simulated"]
    att = round(abs(s["attainment"] - m["attainment"]), 9)  # 3.0 points is within 3, whatever the float error
    if row["profile"] == "roofline":
        return {"attainment": att <= 8.0}
    out = {"attainment": att <= 3.0}
    if m["ttft_p90_ms"] < SATURATED_TTFT_P90_MS:
        for key, tol in (("ttft_p50_ms", 0.10), ("tpot_p50_ms", 0.10), ("ttft_p90_ms", 0.20), ("tpot_p90_ms", 0.20)):
            out[key] = abs(s[key] - m[key]) <= tol * m[key]
    return out


GPUS_PER_SETUP = {"vllm": 1, "distserve-c21d11": 3}
PLAN_TARGET = 90.0  # % of requests attaining both SLOs


def poisson_run(lengths: Run, rate_rps: float, num_requests: int, seed: int) -> Run:
    """A run of `num_requests` Poisson arrivals at `rate_rps`, each with a (prompt, output) length pair drawn
    from `lengths`' requests (no measured times: NaN)."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate_rps, num_requests - 1))])
    pick = rng.integers(0, len(lengths.prompt_len), num_requests)
    nan = np.full(num_requests, np.nan)
    return Run(f"poisson-{rate_rps:g}", starts, lengths.prompt_len[pick], lengths.output_len[pick], nan, nan)


def measured_curve(runs: Sequence[Run]) -> tuple[list[float], list[float]]:
    """Attainment (%) at each measured rate, the requests of every run at that rate pooled."""
    by_rate: dict[float, list[np.ndarray]] = {}
    for r in runs:
        met = (r.ttft_ms < TTFT_SLO_MS) & (r.tpot_ms < TPOT_SLO_MS)
        by_rate.setdefault(round(r.rate_rps, 1), []).append(met)
    rates = sorted(by_rate)
    return rates, [100.0 * float(np.concatenate(by_rate[x]).mean()) for x in rates]


def simulated_curve(setup: str, profile: str, data_dir: Path, lengths: Run, rates: Sequence[float],
                    num_requests: int = 400, seeds: Sequence[int] = (0, 1), host: HostCosts = NO_HOST,
                    build: FleetBuilder | None = None) -> list[float]:
    """Simulated attainment (%) at each rate: Poisson arrivals, lengths drawn from `lengths`, mean of `seeds`."""
    out = []
    for rate in rates:
        vals = []
        for seed in seeds:
            run = poisson_run(lengths, rate, num_requests, seed)
            ttft, tpot = simulated_times_ms(simulate(run, setup, profile, data_dir, host=host, build=build))
            vals.append(figures(ttft, tpot, run.output_len)["attainment"])
        out.append(float(np.mean(vals)))
    return out


def mirrored_curve(setup: str, profile: str, data_dir: Path, runs: Sequence[Run], seeds: Sequence[int] = (0, 1),
                   host: HostCosts = NO_HOST, build: FleetBuilder | None = None) -> tuple[list[float], list[float]]:
    """Simulated attainment (%) at each measured rate, read as `measured_curve` reads it off `runs`: per
    measured run, a run of Poisson arrivals at its rate with as many requests (lengths drawn from every run's
    requests), the requests of each rate pooled, the mean of `seeds`. A run's length matters past saturation:
    the queue a longer run builds counts in its attainment (DistServe's 600 requests at 6 req/s attain 61%,
    its 300 at the same rate 91%)."""
    lengths = pooled_lengths(runs)
    by_rate: dict[float, list[int]] = {}
    for r in runs:
        by_rate.setdefault(round(r.rate_rps, 1), []).append(len(r.start_s))
    rates = sorted(by_rate)
    out = []
    for rate in rates:
        vals = []
        for seed in seeds:
            met = []
            for i, n in enumerate(by_rate[rate]):
                run = poisson_run(lengths, rate, n, seed * 1000 + i)
                ttft, tpot = simulated_times_ms(simulate(run, setup, profile, data_dir, host=host, build=build))
                met.append((ttft < TTFT_SLO_MS) & (tpot < TPOT_SLO_MS))
            vals.append(100.0 * float(np.concatenate(met).mean()))
        out.append(float(np.mean(vals)))
    return rates, out


def pooled_lengths(runs: Sequence[Run]) -> Run:
    """Every request's (prompt, output) lengths from `runs`, as one run (its times unused)."""
    cat = {k: np.concatenate([getattr(r, k) for r in runs]) for k in ("prompt_len", "output_len", "ttft_ms", "tpot_ms")}
    return Run("pooled", np.zeros(len(cat["prompt_len"])), **cat)
