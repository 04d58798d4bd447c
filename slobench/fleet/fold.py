"""The one fold from what a simulated engine did to a request's record: a token event from a step
(`fold_event`), a token that came another way (`add_token`: a prefill instance's first token, KV landing on
a decode instance), or a run of decode steps taken at once (`fold_run`). Each token is one chunk stamped at
the end of the step that produced it; the first one is the first token.
"""

from __future__ import annotations

from collections.abc import Callable

from reference_engine.engine import TokenEvent
from slobench.fleet.decode_run import DecodeRun
from slobench.run.records import RequestRecord


def add_token(rec: RequestRecord, t_s: float) -> None:
    """One token streamed to `rec`'s client at `t_s`."""
    if rec.first_token_s is None:
        rec.first_token_s = t_s
    rec.chunk_times_s.append(t_s)
    rec.chunk_tokens.append(1)
    rec.output_tokens += 1


def fold_event(rec: RequestRecord, ev: TokenEvent) -> bool:
    """`ev` on its request's record: its prefix-cache hit, its token, its end. Returns whether it carried a
    token."""
    if ev.num_cached_tokens is not None:
        rec.cached_tokens = ev.num_cached_tokens
    token = ev.token_id is not None
    if token:
        add_token(rec, ev.time_s)
    if ev.finish_reason is not None:
        rec.done_s = ev.time_s
    return token


def fold_run(ran: DecodeRun, record_of: Callable[[int], RequestRecord]) -> int:
    """Each request's record (`record_of(seq_id)`) takes the tokens `ran` gave it: its first token's time where
    it came in the run, one chunk a step; a request that finished in the run ends at its last token. Returns
    the tokens emitted."""
    times = ran.times_s
    k = len(times)
    ones = [1] * k
    late = ran.first_step
    for sid, cached in ran.first_token_cached.items():  # a prompt filled in this run, or whose last chunk was one token
        rec = record_of(sid)
        if rec.first_token_s is None:
            rec.first_token_s = times[late.get(sid, 0)]
            if cached is not None:
                rec.cached_tokens = cached
    ends = ran.ends
    if not late and not ends:  # (most runs: every request's tokens from the first step to the last)
        for seq in ran.seqs:
            rec = record_of(seq.seq_id)
            rec.chunk_times_s += times
            rec.chunk_tokens += ones
            rec.output_tokens += k
        emitted = k * len(ran.seqs)
    else:
        emitted = 0
        for seq in ran.seqs:
            rec = record_of(seq.seq_id)
            at = late.get(seq.seq_id, 0)
            end = ends.get(seq.seq_id, k)
            rec.chunk_times_s += times[at:end]
            rec.chunk_tokens += ones[at:end]
            rec.output_tokens += end - at
            emitted += end - at
    for seq in ran.finished:
        record_of(seq.seq_id).done_s = times[ends.get(seq.seq_id, 0) - 1]
    return emitted
