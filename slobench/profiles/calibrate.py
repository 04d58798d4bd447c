"""A cost profile fitted from designed probes of a live endpoint (`slobench calibrate --url`): prefill
probes (one request at a time) and decode probes (a batch decoding in lockstep), fitted by non-negative
least squares and scored on held-out probes (`calibrate`'s doc). A second stage (`slobench.profiles.refine`,
`slobench calibrate` runs it unless --no-refine) fits factors on this profile and `o` to open-loop runs of
served load, which the probes of an idle server see only in part.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError, UsageError
from slobench.redact import redact_url
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts

TOKEN_IDS = (32, 256)  # byte ids clear of a byte tokenizer's BOS/EOS, valid in any vocabulary >= 256
COLUMNS = ("steps", "prefill_tokens", "decode_seqs", "context_tokens", "attention_pairs", "request_overhead")


def _positive_ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise SpecError(name, values, "must be a non-empty list of integers >= 1")
    return out


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """The probe grids. Defaults suit the CPU reference engine; tests use tiny ones."""

    prompt_lens: tuple[int, ...] = (16, 64, 128, 256, 384, 512, 768, 1024)
    batches: tuple[int, ...] = (1, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (32, 96, 192)
    output_len: int = 48
    repeats: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_lens", _positive_ints("prompt_lens", self.prompt_lens))
        object.__setattr__(self, "batches", _positive_ints("batches", self.batches))
        object.__setattr__(self, "contexts", _positive_ints("contexts", self.contexts))
        if len(self.prompt_lens) < 3:
            raise SpecError("prompt_lens", self.prompt_lens, "needs at least 3 lengths (a curve, and one held out)")
        if len(self.batches) * len(self.contexts) < 3:
            raise SpecError("batches x contexts", (self.batches, self.contexts), "needs at least 3 decode probes")
        if isinstance(self.output_len, bool) or not isinstance(self.output_len, int) or self.output_len < 8:
            raise SpecError("output_len", self.output_len, "must be an integer >= 8 (a steady stretch of decode)")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise SpecError("repeats", self.repeats, "must be an integer >= 1")


@dataclass(slots=True)
class Probe:
    kind: str  # "prefill" | "decode"
    label: str  # e.g. "prompt 256" or "batch 8 x prompt 96, 2nd half"
    row: tuple[float, ...]  # the design row, in COLUMNS order
    measured_s: float  # prefill: median TTFT; decode: mean gap between tokens in the window
    held_out: bool
    predicted_s: float | None = None

    @property
    def error(self) -> float:
        assert self.predicted_s is not None
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(slots=True)
class Calibration:
    profile: CostProfile
    request_overhead_s: float
    probes: list[Probe]
    wall_s: float
    notes: list[str] = field(default_factory=list)
    max_num_seqs: int | None = None  # the most requests the server decoded at once, when below the probes' batch
    round_speeds: list[float] = field(default_factory=list)  # each round of probes against the median (round_speeds)

    def held_out_errors(self, kind: str | None = None) -> np.ndarray:
        return np.array([abs(p.error) for p in self.probes if p.held_out and (kind is None or p.kind == kind)])

    def error_summary(self, kind: str) -> tuple[float, float, int]:
        """(median, max, count) of the held-out relative errors of one kind; NaN when none was held out."""
        e = self.held_out_errors(kind)
        return (float(np.median(e)), float(e.max()), len(e)) if len(e) else (float("nan"), float("nan"), 0)


def prefill_row(n: int) -> tuple[float, ...]:
    return (1.0, n, 0.0, n, n * (n + 1) / 2, 1.0)


def decode_row(batch: int, context_tokens: float) -> tuple[float, ...]:
    return (1.0, 0.0, batch, context_tokens, context_tokens, 0.0)


def fit(probes: Sequence[Probe], name: str) -> tuple[CostProfile, float]:
    """Non-negative least squares on relative error over the probes not held out; the profile and `o`."""
    from scipy.optimize import nnls

    train = [p for p in probes if not p.held_out]
    if len(train) < len(COLUMNS):
        raise SpecError("probes", len(train), f"need at least {len(COLUMNS)} probes in the fit")
    design = np.array([p.row for p in train], dtype=float)
    y = np.array([p.measured_s for p in train], dtype=float)
    scale = design.max(axis=0)  # columns of very different sizes (1 vs ~10^5 pairs): condition the solve
    scale[scale == 0] = 1.0
    coef, _ = nnls(design / scale / y[:, None], np.ones(len(y)))
    a, b, c, d, f, o = (float(x) for x in coef / scale)  # in COLUMNS order
    profile = CostProfile(name, a, b, c, d, attention_per_pair_s=f)
    for p in probes:
        p.predicted_s = predict(profile, o, p)
    return profile, o


def predict(profile: CostProfile, request_overhead_s: float, probe: Probe) -> float:
    steps, n_prefill, n_decode, context, pairs, overhead = probe.row
    return (steps * profile.step_s(int(n_prefill), int(n_decode), int(context), int(pairs))
            + overhead * request_overhead_s)


def _prompt(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in rng.integers(TOKEN_IDS[0], TOKEN_IDS[1], n))


async def _send(target: Any, specs: Sequence[RequestSpec]) -> list[RequestRecord]:
    recs = [RequestRecord(s.request_id, 0.0, input_tokens=s.input_tokens, max_tokens=s.max_tokens) for s in specs]
    await asyncio.gather(*(target.send(s, r) for s, r in zip(specs, recs, strict=True)))
    for s, r in zip(specs, recs, strict=True):
        if r.status != "ok" or r.first_token_s is None or r.sent_s is None:
            if len(specs) > 1 and "cut off by the server" in (r.error or ""):
                raise UsageError(
                    f"calibrate: the server cut a stream off when {len(specs)} requests came together ({r.error}): "
                    "it ends the request in progress when another arrives (llama-cpp-python's server does by "
                    "default), so it cannot serve concurrent load at all; restart it with --interrupt_requests "
                    "False (llama-cpp-python) and calibrate again")
            raise UsageError(f"calibrate: a probe request ({s.input_tokens} prompt tokens, {s.max_tokens} out) "
                             f"failed: {r.error or r.status}; is it within the server's limits?")
    return recs


async def measure(target: Any, plan: ProbePlan, *, seed: int = 0,
                  on_probe: Callable[[Probe], None] | None = None, info: dict[str, Any] | None = None) -> list[Probe]:
    """Send the probes (after a warm-up) and return them with their measurements. `info`, if given, gets
    `decoding_together` (max_decoding_together)."""
    rng = np.random.default_rng(seed)
    ids = iter(range(1 << 62))

    def spec(n: int, out: int) -> RequestSpec:
        return RequestSpec(next(ids), 0.0, _prompt(rng, n), n, out, ignore_eos=True)

    # warm-up: the first requests pay for allocations and compilation, not steps. The batch of the warm-up
    # also shows how many requests the server decodes at once: batches above that are dropped.
    await _send(target, [spec(max(plan.prompt_lens), 1)])
    warm = await _send(target, [spec(max(plan.contexts), max(WARMUP_OUTPUT, plan.output_len))
                                for _ in range(max(plan.batches))])
    together = max_decoding_together(warm)
    batches = served_batches(plan.batches, together)
    if info is not None:
        info["decoding_together"] = together
    probes: list[Probe] = []

    def add(p: Probe) -> None:
        probes.append(p)
        if on_probe is not None:
            on_probe(p)

    # rounds: every probe once a round, so a slow spell of the machine spreads over all of them
    ttfts: dict[int, list[float]] = {n: [] for n in plan.prompt_lens}
    prompt_tokens = {n: n for n in plan.prompt_lens}
    decodes = [(b, L) for b in batches for L in plan.contexts]
    halves: dict[tuple[int, int], list[list[tuple[float, float]]]] = {bl: [[], []] for bl in decodes}
    by_round: dict[tuple[str, int, int], list[float]] = {}  # each probe's value in each round (round_speeds)
    for _ in range(plan.repeats):
        for n in plan.prompt_lens:
            (r,) = await _send(target, [spec(n, 1)])
            ttfts[n].append(r.first_token_s - r.sent_s)  # type: ignore[operator]
            by_round.setdefault(("prefill", n, 0), []).append(ttfts[n][-1])
            prompt_tokens[n] = r.prompt_tokens or n
        for batch, ctx in decodes:
            recs = await _send(target, [spec(ctx, plan.output_len) for _ in range(batch)])
            try:
                steady = _steady_gaps(recs, batch, ctx)
            except UsageError:
                if batch == 1:
                    raise  # one request alone never streamed steadily: _steady_gaps says so
                if batch <= together:
                    raise UsageError(
                        f"calibrate: the {batch} requests of a decode probe never streamed in step, though "
                        f"{together} decoded together in the warm-up: something between the engine and slobench "
                        "(a proxy relaying tokens in bursts?) re-times the streams, and the gaps between tokens "
                        "are not the engine's steps; calibrate the engine itself") from None
                raise UsageError(
                    f"calibrate: batch {batch} never decoded all together, and the warm-up saw at most {together} "
                    f"requests decoding at once: either the server's max_num_seqs is below {batch} (give --batches "
                    f"up to {together}), or something between it and slobench (a proxy?) re-times the streams "
                    "(calibrate the engine itself)") from None
            for h, gaps in zip(halves[batch, ctx], steady, strict=True):
                h.extend(gaps)
            both = [g for gaps in steady for g, _ in gaps]
            if both:
                by_round.setdefault(("decode", batch, ctx), []).append(float(np.median(both)))
    if info is not None:
        info["round_speeds"] = round_speeds(list(by_round.values()))
    for i, n in enumerate(plan.prompt_lens):
        add(Probe("prefill", f"prompt {prompt_tokens[n]}", prefill_row(prompt_tokens[n]), float(np.median(ttfts[n])),
                  held_out=i % 3 == 1))
    for k, (batch, ctx) in enumerate(decodes):
        for half, gaps in enumerate(halves[batch, ctx]):
            if len(gaps) < 2:
                continue
            g = np.array(gaps)
            add(Probe("decode", f"batch {batch} x prompt {ctx}, {'1st' if half == 0 else '2nd'} half",
                      decode_row(batch, float(g[:, 1].mean()) * batch), _trimmed_mean(g[:, 0]), held_out=k % 3 == 1))
    return probes


def round_speeds(by_round: Sequence[Sequence[float]]) -> list[float]:
    """How fast the server ran each round of the probes, against its median round: for each probe, its value
    in a round over its median over the rounds; for each round, the median of that over the probes (1.2: the
    round ran 20% slower). The same probes a round apart differ only by the server's speed and its noise, so a
    spread well above 1 is the server's (or its machine's) speed moving while it was calibrated, which the
    profile, fitted on the medians, cannot carry (docs/measurements/speed_drift.md). [] with under two rounds."""
    full = [v for v in by_round if len(v) >= 2 and all(x > 0 for x in v)]
    if not full:
        return []
    rounds = min(len(v) for v in full)
    rel = np.array([[x / float(np.median(v[:rounds])) for x in v[:rounds]] for v in full])
    return [float(x) for x in np.median(rel, axis=0)]


SPEED_SPREAD_NOTE = 1.1  # slowest / fastest round beyond which calibrate says the server's speed moved


# tokens each warm-up decode request generates (at least; the plan's output_len if longer): long enough that
# requests a proxy passes on a little apart still decode together (at 16, LiteLLM's spread of 8 requests
# made 5 look like the engine's limit), short of a slow server's minute
WARMUP_OUTPUT = 64


def max_decoding_together(recs: Sequence[RequestRecord]) -> int:
    """The most requests decoding at one time (between a request's first token and its last), over
    `recs` sent together: a continuous-batching server decodes them all at once up to its max_num_seqs; a
    server that serves one request at a time (llama-cpp-python's) shows 1."""
    events = sorted(e for r in recs if r.first_token_s is not None and r.chunk_times_s
                    for e in ((r.first_token_s, 1), (r.chunk_times_s[-1], -1)))
    # an end sorts before a start at the same time: touching windows are not overlapping ones
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return max(most, 1)


def served_batches(batches: Sequence[int], together: int) -> tuple[int, ...]:
    """The decode probe batches to send when the warm-up saw at most `together` requests decoding at once:
    batch 1 alone for a server that serves one request at a time, else all of them. Only that case is
    clear-cut: through a proxy that relays streams late (LiteLLM on a loaded 2-core machine: 4 of 8 seen at
    once, the engine behind it taking all 8), fewer requests seen at once than sent is no limit of the
    server's, and a batch that then never streams in step stops calibrate with both readings (measure)."""
    return (1,) if together == 1 else tuple(batches)


def retiming_notes(probes: Sequence[Probe], drop: float = 0.9) -> list[str]:
    """What no engine does, said plainly: a decode step measured faster at the largest batch than at the
    smallest (more sequences a step never make it shorter), or a prefill faster for the longest prompt
    than the shortest. Through LiteLLM on this 2-core machine both happened (2026-12-02: gaps between tokens
    1.7 ms at batch 1 and 0.6-0.9 ms at batch 8, TTFT 77 ms at 16 prompt tokens and 53 ms at 256): the proxy
    relays tokens in bursts and adds a request cost that swamps the prefill, so the probes measure it, not
    the engine's steps. `drop`: how far below the smaller case counts."""
    notes = []
    by_batch: dict[int, list[float]] = {}
    for p in probes:
        if p.kind == "decode":
            by_batch.setdefault(int(p.row[2]), []).append(p.measured_s)
    if len(by_batch) >= 2:
        small, large = min(by_batch), max(by_batch)
        s_ms, l_ms = float(np.mean(by_batch[small])) * 1e3, float(np.mean(by_batch[large])) * 1e3
        if l_ms < drop * s_ms:
            notes.append(f"the gap between tokens fell from {s_ms:.2f} ms at batch {small} to {l_ms:.2f} ms at batch "
                         f"{large}, which no engine's step does: something between the engine and slobench (a proxy "
                         "relaying tokens in bursts?) re-times the stream, and the decode fit describes that; "
                         "calibrate the engine itself")
    pre = sorted((int(p.row[1]), p.measured_s) for p in probes if p.kind == "prefill")
    if len(pre) >= 2 and pre[-1][1] < drop * pre[0][1]:
        notes.append(f"TTFT fell from {pre[0][1] * 1e3:.1f} ms at {pre[0][0]} prompt tokens to {pre[-1][1] * 1e3:.1f} ms "
                     f"at {pre[-1][0]}: the request's own cost varies more than its prefill, which the prefill fit "
                     "cannot see through (a proxy in front?)")
    return notes


def _trimmed_mean(x: np.ndarray, cut: float = 0.1) -> float:
    """The mean without the top and bottom `cut`: a step the machine stalled (another process, a GC pause)
    says nothing about the server's cost per step."""
    x = np.sort(x)
    k = int(len(x) * cut)
    return float(x[k:len(x) - k].mean())


def _steady_gaps(recs: Sequence[RequestRecord], batch: int, prompt_len: int) -> list[list[tuple[float, float]]]:
    """Per step while all `batch` requests decode together: (the median gap between tokens over the
    requests, the mean context a request has then), in the two halves of that stretch."""
    start = max(r.first_token_s for r in recs)  # type: ignore[type-var]
    end = min(r.chunk_times_s[-1] for r in recs)
    mid = (start + end) / 2  # type: ignore[operator]
    by_step: dict[int, list[tuple[float, float, float]]] = {}  # token index -> (gap, end time, context)
    for r in recs:
        generated = 0
        prompt = r.prompt_tokens or prompt_len
        for t0, t1, n in zip(r.chunk_times_s, r.chunk_times_s[1:], r.chunk_tokens[1:], strict=False):
            generated += n
            if t0 >= start and t1 <= end:  # type: ignore[operator]
                by_step.setdefault(generated, []).append(((t1 - t0) / n, t1, prompt + generated))
    halves: list[list[tuple[float, float]]] = [[], []]
    for rows in by_step.values():
        if len(rows) * 2 < batch:
            continue  # a step most requests were not in lockstep for
        g = np.array(rows)
        halves[0 if np.median(g[:, 1]) <= mid else 1].append((float(np.median(g[:, 0])), float(g[:, 2].mean())))
    if not halves[0] and not halves[1]:
        raise UsageError(f"calibrate: batch {batch} never decoded all together (tokens {len(recs[0].chunk_times_s)}); "
                         "is the server's max_num_seqs below it? Use smaller --batches or a larger --output-len")
    return halves


async def calibrate(url: str, model: str, plan: ProbePlan | None = None, *, seed: int = 0, timeout_s: float = 120.0,
                    api_key_env: str | None = "OPENAI_API_KEY", name: str | None = None,
                    on_probe: Callable[[Probe], None] | None = None) -> Calibration:
    """Probe the endpoint and fit a profile.

    Two families of probes, sent through slobench's own OpenAI target so token times are read exactly as a
    run reads them:

    - prefill: one request at a time, `max_tokens` 1, over a grid of prompt lengths. Its TTFT is one prefill
      step (n prompt tokens, n tokens of context, n(n+1)/2 attention pairs) plus the request's fixed cost on
      the way in and out (HTTP, parsing, the first SSE event): `o + a + (b + d)·n + f·n(n+1)/2`.
    - decode: B requests of L prompt tokens sent together, all generating K tokens. Once every one has its
      first token and before any finishes, each step decodes B sequences; the gap between a request's tokens
      is one step: `a + c·B + (d + f)·C`, C the tokens in context summed over the batch.

    Together they identify every coefficient (a; c; b+d and f from the prefill curve; d+f from decode), fitted
    by non-negative least squares on relative error. About a third of the probes (every third point of each
    grid) are held out of the fit and scored against it: that is the error figure reported. The fixed request
    cost `o` is not part of a step, so it is not in the profile; it is reported (and recorded in the profile's
    provenance) for whoever compares simulated TTFT with TTFT measured over HTTP.

    Assumed: each prefill probe fits one step's token budget (the default grid stops at 1,024 tokens), the
    server batches the B decode requests together (max_num_seqs >= B) and has KV room for B·(L+K) tokens,
    and prompts do not hit a prefix cache (each probe's prompt is fresh random token ids).
    """
    plan = plan or ProbePlan()
    t0 = time.perf_counter()
    options = TargetOptions(model=model, timeouts=Timeouts(request_s=timeout_s), api_key_env=api_key_env)
    target = OpenAITarget(url, options, Clock())
    await target.start()
    try:
        await target.preflight()
        info: dict[str, Any] = {}
        probes = await measure(target, plan, seed=seed, on_probe=on_probe, info=info)
    finally:
        await target.close()
    profile, overhead = fit(probes, name or f"calibrated-{model}")
    cal = Calibration(profile, overhead, probes, time.perf_counter() - t0)
    cal.notes += retiming_notes(probes)
    if not target.caps.token_prompts:
        per_word = target.caps.tokens_per_word
        cal.notes.append("the server took text, not token ids: prompt lengths are the server's usage counts "
                         "where it reports them, else approximate"
                         + (f"; it counts {per_word:.2f} tokens a word, so each prompt was sent as its length "
                            f"/ {per_word:.2f} words" if per_word != 1.0 else ""))
    cal.round_speeds = list(info.get("round_speeds") or [])
    if len(cal.round_speeds) >= 2 and max(cal.round_speeds) / min(cal.round_speeds) > SPEED_SPREAD_NOTE:
        cal.notes.append("the same probes ran at " + ", ".join(f"x{x:.2f}" for x in cal.round_speeds)
                         + " of their median in the successive rounds: the server's speed moved by "
                         f"x{max(cal.round_speeds) / min(cal.round_speeds):.2f} while it was calibrated, and a "
                         "simulation of this profile cannot know when it will move again (calibrate again on a "
                         "steadier machine, or read simulated attainment near the knee with that margin)")
    if info.get("decoding_together") == 1 and max(plan.batches) > 1:  # measure probed batch 1 alone
        cal.max_num_seqs = 1
        cal.notes.append(f"the server decoded at most 1 request at a time ({max(plan.batches)} sent together): "
                         "decode probes at batch 1 only; it serves one request at a time (a simulation of it "
                         "needs --max-num-seqs 1)")
    return cal


def with_provenance(cal: Calibration, url: str, model: str, plan: ProbePlan) -> CostProfile:
    from dataclasses import asdict, replace


    pre, dec = cal.error_summary("prefill"), cal.error_summary("decode")
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    note = (f"CALIBRATED {when[:10]} by slobench calibrate from {len(cal.probes)} probes of {redact_url(url)} "
            f"({model}); held-out error: prefill TTFT median {pre[0]:.1%}, decode step median "
            f"{dec[0]:.1%}. Request overhead outside the steps (HTTP, parsing, SSE): "
            f"{cal.request_overhead_s * 1e3:.2f} ms, not a step: --simulate and plan add it to every time after the send.")
    prov = {
        "kind": "calibrated", "url": redact_url(url), "model": model, "date": when, "wall_s": round(cal.wall_s, 1),
        "plan": asdict(plan), "request_overhead_s": cal.request_overhead_s,
        "held_out_error": {"prefill_median": pre[0], "prefill_max": pre[1], "decode_median": dec[0],
                           "decode_max": dec[1]},
        "probes": [{"kind": p.kind, "label": p.label, "measured_s": p.measured_s, "predicted_s": p.predicted_s,
                    "held_out": p.held_out, "row": dict(zip(COLUMNS, p.row, strict=True))} for p in cal.probes],
        "notes": cal.notes, "round_speeds": cal.round_speeds,
    }
    if cal.max_num_seqs is not None:
        prov["served_max_num_seqs"] = cal.max_num_seqs  # a simulation above it is another server (calibrated_flags)
    return replace(cal.profile, note=note, provenance=prov)


def print_table(cal: Calibration, write: Callable[[str], None] = print) -> None:
    p = cal.profile
    write(f"fit ({sum(not q.held_out for q in cal.probes)} probes; {sum(q.held_out for q in cal.probes)} held out):")
    write(f"  a  per step             {p.step_overhead_s * 1e3:10.4f} ms")
    write(f"  b  per prefill token    {p.per_prefill_token_s * 1e6:10.3f} us")
    write(f"  c  per decode sequence  {p.per_decode_seq_s * 1e6:10.3f} us")
    write(f"  d  per context token    {p.per_context_token_s * 1e9:10.3f} ns")
    write(f"  f  per attention pair   {p.attention_per_pair_s * 1e9:10.4f} ns")
    write(f"  o  per request (HTTP)   {cal.request_overhead_s * 1e3:10.4f} ms   (not a step: not in the profile)")
    write(f"{'probe':<36} {'measured':>10} {'predicted':>10} {'error':>8}")
    for q in cal.probes:
        mark = "  held out" if q.held_out else ""
        write(f"{q.kind + ' ' + q.label:<36} {q.measured_s * 1e3:8.2f}ms {q.predicted_s * 1e3:8.2f}ms "  # type: ignore[operator]
              f"{q.error:+7.1%}{mark}")
    for kind in ("prefill", "decode"):
        med, worst, n = cal.error_summary(kind)
        write(f"held-out {kind:<7} error: median {med:.1%}, max {worst:.1%} over {n} probes")
    if cal.round_speeds:
        write("rounds of the same probes against their median: " + ", ".join(f"x{x:.2f}" for x in cal.round_speeds))
    write(f"wall time {cal.wall_s:.0f} s")
