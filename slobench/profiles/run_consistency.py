"""Whether measured runs agree with each other: each run's decode step at the same batch, from its requests alone.

Host costs fitted on several runs assume one server measured several times. Runs taken on a different day, GPU
clock, driver or build can differ by more than any host cost explains, and then no fit matches all of them.
This check needs no replay, and holds for a co-located engine, where a request between its first and last
tokens is in the running batch (a disaggregated one's wait for the decode instance there would count as
batch). For each request of at least `MIN_TOKENS` tokens it takes its decode life, from its first token to its
last:

- the time outside the prompts that got their first token meanwhile (each priced by the profile: a co-located
  engine stops or slows its decodes for them);
- divided by its tokens after the first: its measured decode step;
- against the profile's mean step over the steps of its life, at the batch and context of each moment. The
  batch at a moment is the requests between their first and last tokens; the context is their prompts plus
  what they have generated.

The log of that ratio is the run's host cost and speed, plus noise. A two-way least-squares fit splits it into a
share for the batch (one for each `BATCH_BIN` requests, common to the runs: the host costs), a share for the run
(its speed) and a term in the prompts' share of the life (a prefill price off by a share, common to the runs).
A run's share, against the median run's, is its offset: how much slower its decode steps are than the others'
at the same batch and prefill load. An offset over `FLAG_FRACTION`, and over `FLAG_SDS` bootstrap standard
deviations, marks a run that a common calibration cannot match.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reference_engine.executor.modeled_executor import CostProfile
from slobench.fleet.published import Run

MIN_TOKENS = 20  # shorter answers' decode lives are a handful of steps: too few to time one
BATCH_BIN = 4  # requests a batch bin spans
GRID_S = 0.005  # the time grid the batch and context are integrated on (coarser for long logs: MAX_GRID points)
MAX_GRID = 1_000_000
TOGETHER_S = 0.002  # first tokens this close together came from one step
CTX_Q = 16  # tokens the context is rounded to when the profile prices a step
FLAG_FRACTION = 0.10  # an offset that marks a run: a tenth of a step, and FLAG_SDS of its sd
FLAG_SDS = 3.0
BOOTSTRAP = 200  # resamples of each run's requests for the offsets' sd


@dataclass(frozen=True, slots=True)
class RunSpeed:
    """A run's decode step against the other runs' at the same batch (a share, + slower; None without a batch
    bin shared with another run), the profile's mean decode step over its requests' lives, and the requests
    timed."""

    name: str
    offset: float | None
    offset_sd: float | None
    step_ms: float
    median_batch: float
    requests: int

    @property
    def flagged(self) -> bool:
        if self.offset is None or self.offset_sd is None:
            return False
        return abs(self.offset) > max(FLAG_FRACTION, FLAG_SDS * self.offset_sd)


@dataclass(frozen=True, slots=True)
class DecodeLives:
    """Per timed request of one run: its mean batch and context over the steps of its decode life, its measured
    decode step (ms) and the profile's there, and the prompts' priced share of its life."""

    batch: np.ndarray
    context: np.ndarray
    measured_ms: np.ndarray
    step_ms: np.ndarray
    stall_share: np.ndarray  # what a prefill price off by a share moves the measured step by, as a share


def _integrals(run: Run, profile: CostProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """Each request's first and last token times, and on a grid (from its start), the running integrals of the
    profile's steps a second (1/d), and of the batch and the context weighted by them: a mean over an interval
    is then one over the steps taken in it, not over its time (which would weigh slow, large batches more)."""
    n_after = np.maximum(run.output_len - 1, 0)
    first = run.start_s + run.ttft_ms / 1e3
    last = first + run.tpot_ms / 1e3 * n_after
    t0 = float(first.min())
    dt = max(GRID_S, (float(last.max()) - t0) / MAX_GRID)
    size = int(math.ceil((float(last.max()) - t0) / dt)) + 2
    a = np.clip(((first - t0) / dt).astype(np.int64), 0, size - 1)
    b = np.clip(((last - t0) / dt).astype(np.int64), 0, size - 1)
    live = np.zeros(size)
    np.add.at(live, a, 1.0)
    np.add.at(live, b, -1.0)
    # a request's context: its prompt, plus (t - first) / tpot tokens generated while it lives
    rate = np.where(run.tpot_ms > 0, 1e3 / np.maximum(run.tpot_ms, 1e-9), 0.0)
    const = np.zeros(size)
    slope = np.zeros(size)
    np.add.at(const, a, run.prompt_len - first * rate)
    np.add.at(const, b, -(run.prompt_len - first * rate))
    np.add.at(slope, a, rate)
    np.add.at(slope, b, -rate)
    t = t0 + np.arange(size) * dt
    batch = np.rint(np.cumsum(live))
    context = np.maximum(np.cumsum(const) + t * np.cumsum(slope), 0.0)
    # the profile's decode step at each grid point (priced once for each batch and context, rounded to CTX_Q)
    keys = np.stack([batch, np.rint(context / CTX_Q)], axis=1).astype(np.int64)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    price = np.array([profile.step_s(0, int(k), int(c) * CTX_Q) if k > 0 else math.inf for k, c in uniq])
    steps_a_s = 1.0 / price[inv.ravel()]
    cols = np.stack([steps_a_s, batch * steps_a_s, context * steps_a_s])
    return first, last, np.concatenate([np.zeros((3, 1)), np.cumsum(cols, axis=1) * dt], axis=1), t0, dt


def _over(integrals: np.ndarray, t0: float, dt: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The integrals' increase over each interval [a, b] (a grid from t0, dt apart)."""
    grid = np.arange(integrals.shape[1])
    ia = np.clip((a - t0) / dt, 0, len(grid) - 1)
    ib = np.clip((b - t0) / dt, 0, len(grid) - 1)
    return np.stack([np.interp(ib, grid, row) - np.interp(ia, grid, row) for row in integrals])


