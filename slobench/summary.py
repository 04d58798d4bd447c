"""Turn a run's records into the summary written to summary.json and printed in tables."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from slobench.metrics import RecordArrays, achieved_send_rps, describe, quantiles, throughput
from slobench.records import RequestRecord
from slobench.slo import SLO, attainment, quantile_ci, samples_beyond

# The client is called the bottleneck when its own send lateness p99 exceeds this, or 5% of the TTFT SLO
# if that is larger. Why 10 ms: at typical TTFT SLOs (>=200 ms) it is a <5% distortion of the tightest
# number we judge, and a healthy asyncio client here keeps p99 under 2 ms even at 500 req/s
# (benchmarks/client_overhead.py), so 10 ms means the event loop was genuinely starved.
LATENESS_P99_LIMIT_S = 0.010
# ... or when it sent at a rate more than 5% below the one scheduled.
ACHIEVED_RATE_MIN_FRACTION = 0.95


def lateness_limit_s(slo: SLO | None) -> float:
    if slo is not None and slo.ttft_s is not None:
        return max(LATENESS_P99_LIMIT_S, 0.05 * slo.ttft_s)
    return LATENESS_P99_LIMIT_S


def summarize(records: Sequence[RequestRecord], slo: SLO | None, *, seed: int = 0) -> dict[str, Any]:
    a = RecordArrays.from_records(records)
    tp = throughput(a)
    statuses = Counter(str(s) for s in a.status)
    errors = error_kinds(r.error for r in records if r.error and not r.is_warmup)
    out: dict[str, Any] = {
        "num_requests": len(a),
        "num_warmup": sum(1 for r in records if r.is_warmup),
        "num_ok": int(a.is_ok.sum()),
        "status_counts": dict(statuses),
        "error_counts": errors,
        "duration_s": tp.duration_s,
        "offered_rps": tp.offered_rps,
        "achieved_send_rps": achieved_send_rps(a),
        "request_throughput_rps": tp.request_rps,
        "output_token_throughput_tps": tp.output_tokens_per_s,
        "total_token_throughput_tps": tp.total_tokens_per_s,
        "ttft_s": _with_ci(a.ttft_s, seed),
        "ttft_from_scheduled_s": _with_ci(a.ttft_from_scheduled_s, seed),
        "tpot_s": _with_ci(a.tpot_s, seed),
        "itl_s": describe(a.itl_s),
        "e2e_s": _with_ci(a.e2e_s, seed),
        "e2e_from_scheduled_s": describe(a.e2e_from_scheduled_s),
        "output_tokens": describe(a.output_tokens.astype(float)),
        "prompt_tokens": describe(a.prompt_tokens.astype(float)),
        "client": client_health(a, slo),
    }
    waited = a.queued_s[a.queued_s > 1e-4]  # not the microseconds an uncontended acquire takes
    if len(waited):  # an in-flight cap, a closed loop's slots or --rate-limit held these back on purpose
        out["deliberate_waits"] = {"num": int(len(waited)), **quantiles(waited), "max": float(waited.max())}
    cache = prefix_cache(a)
    if cache is not None:
        out["prefix_cache"] = cache
    replicas = per_replica(a, slo)
    if replicas:
        out["per_replica"] = replicas
    tags = per_tag(a, slo)
    if tags:
        out["per_tag"] = tags
    drift = queue_drift(a)
    if drift is not None:
        out["queue_drift"] = drift
    fidelity = length_fidelity(records)
    if fidelity is not None:
        out["lengths"] = fidelity
    if slo is not None:
        out["slo"] = slo.to_dict()
        out["attainment"] = attainment(a, slo, duration_s=tp.duration_s, seed=seed).to_dict()
    return out


def breakdown(a: RecordArrays, slo: SLO | None, keys: np.ndarray, label: str, ttft_s: np.ndarray, *,
              keep: Callable[[Any], bool] = bool, at_least: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """Requests, failures, TTFT p50/p99 (of `ttft_s`, the caller's clock), TPOT p50 and attainment per
    distinct key of `keys` (aligned with `a`) that `keep` accepts; empty below `at_least` keys. The summary
    and the report's rate table both break fleets and classes down with it."""
    ids = sorted(k for k in dict.fromkeys(keys.tolist()) if keep(k))
    if len(ids) < at_least:
        return []
    met = slo.meets(a) if slo is not None else None
    tpot = a.tpot_s
    out = []
    for k in ids:
        sel = keys == k
        t = ttft_s[sel]
        q = quantiles(t[np.isfinite(t)])
        p = tpot[sel]
        p = p[np.isfinite(p)]
        row: dict[str, Any] = {label: k, "num_requests": int(sel.sum()), "num_ok": int(a.is_ok[sel].sum()),
                               "ttft_p50_s": q.get("p50"), "ttft_p99_s": q.get("p99"),
                               "tpot_p50_s": float(np.median(p)) if len(p) else None}  # fmt: skip
        if met is not None:
            row["attainment"] = float(met[sel].mean())
        out.append(row)
    return out


def ttft_on_slo_clock(a: RecordArrays, slo: SLO | None) -> np.ndarray:
    """TTFT on the clock the SLO judges by; from the scheduled arrival when there is no SLO (no hiding).
    The terminal's and the report's per-replica and per-class columns both use it."""
    return a.ttft_s if slo is not None and slo.clock == "sent" else a.ttft_from_scheduled_s


MAX_ERROR_KINDS = 10
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def error_kind(text: str) -> str:
    """The kind of an error, for counting: the text before its first colon (the detail after it varies per
    request), numbers replaced by N so "cut off after 3 tokens" and "after 7 tokens" are one kind, but an
    HTTP status kept whole ("HTTP 500", "HTTP 429 (rate limited, Retry-After 1)")."""
    head = text.split(":", 1)[0].strip()[:120]
    return head if head.startswith("HTTP ") else _DIGITS.sub("N", head)


def error_kinds(errors: Iterable[str]) -> dict[str, int]:
    """The most common error kinds and their counts, as the terminal and the report both show them."""
    return dict(Counter(error_kind(e) for e in errors).most_common(MAX_ERROR_KINDS))


def per_replica(a: RecordArrays, slo: SLO | None) -> list[dict[str, Any]]:
    """For a routed fleet: each replica's requests, failures, TTFT p50/p99 (from sent), TPOT p50 and
    attainment, so a hot spot (one replica holding the popular prefix, say) shows. Empty when no record
    names a replica."""
    return breakdown(a, slo, a.replica, "replica", ttft_on_slo_clock(a, slo), keep=lambda k: k >= 0)


def per_tag(a: RecordArrays, slo: SLO | None) -> list[dict[str, Any]]:
    """The same per request class or phase (the records' tags), when a run has two or more: a mix where
    the long-document class misses while chat is fine reads as one number otherwise."""
    return breakdown(a, slo, a.tag, "tag", ttft_on_slo_clock(a, slo), at_least=2)


def several_tags(a: RecordArrays) -> bool:
    return len({t for t in a.tag.tolist() if t}) > 1


# A run whose last quarter of arrivals waited this many times longer for a first token than its first
# quarter (and at least DRIFT_MIN_S longer) was past capacity: its queue grew for as long as it ran.
DRIFT_RATIO = 2.0
DRIFT_MIN_S = 0.05


def queue_drift(a: RecordArrays) -> dict[str, Any] | None:
    """TTFT (from the schedule) of the first and last quarter of arrivals. When the last is over DRIFT_RATIO
    times the first, the server is past capacity at this rate: the queue grows for as long as the run
    lasts, so attainment here depends on the run's length as much as on the server (on the simulated chat
    engine: 0.97x at 20 req/s, 2.9x at 36, 6.6x at 40). Skipped for runs whose records carry several tags
    (phases change the load on purpose; classes could be either, so they are left alone too) and for
    fewer than 40 requests."""
    t = a.ttft_from_scheduled_s
    if len(t) < 40 or several_tags(a):
        return None
    q = len(t) // 4
    first, last = t[:q][np.isfinite(t[:q])], t[-q:][np.isfinite(t[-q:])]
    if len(first) == 0 or len(last) == 0:
        return None
    f, l_ = float(np.median(first)), float(np.median(last))
    ratio = l_ / f if f > 0 else float("inf")
    return {"ttft_p50_first_quarter_s": f, "ttft_p50_last_quarter_s": l_, "ratio": ratio,
            "overloaded": bool(ratio > DRIFT_RATIO and l_ - f > DRIFT_MIN_S)}  # fmt: skip


# Served prompt lengths (usage.prompt_tokens) further than this from the asked ones at the median flag a run:
# text prompts on a server without a tokenizer given, or a chat template larger than guessed.
PROMPT_MISMATCH = 0.05


def length_fidelity(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Asked against delivered lengths, over the measured requests that completed.

    output: max_tokens asked vs tokens produced (p50/p99) and the share cut short, for servers that cannot
    be made to ignore EOS (produced < asked there is the model stopping, not a failure; TPOT uses produced
    tokens). prompt: input tokens asked vs the server's usage.prompt_tokens where reported, flagged past 5%
    at the median. usage_disagreements: completions whose usage count was not believed (below the number
    of streamed content events, or above max_tokens) or differs from what was counted."""
    return lengths_of((r.status, r.is_warmup, r.max_tokens, r.output_tokens, r.input_tokens, r.prompt_tokens,
                       r.usage_output_tokens) for r in records)


LengthRow = tuple[str, bool, int, int, int, "int | None", "int | None"]


def lengths_of(rows: Iterable[LengthRow]) -> dict[str, Any] | None:
    """length_fidelity over plain rows (status, is_warmup, max_tokens, output_tokens, input_tokens,
    prompt_tokens, usage_output_tokens): the report's column reader calls it on record dicts, so the
    terminal and the HTML say the same."""
    rs = [r for r in rows if not r[1] and r[0] == "ok" and (r[2] or 0) > 0]
    if not rs:
        return None
    asked = np.array([r[2] for r in rs], dtype=float)
    got = np.array([r[3] for r in rs], dtype=float)
    out: dict[str, Any] = {
        "output": {
            "num": len(rs),
            "requested_p50": float(np.median(asked)), "requested_p99": float(np.quantile(asked, 0.99)),
            "produced_p50": float(np.median(got)), "produced_p99": float(np.quantile(got, 0.99)),
            "share_cut_short": float(np.mean(got < asked)),
        },
        "usage_disagreements": sum(1 for r in rs if r[6] is not None and r[6] != r[3]),
    }
    pairs = [(r[4], r[5]) for r in rs if (r[4] or 0) > 0 and r[5] is not None]
    if pairs:
        want = np.array([p[0] for p in pairs], dtype=float)
        served = np.array([p[1] for p in pairs], dtype=float)
        rel = float(np.median(served / want - 1.0))
        out["prompt"] = {
            "num": len(pairs), "requested_p50": float(np.median(want)), "served_p50": float(np.median(served)),
            "median_relative_difference": rel, "mismatch": bool(abs(rel) > PROMPT_MISMATCH),
        }
    return out


def prefix_cache(a: RecordArrays) -> dict[str, Any] | None:
    """How much of the prompts the server's prefix cache served, and TTFT with a hit against without.
    None when the server reported no cached-token counts (usage.prompt_tokens_details.cached_tokens)."""
    known = a.is_ok & np.isfinite(a.cached_tokens)
    if not known.any():
        return None
    cached = a.cached_tokens[known]
    prompt = a.prompt_tokens[known].astype(float)
    hit = cached > 0
    ttft = a.ttft_s[known]

    def p50(x: np.ndarray) -> float | None:
        x = x[np.isfinite(x)]
        return float(np.median(x)) if len(x) else None

    return {
        "num_reported": int(known.sum()),
        "num_hits": int(hit.sum()),
        "cached_token_share": float(cached.sum() / prompt.sum()) if prompt.sum() > 0 else 0.0,
        "ttft_p50_hit_s": p50(ttft[hit]),
        "ttft_p50_miss_s": p50(ttft[~hit]),
    }


def _with_ci(x: np.ndarray, seed: int) -> dict[str, Any]:
    d: dict[str, Any] = describe(x)
    n = int(np.count_nonzero(~np.isnan(x)))
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        d[f"{name}_ci"] = quantile_ci(x, q, seed=seed)
        d[f"{name}_beyond"] = samples_beyond(n, q)
    return d


def client_health(a: RecordArrays, slo: SLO | None) -> dict[str, Any]:
    late = a.lateness_s
    q = quantiles(late)
    limit = lateness_limit_s(slo)
    offered = throughput(a).offered_rps
    achieved = achieved_send_rps(a)
    reasons = []
    p99 = q.get("p99")
    if p99 is not None and p99 > limit:
        reasons.append(f"send lateness p99 {p99 * 1e3:.1f} ms > {limit * 1e3:.0f} ms")
    if np.isfinite(offered) and np.isfinite(achieved) and achieved < ACHIEVED_RATE_MIN_FRACTION * offered:
        reasons.append(f"sent {achieved:.1f} req/s of {offered:.1f} scheduled")
    return {
        "lateness_s": {**q, "max": float(np.nanmax(late)) if np.any(~np.isnan(late)) else None},
        "lateness_limit_s": limit,
        "is_bottleneck": bool(reasons),
        "warning": (
            "CLIENT WAS THE BOTTLENECK (" + "; ".join(reasons) + "): these numbers describe the load "
            "generator, not the server. Lower the rate, give the client cores of its own and spread it over them "
            "(--client-workers N), or use a cap."
        )
        if reasons
        else None,
    }
