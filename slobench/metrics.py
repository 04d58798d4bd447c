"""Vectorised per-request metrics: TTFT, TPOT, ITL, E2E, throughput, client lateness.

Definitions follow vLLM's benchmark and DistServe's evaluation code (see NOTES-statistics):
  TTFT = first content token - request sent          (and, coordinated-omission-free, - scheduled)
  TPOT = (done - first token) / (output tokens - 1)  (0 when there is one output token)
  ITL  = every gap between consecutive content chunks (a distribution, not a per-request mean)
Records become numpy columns once, here; everything downstream works on `RecordArrays`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slobench.records import RequestRecord

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class RecordArrays:
    """Columns over the measured (non-warm-up) records, in arrival order. NaN where a time is absent."""

    request_id: np.ndarray
    scheduled_s: np.ndarray
    sent_s: np.ndarray
    first_token_s: np.ndarray
    done_s: np.ndarray
    queued_s: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray  # float: prompt tokens from the server's prefix cache, NaN where not reported
    replica: np.ndarray  # int: the replica that served each request in a routed fleet, -1 where none
    tag: np.ndarray  # object: each request's tag (request class or phase), "" where none
    is_ok: np.ndarray
    status: np.ndarray  # str
    itl_s: np.ndarray  # all chunk gaps of successful requests, flattened
    itl_owner: np.ndarray  # index (into the columns above) of the request each gap belongs to

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], *, include_warmup: bool = False) -> RecordArrays:
        recs = [r for r in records if include_warmup or not r.is_warmup]
        recs.sort(key=lambda r: (r.scheduled_s, r.request_id))
        nan = float("nan")

        def col(get: object) -> np.ndarray:
            return np.fromiter((nan if (v := get(r)) is None else v for r in recs), float, len(recs))  # type: ignore[operator]

        itl_s, itl_owner = chunk_gaps([r.chunk_times_s for r in recs], [r.status == "ok" for r in recs])
        return cls(
            request_id=np.fromiter((r.request_id for r in recs), np.int64, len(recs)),
            scheduled_s=col(lambda r: r.scheduled_s),
            sent_s=col(lambda r: r.sent_s),
            first_token_s=col(lambda r: r.first_token_s),
            done_s=col(lambda r: r.done_s),
            queued_s=col(lambda r: r.queued_s),
            output_tokens=np.fromiter((r.output_tokens for r in recs), np.int64, len(recs)),
            prompt_tokens=np.fromiter(
                (r.prompt_tokens if r.prompt_tokens is not None else r.input_tokens for r in recs), np.int64, len(recs)
            ),
            cached_tokens=col(lambda r: r.cached_tokens),
            replica=np.fromiter((-1 if r.replica is None else r.replica for r in recs), np.int64, len(recs)),
            tag=np.array([r.tag for r in recs], dtype=object),
            is_ok=np.fromiter((r.status == "ok" for r in recs), bool, len(recs)),
            status=np.array([r.status for r in recs], dtype=object),
            itl_s=itl_s,
            itl_owner=itl_owner,
        )

    def __len__(self) -> int:
        return len(self.request_id)

    # --- per-request latencies (NaN for requests that never produced the needed times) ---
    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.sent_s

    @property
    def ttft_from_scheduled_s(self) -> np.ndarray:
        return self.first_token_s - self.scheduled_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.done_s - self.sent_s

    @property
    def e2e_from_scheduled_s(self) -> np.ndarray:
        return self.done_s - self.scheduled_s

    @property
    def tpot_s(self) -> np.ndarray:
        n = self.output_tokens.astype(float)
        decode = self.done_s - self.first_token_s
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(n > 1, decode / (n - 1), 0.0)
        return np.where(np.isnan(decode), np.nan, t)

    @property
    def lateness_s(self) -> np.ndarray:
        """How late the client sent each request, not counting deliberate waits for an in-flight cap."""
        return self.sent_s - self.scheduled_s - self.queued_s


def chunk_gaps(chunks: Sequence[Sequence[float]], is_ok: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Every gap between consecutive chunks of each successful request, and the index of its request.

    One np.diff over all chunk times, with the gaps between one request's last chunk and the next
    request's first dropped: a per-request loop of np.diff costs more than the JSON parsing at 100k."""
    with_itl = [i for i, c in enumerate(chunks) if is_ok[i] and len(c) > 1]
    if not with_itl:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    lengths = np.array([len(chunks[i]) for i in with_itl], dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(chunks[i] for i in with_itl), float, int(lengths.sum()))
    gaps = np.delete(np.diff(flat), np.cumsum(lengths)[:-1] - 1)
    owners = np.repeat(np.array(with_itl, dtype=np.int64), lengths - 1)
    return gaps, owners


def quantiles(x: np.ndarray, qs: Sequence[float] = QUANTILES) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {f"p{_qname(q)}": None for q in qs}
    return {f"p{_qname(q)}": float(v) for q, v in zip(qs, np.quantile(x, qs), strict=True)}


def _qname(q: float) -> str:
    s = f"{q * 100:g}"
    return s.replace(".", "_")


def describe(x: np.ndarray) -> dict[str, float | None]:
    """mean and the standard quantiles of the finite values of x."""
    finite = x[~np.isnan(x)]
    out: dict[str, float | None] = {"mean": float(finite.mean()) if len(finite) else None}
    out.update(quantiles(finite))
    out["max"] = float(finite.max()) if len(finite) else None
    return out


@dataclass(frozen=True, slots=True)
class Throughput:
    duration_s: float  # first send to last completion among measured requests
    request_rps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    offered_rps: float  # from the schedule: requests / span of scheduled times


def throughput(a: RecordArrays) -> Throughput:
    ok = a.is_ok
    if len(a) == 0 or not np.any(~np.isnan(a.sent_s)):
        return Throughput(0.0, 0.0, 0.0, 0.0, 0.0)
    start = np.nanmin(a.sent_s)
    end = np.nanmax(a.done_s) if np.any(~np.isnan(a.done_s)) else start
    dur = max(end - start, 1e-9)
    out_tok = float(a.output_tokens[ok].sum())
    in_tok = float(a.prompt_tokens[ok].sum())
    sched_span = float(a.scheduled_s.max() - a.scheduled_s.min()) if len(a) > 1 else 0.0
    offered = (len(a) - 1) / sched_span if sched_span > 0 else float("nan")
    return Throughput(
        duration_s=float(dur),
        request_rps=float(ok.sum()) / dur,
        output_tokens_per_s=out_tok / dur,
        total_tokens_per_s=(out_tok + in_tok) / dur,
        offered_rps=offered,
    )


def achieved_send_rps(a: RecordArrays) -> float:
    """The rate at which the client actually sent (it should equal the offered rate in open loop)."""
    sent = a.sent_s[~np.isnan(a.sent_s)]
    if len(sent) < 2:
        return float("nan")
    span = float(sent.max() - sent.min())
    return (len(sent) - 1) / span if span > 0 else float("nan")