def prompt_price_s(profile: CostProfile, prompt_lens: np.ndarray, scheduler: str) -> float:
    """What prompts that got their first tokens together cost the decodes beside them: one step of their own
    (vllm-v0: prompts and decodes never share a step), or what their tokens add to a step they share (chunked,
    vllm-v1)."""
    tokens = int(prompt_lens.sum())
    pairs = int((prompt_lens * (prompt_lens + 1) // 2).sum())
    whole = profile.step_s(tokens, 0, tokens, pairs)
    return whole if scheduler == "vllm-v0" else max(whole - profile.step_s(0, 0, 0), 0.0)


def decode_lives(run: Run, profile: CostProfile, scheduler: str = "vllm-v0") -> DecodeLives:
    """The run's timed requests (see the module's docstring), priced by `profile` without its host costs (what
    the check's batch share stands for)."""
    profile = profile.with_host_costs(0.0, 0.0)
    first, last, integrals, t0, dt = _integrals(run, profile)
    # the prompts that got their first token during each life, priced a step (first tokens within `TOGETHER_S`
    # of each other came from one step), summed through a prefix sum
    order = np.argsort(first, kind="stable")
    firsts = first[order]
    starts = np.flatnonzero(np.diff(firsts, prepend=-np.inf) > TOGETHER_S)
    prices = [prompt_price_s(profile, g, scheduler) for g in np.split(run.prompt_len[order], starts[1:])]
    cum = np.concatenate([[0.0], np.cumsum(prices)])
    firsts = firsts[starts]
    timed = np.flatnonzero((run.output_len >= MIN_TOKENS) & (run.tpot_ms > 0) & (last > first))
    a, b = first[timed], last[timed]
    stalls = cum[np.searchsorted(firsts, b, side="left")] - cum[np.searchsorted(firsts, a, side="right")]
    n_steps, batch_steps, context_steps = _over(integrals, t0, dt, a, b)
    n_steps = np.maximum(n_steps, 1e-12)
    batch, context = batch_steps / n_steps, context_steps / n_steps
    model = (b - a) / n_steps * 1e3  # the profile's mean step over the steps of the life
    steps = np.maximum(b - a - stalls, 0.0) / (run.output_len[timed] - 1) * 1e3
    return DecodeLives(batch, context, steps, model, stalls / (run.output_len[timed] - 1) * 1e3 / model)


def run_speeds(runs: Sequence[Run], profile: CostProfile, scheduler: str = "vllm-v0", seed: int = 0
               ) -> list[RunSpeed]:
    """Each run's offset against the median run's at the same batch (see the module's docstring)."""
    lives = [decode_lives(r, profile, scheduler) for r in runs]
    run_idx = np.concatenate([np.full(len(lv.batch), i) for i, lv in enumerate(lives)]).astype(np.int64)
    bins = np.concatenate([(lv.batch // BATCH_BIN).astype(np.int64) for lv in lives])
    y = np.concatenate([np.log(np.maximum(lv.measured_ms, 1e-9) / lv.step_ms) for lv in lives])
    stall = np.concatenate([lv.stall_share for lv in lives])
    # only bins that two runs or more share say anything about one run against another
    pairs = np.unique(np.stack([bins, run_idx], axis=1), axis=0)
    ub, runs_in = np.unique(pairs[:, 0], return_counts=True)
    shared = runs_in[np.searchsorted(ub, bins)] >= 2
    informed = sorted(set(run_idx[shared].tolist()))
    offsets: dict[int, tuple[float, float]] = {}
    if len(informed) >= 2:
        ri, bi, yy, st = run_idx[shared], bins[shared], y[shared], stall[shared]
        est = _offsets(ri, bi, yy, st, informed)
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(BOOTSTRAP):  # requests resampled within each run
            pick = np.concatenate([rng.choice(np.flatnonzero(ri == i), int((ri == i).sum())) for i in informed])
            draws.append(_offsets(ri[pick], bi[pick], yy[pick], st[pick], informed))
        sd = np.std(np.asarray(draws), axis=0)
        offsets = {i: (float(est[k]), float(sd[k])) for k, i in enumerate(informed)}
    out = []
    for i, (r, lv) in enumerate(zip(runs, lives, strict=True)):
        o = offsets.get(i)
        out.append(RunSpeed(r.name, None if o is None else math.expm1(o[0]), None if o is None else o[1],
                            float(np.median(lv.step_ms)) if len(lv.step_ms) else math.nan,
                            float(np.median(lv.batch)) if len(lv.batch) else math.nan, len(lv.batch)))
    return out


def _offsets(run_idx: np.ndarray, bins: np.ndarray, y: np.ndarray, stall: np.ndarray, runs: list[int]
             ) -> np.ndarray:
    """Least squares log(measured / profile step) ~ run + bin + k * stall share (k: the profile's prefill price
    off by a share, common to the runs); the runs' effects less their median."""
    ub = np.unique(bins)
    design = np.zeros((len(y), len(runs) + len(ub) + 1))
    design[:, -1] = stall
    design[np.arange(len(y)), np.searchsorted(runs, run_idx)] = 1.0
    design[np.arange(len(y)), len(runs) + np.searchsorted(ub, bins)] = 1.0
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)  # the split between the two is set by the median below
    eff = coef[:len(runs)]
    return eff - np.median(eff)


def describe(speeds: Sequence[RunSpeed]) -> list[str]:
    """The check's lines: each run's offset, then a warning naming the runs that disagree (none if all agree)."""
    lines = ["runs against each other: decode step at the same batch, from the requests alone (against the median "
             "run)"]
    for s in speeds:
        if s.offset is None or s.offset_sd is None:
            lines.append(f"  {s.name:28s}      -   ({s.requests} requests timed; no batch shared with another run)")
            continue
        lines.append(f"  {s.name:28s} {s.offset * 100:+5.0f}% +- {s.offset_sd * 100:.0f} ({s.offset * s.step_ms:+.1f} ms "
                     f"on a {s.step_ms:.0f} ms step at batch {s.median_batch:.0f}; {s.requests} requests)"
                     + ("  <- differs" if s.flagged else ""))
    odd = [s.name for s in speeds if s.flagged]
    if odd:
        lines.append(f"warning: {', '.join(odd)} decode{'s' if len(odd) == 1 else ''} at a different speed from the "
                     "other runs at the same batch: no one set of host costs fits them all. Check how the runs were "
                     "taken (server build, GPU, clocks), or calibrate on the runs that agree.")
    return lines
