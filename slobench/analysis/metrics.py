"""Vectorised per-request metrics: TTFT, TPOT, ITL, E2E, throughput, client lateness.

Definitions follow vLLM's benchmark and DistServe's evaluation code (see NOTES-statistics):
  TTFT = first content token - request sent          (and, coordinated-omission-free, - scheduled)
  TPOT = (done - first token) / (output tokens - 1)  (0 when there is one output token)
  TTFA = first answer token - request sent           (a reasoning model's first token after its reasoning;
                                                      TTFT where the stream carried no reasoning)
  ITL  = every gap between consecutive content chunks (a distribution, not a per-request mean)
  E2E  = done - request sent                         (and - scheduled)
Latencies describe completed requests only (failures are counted apart); TPOT and ITL need a stream.
Records become numpy columns once, here; everything downstream works on `RecordArrays`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slobench.run.columnar import Columns, StepChunks, columns_of_rows, spans
from slobench.run.records import RequestRecord

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
    gaps: np.ndarray | GapCounts  # all chunk gaps of successful requests, request by request (`itl_s`)
    is_whole: np.ndarray  # bool: the answer came in one piece, not streamed (no chunks, first token = done)
    # the reasoning channel, where a stream carried one: NaN in rows without (`has_reasoning`)
    first_reasoning_s: np.ndarray
    first_answer_s: np.ndarray  # NaN also where the request reasoned and never answered
    reasoning_tokens: np.ndarray
    reasoning_source: np.ndarray  # object: "usage" or "events" (`reasoning_tokens_source`), None where none

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], *, include_warmup: bool = False) -> RecordArrays:
        return cls.from_rows([r for r in records if include_warmup or not r.is_warmup], getattr)

    @classmethod
    def from_rows(cls, rows: Sequence[Any], get: Callable[[Any, str], Any]) -> RecordArrays:
        """Records in memory (`get=getattr`) or parsed requests.jsonl lines (`get=dict.get`): through
        `Columns`, so every source meets the same rules in `from_columns`."""
        return cls.from_columns(columns_of_rows(rows, get), consume=True)

    @classmethod
    def from_columns(cls, c: Columns, *, consume: bool = False) -> RecordArrays:
        """The one column reader: records as columns (requests.parquet read whole, or rows gathered by
        `columns_of_rows`) become these columns, in arrival order (ties by request id), with no Python
        object per request. consume: `c` is the caller's to give away, and the gaps between its chunk
        times are written over them (a million records' chunk times are 290 MB; the gaps nearly as much)."""
        v = c.values
        if np.isnan(v["scheduled_s"]).any() or np.isnan(v["request_id"]).any():
            raise ValueError("a record without scheduled_s or request_id")
        rid = v["request_id"].astype(np.int64)
        order = np.lexsort((rid, v["scheduled_s"]))
        if (np.diff(order) != 1).any():
            c, consume = c.take(order), True
        v = c.values

        def ints(key: str, default: int) -> np.ndarray:
            x = v[key]
            return np.where(np.isnan(x), default, x).astype(np.int64)

        status = v["status"]
        status = np.where(status.astype(bool), status, "ok").astype(object)
        is_ok = np.asarray(status == "ok", dtype=bool)
        lengths = np.diff(c.chunk_offsets)
        first, done = v["first_token_s"], v["done_s"]
        prompt = np.where(np.isnan(v["prompt_tokens"]), np.nan_to_num(v["input_tokens"]), v["prompt_tokens"])
        tag = v["tag"]
        return cls(
            request_id=rid[order],
            scheduled_s=v["scheduled_s"],
            sent_s=v["sent_s"],
            first_token_s=first,
            done_s=done,
            queued_s=np.nan_to_num(v["queued_s"]),
            output_tokens=ints("output_tokens", 0),
            prompt_tokens=prompt.astype(np.int64),
            cached_tokens=v["cached_tokens"],
            replica=ints("replica", -1),
            tag=np.where(tag.astype(bool), tag, "").astype(object),
            is_ok=is_ok,
            status=status,
            gaps=chunk_gaps(c.chunk_times_s, lengths, is_ok, in_place=consume) if c.steps is None else
            step_gaps(c.steps, lengths, is_ok),
            is_whole=(lengths == 0) & (first == done),
            first_reasoning_s=v["first_reasoning_s"],
            first_answer_s=v["first_answer_s"],
            reasoning_tokens=v["reasoning_tokens"],
            reasoning_source=v["reasoning_tokens_source"],
        )

    def __len__(self) -> int:
        return len(self.request_id)

    @property
    def itl_s(self) -> np.ndarray:
        """Every chunk gap of the successful requests, flattened, request by request."""
        return self.gaps if isinstance(self.gaps, np.ndarray) else self.gaps.expand()

    # --- per-request latencies: NaN for a failed request (its times describe the failure, not the service:
    # an HTTP 500 in 7 ms is no 7 ms E2E) and for requests that never produced the needed times ---
    def completed(self, x: np.ndarray) -> np.ndarray:
        return np.where(self.is_ok, x, np.nan)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.completed(self.first_token_s - self.sent_s)

    @property
    def ttft_from_scheduled_s(self) -> np.ndarray:
        return self.completed(self.first_token_s - self.scheduled_s)

    @property
    def e2e_s(self) -> np.ndarray:
        return self.completed(self.done_s - self.sent_s)

    @property
    def e2e_from_scheduled_s(self) -> np.ndarray:
        return self.completed(self.done_s - self.scheduled_s)

    @property
    def tpot_s(self) -> np.ndarray:
        """NaN also for a response of several tokens that came whole (no stream): their times were never
        seen, and a TPOT of 0 would meet any TPOT target."""
        return self.per_token_s(self.first_token_s, self.output_tokens)

    def per_token_s(self, first_s: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        """(done - first) / (tokens - 1) of each completed request: 0 for one token, NaN where a time is
        missing or several tokens came whole."""
        n = num_tokens.astype(float)
        decode = self.done_s - first_s
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(n > 1, decode / (n - 1), 0.0)
        return np.where(np.isnan(decode) | (self.is_whole & (n > 1)) | ~self.is_ok, np.nan, t)

    # --- the answer apart from the reasoning: in a row without reasoning the answer is the whole output ---
    @property
    def has_reasoning(self) -> np.ndarray:
        return ~np.isnan(self.reasoning_tokens) | ~np.isnan(self.first_reasoning_s)

    @property
    def first_answer_or_token_s(self) -> np.ndarray:
        return np.where(self.has_reasoning, self.first_answer_s, self.first_token_s)

    @property
    def ttfa_s(self) -> np.ndarray:
        """Time to the first answer token, from the send: TTFT where there was no reasoning; NaN where the
        request reasoned and never answered (`no_answer`)."""
        return self.completed(self.first_answer_or_token_s - self.sent_s)

    @property
    def ttfa_from_scheduled_s(self) -> np.ndarray:
        return self.completed(self.first_answer_or_token_s - self.scheduled_s)

    @property
    def answer_tokens(self) -> np.ndarray:
        return self.output_tokens - np.nan_to_num(self.reasoning_tokens).astype(np.int64)

    @property
    def answer_tpot_s(self) -> np.ndarray:
        """TPOT of the answer alone: (done - first answer token) / (answer tokens - 1), as `tpot_s`."""
        return self.per_token_s(self.first_answer_or_token_s, self.answer_tokens)

    @property
    def no_answer(self) -> np.ndarray:
        """Completed requests that reasoned and ended without an answer token."""
        return self.is_ok & self.has_reasoning & np.isnan(self.first_answer_s)

    @property
    def lateness_s(self) -> np.ndarray:
        """How late the client sent each request, not counting deliberate waits for an in-flight cap."""
        return self.sent_s - self.scheduled_s - self.queued_s


GAP_BLOCK = 1 << 20  # chunk times differenced at a time: the block's gaps stay in cache until kept


def chunk_gaps(flat_s: np.ndarray, lengths: np.ndarray, is_ok: np.ndarray, *, in_place: bool = False) -> np.ndarray:
    """Every gap between consecutive chunks of each successful request, from all requests' chunk times
    concatenated (`flat_s`) and each request's count: the whole run differenced, less the gaps into a
    request's first chunk (they straddle two requests) and those of failures. Differenced a block at a time
    into one array of the gaps kept: a run's tens of millions of gaps are written once, not differenced
    whole and then copied. in_place: that array is the front of `flat_s` itself (its times are lost). A
    block is differenced before its kept gaps are written, and they land before the block's end, ahead of
    any time still to be read."""
    counted = is_ok & (lengths > 1)
    if len(flat_s) < 2 or not counted.any():
        return np.zeros(0)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    num = int((lengths[counted] - 1).sum())  # a counted request's gaps: one fewer than its chunks
    own = in_place and flat_s.dtype == np.float64 and flat_s.flags.writeable and flat_s.flags.c_contiguous
    out = flat_s[:num] if own else np.empty(num)
    n = len(flat_s) - 1  # gap j: flat_s[j + 1] - flat_s[j], the gap that ends at chunk j + 1
    block = np.empty(min(GAP_BLOCK, n))
    at = 0
    for lo in range(0, n, GAP_BLOCK):
        hi = min(lo + GAP_BLOCK, n)
        c0, c1 = lo + 1, hi + 1  # the chunks these gaps end at; the requests holding them, r0 to r1
        r0, r1 = int(np.searchsorted(ends, c0, side="right")), int(np.searchsorted(ends, c1 - 1, side="right"))
        seg = np.minimum(ends[r0:r1 + 1], c1) - np.maximum(starts[r0:r1 + 1], c0)
        keep = np.repeat(counted[r0:r1 + 1], seg)  # per chunk of the block: its request is counted ...
        first = starts[r0:r1 + 1]
        keep[first[(first >= c0) & (first < c1)] - c0] = False  # ... and it is not the request's first
        d = np.subtract(flat_s[c0:c1], flat_s[lo:hi], out=block[:hi - lo])
        kept = d[keep]
        out[at:at + len(kept)] = kept
        at += len(kept)
    return out


GAP_COUNTS_MIN = 1 << 22  # gaps from which shared step times are counted (`GapCounts`), not expanded


@dataclass(frozen=True, slots=True)
class GapCounts:
    """A run's inter-token gaps as values with counts, for chunk times that are slices of shared step times
    (`StepChunks`): a gap within a slice is a difference of consecutive step times, counted once per
    request whose slice spans it, so a million simulated requests' 156 million gaps are a few million
    pairs. Laid out request by request they are `values[spans(starts, lengths)]` (`expand`); `total` is
    their sum as `np.sum` of that array gives it (`pairwise_sum`), so `describe` gives what
    `describe(self.expand())` does, bit for bit."""

    values: np.ndarray  # the step times' differences, then the gaps between two slices of a request
    counts: np.ndarray
    total: float
    starts: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return int(self.counts.sum())

    def expand(self) -> np.ndarray:
        """The gaps laid out, request by request (what `chunk_gaps` makes of the chunk times)."""
        return self.values[spans(self.starts, self.lengths)]

    def describe(self) -> dict[str, float | None]:
        """`describe` of the gaps laid out: np.quantile's order statistics read off the running counts of
        the values in order, interpolated as `windowed_quantiles` does."""
        n = len(self)
        order = np.argsort(self.values)
        upto = self.counts[order]
        np.cumsum(upto, out=upto)
        q = np.asarray(QUANTILES, dtype=float)
        virtual = (n - 1) * q
        lo = np.floor(virtual).astype(np.int64)
        out: dict[str, float | None] = {"mean": float(np.float64(self.total) / n)}
        for j, qj in enumerate(QUANTILES):
            rank = np.minimum([lo[j], lo[j] + 1], n - 1)
            pair = self.values[order[np.searchsorted(upto, rank, side="right")]]
            out[f"p{_qname(qj)}"] = float(np.quantile(pair, virtual[j] - np.floor(virtual[j])))
        out["max"] = float(np.max(self.values, where=self.counts > 0, initial=-np.inf))
        return out


def step_gaps(steps: StepChunks, lengths: np.ndarray, is_ok: np.ndarray) -> np.ndarray | GapCounts:
    """`chunk_gaps` of chunk times held as `StepChunks`: laid out where there are few (or any is not
    finite), else as `GapCounts`: every difference of consecutive step times (each counted once per
    request whose slice spans it; none for most of those between two replicas' tables), then the gaps
    between two slices of one request."""
    counted = is_ok & (lengths > 1)
    num = int((lengths[counted] - 1).sum())
    if num < GAP_COUNTS_MIN:
        return chunk_gaps(steps.times(), lengths, is_ok, in_place=True)
    per = np.diff(steps.ends)
    kept = np.repeat(counted, per)  # per slice: its request's gaps are counted
    start, length = steps.starts[kept], steps.lengths[kept]
    pool = steps.pool
    size = len(pool) + 1
    # between two slices of one request: from the last time of one to the first of the next
    later = np.ones(len(start), dtype=bool)
    later[(np.cumsum(per[counted]) - per[counted])[per[counted] > 0]] = False
    prev = np.flatnonzero(later) - 1
    across = pool[start[later]] - pool[start[prev] + length[prev] - 1]
    inner = max(size - 2, 0)  # gap p < inner: pool[p + 1] - pool[p]
    gaps = np.empty(inner + len(across))
    np.subtract(pool[1:], pool[:-1], out=gaps[:inner])
    gaps[inner:] = across
    # within a slice: gap p counted once per kept slice that spans it
    spanning = length > 1
    spans_at = np.bincount(start[spanning], minlength=size)
    spans_at -= np.bincount(start[spanning] + length[spanning] - 1, minlength=size)
    np.cumsum(spans_at, out=spans_at)
    weights = np.ones(len(gaps), dtype=np.int64)
    weights[:inner] = spans_at[:inner]
    del spans_at
    if int(weights.sum()) != num:
        raise AssertionError(f"{int(weights.sum())} gaps counted of {num}")
    # laid out: per slice, the gap from the request's slice before (if any), then those within it
    g_start = np.empty(2 * len(start), dtype=np.int64)
    g_len = np.empty(2 * len(start), dtype=np.int64)
    g_start[0::2] = inner + np.cumsum(later) - 1
    g_len[0::2] = later
    g_start[1::2], g_len[1::2] = start, length - 1
    total = pairwise_sum(_gap_blocks(gaps, g_start, g_len), num)
    used = weights > 0
    if not (np.isfinite(total) and np.isfinite(np.max(gaps, where=used, initial=-np.inf))
            and np.isfinite(np.min(gaps, where=used, initial=np.inf))):
        return chunk_gaps(steps.times(), lengths, is_ok, in_place=True)
    return GapCounts(gaps, weights, total, g_start, g_len)


def _gap_blocks(pool: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """`pool[spans(starts, lengths)]`, about GAP_BLOCK values at a time."""
    ends = np.cumsum(lengths)
    lo = 0
    while lo < len(lengths):
        hi = max(int(np.searchsorted(ends, ends[lo] + GAP_BLOCK, side="right")), lo + 1)
        yield pool[spans(starts[lo:hi], lengths[lo:hi])]
        lo = hi


PAIRWISE_LEAF = 1 << 16  # values summed by one np.add.reduce call in `pairwise_sum`


def pairwise_sum(blocks: Iterator[np.ndarray], n: int) -> float:
    """`np.add.reduce` of the `n` values the blocks hold, one after another, bit for bit, without laying
    them out: numpy sums a contiguous array by halves (each cut at a multiple of 8) down to blocks of 128,
    so the same halving down to PAIRWISE_LEAF values, each summed by numpy, makes the same additions."""
    held = np.zeros(0)  # what the blocks gave that is not summed yet

    def take(k: int) -> np.ndarray:
        nonlocal held
        if len(held) < k:
            more = [held]
            have = len(held)
            while have < k:
                more.append(next(blocks))
                have += len(more[-1])
            held = np.concatenate(more)
        out, held = held[:k], held[k:]
        return out

    def halves(k: int) -> float:
        if k <= PAIRWISE_LEAF:
            return float(np.add.reduce(take(k))) if k else 0.0
        h = k // 2
        h -= h % 8
        return halves(h) + halves(k - h)

    return halves(n)


def finite_values(x: np.ndarray) -> np.ndarray:
    """x without its NaNs: x itself when it has none (a run's inter-token gaps are tens of millions of
    values: each copy of them costs hundreds of MB)."""
    if np.isfinite(x.sum()):  # no NaN (nor infinity): known without an array of flags as long as x
        return x
    absent = np.isnan(x)
    return x[~absent] if absent.any() else x


def quantiles(x: np.ndarray, qs: Sequence[float] = QUANTILES) -> dict[str, float | None]:
    """np.quantile's (the 'linear' method) of the finite values of x."""
    x = finite_values(x)
    if len(x) == 0:
        return {f"p{_qname(q)}": None for q in qs}
    values = windowed_quantiles(x, qs) if len(x) >= WINDOWED_MIN else None
    return {f"p{_qname(q)}": float(v) for q, v in zip(qs, np.quantile(x, qs) if values is None else values,
                                                       strict=True)}


WINDOWED_MIN = 1 << 22  # values from which `windowed_quantiles` beats partitioning a copy of them all
SAMPLE_STEP = 64  # every 64th value places the windows


def windowed_quantiles(x: np.ndarray, qs: Sequence[float]) -> np.ndarray | None:
    """`np.quantile(x, qs)` of an x without NaN, bit for bit, without copying x (a run's 36M gaps: 290 MB):
    each quantile's two order statistics are looked for in a window of values placed from a sorted sample
    of every SAMPLE_STEP-th value, 8 standard deviations of the sample's quantile wide. One pass a block at a time
    counts the values below each window and keeps those inside; when a window missed its order statistics
    (a sample the data's own period fooled), None: the caller partitions the whole array. The two values
    are interpolated by np.quantile itself, as a two-value array at the weight it would use (its 'linear'
    virtual index (n - 1) q, less its floor)."""
    n = len(x)
    q = np.asarray(qs, dtype=float)
    virtual = (n - 1) * q
    if not ((virtual >= 0) & (virtual < n - 1)).all():
        return None
    lo = np.floor(virtual).astype(np.int64)
    sample = np.sort(x[::SAMPLE_STEP])
    s = len(sample)
    spread = 8 * np.sqrt(s * q * (1 - q)) + 8
    first = np.floor(lo * (s / n) - spread).astype(np.int64)
    last = np.ceil((lo + 1) * (s / n) + spread).astype(np.int64)
    low_edge = np.where(first > 0, sample[np.clip(first, 0, s - 1)], -np.inf)
    high_edge = np.where(last < s - 1, sample[np.clip(last, 0, s - 1)], np.inf)
    below = np.zeros(len(q), dtype=np.int64)
    inside: list[list[np.ndarray]] = [[] for _ in q]
    for start in range(0, n, GAP_BLOCK):
        block = x[start:start + GAP_BLOCK]
        for j in range(len(q)):
            under = block < low_edge[j]
            below[j] += np.count_nonzero(under)
            inside[j].append(block[~under & (block <= high_edge[j])])
    out = np.empty(len(q))
    for j in range(len(q)):
        window = np.concatenate(inside[j])
        k = lo[j] - below[j]
        if k < 0 or k + 1 >= len(window):
            return None
        pair = np.partition(window, [k, k + 1])[[k, k + 1]]
        out[j] = np.quantile(pair, virtual[j] - np.floor(virtual[j]))
    return out


def _qname(q: float) -> str:
    s = f"{q * 100:g}"
    return s.replace(".", "_")


def describe(x: np.ndarray) -> dict[str, float | None]:
    """mean and the standard quantiles of the finite values of x."""
    finite = finite_values(x)
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
