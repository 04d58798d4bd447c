"""The dispatcher: open-loop (each request at its scheduled time, however many are in flight) or closed-loop.

Every timestamp is on the run's one monotonic clock. The requests come as a sequence (sorted here) or as an
iterator already in schedule order (a trace streamed from disk): an iterator is taken one request at a time,
just before its send, so the run never holds the schedule whole; its length is known once it is exhausted
(before that, from the stream's own `count_hint` when it has one). Records are written to the run directory as each
request finishes, so a crash or Ctrl-C loses at most the requests in flight; Ctrl-C stops sending, gives
in-flight requests a short grace, marks the rest cancelled and still writes summary.json. With
`early_stop`, a run whose verdict against the SLO is decided stops at once (`slobench.run.early_stop`):
sending stops, in-flight requests are cancelled (their connections closed), and summary.json says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary, summarize
from slobench.analysis.warmup import latency_series, mser5_cut
from slobench.errors import ResultsNotWritten, SlobenchError, SpecError
from slobench.run import early_stop, interrupts, quiet_gc
from slobench.run.clock import Clock
from slobench.run.event_loop import loop_name
from slobench.run.precise_sleep import sleep_until
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.rundir import SUMMARY, RunWriter
from slobench.run.session_plan import SessionPlan
from slobench.targets.base import Target

# A request that waits for another (a session's next turn): given the one that ended and its record, the
# request to send and the run time to send it at, or None.
FollowUp = Callable[[RequestSpec, RequestRecord], "tuple[RequestSpec, float] | None"]

# Start the schedule a little in the future so the first requests are not late by the set-up time.
START_LEAD_S = 0.05


@dataclass(frozen=True, slots=True)
class RunOptions:
    max_in_flight: int | None = None  # open loop: cap on requests in flight; waits are counted (queued_s)
    warmup_requests: int = 0  # the first N requests are sent but excluded from metrics
    warmup_auto: bool = False  # after the run, cut the warm-up by the MSER-5 rule (slobench.analysis.warmup)
    duration_s: float | None = None  # send nothing scheduled after this many seconds
    grace_s: float = 5.0  # after Ctrl-C, how long in-flight requests may still finish
    closed_loop_users: int | None = None  # closed loop: N users, each sends its next request when one ends
    closed_loop_rate_rps: float | None = None  # optional cap on the closed loop's total send rate
    progress: bool = True
    spin_s: float = 0.0015  # the last stretch before a send is yielded away, not slept (timer precision)
    # a ceiling on sends per period, (requests, seconds), for hosted endpoints with a rate limit; its waits
    # are deliberate (queued_s), not client lateness
    rate_limit: tuple[int, float] | None = None
    # the cyclic GC held off while the load runs (slobench/run/quiet_gc.py): its pauses would be measured
    hold_gc: bool = True
    # stop once more requests are known to miss the SLO than its target allows (slobench.run.early_stop)
    early_stop: bool = False

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise SpecError("max_in_flight", self.max_in_flight, "must be >= 1")
        if self.warmup_requests < 0:
            raise SpecError("warmup_requests", self.warmup_requests, "must be >= 0")
        if self.duration_s is not None and self.duration_s <= 0:
            raise SpecError("duration", self.duration_s, "must be positive")
        if self.closed_loop_users is not None and self.closed_loop_users < 1:
            raise SpecError("concurrency", self.closed_loop_users, "must be >= 1")
        if self.closed_loop_rate_rps is not None and self.closed_loop_rate_rps <= 0:
            raise SpecError("rate", self.closed_loop_rate_rps, "must be positive")
        if self.rate_limit is not None and not (self.rate_limit[0] >= 1 and self.rate_limit[1] > 0):
            raise SpecError("rate_limit", self.rate_limit, "must be (requests >= 1, period > 0 s)")


@dataclass(slots=True)
class Progress:
    """Counters the progress display reads; plain ints, updated on the event loop."""

    total: int | None  # None: not known yet (a stream without a count)
    sent: int = 0
    finished: int = 0
    errors: int = 0
    max_lateness_s: float = 0.0
    is_total_estimate: bool = False  # `total` is a stream's estimate (e.g. its file's rows), not a count

    @property
    def in_flight(self) -> int:
        return self.sent - self.finished


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    summary: RunSummary
    interrupted: bool = False
    progress: Progress = field(default_factory=lambda: Progress(0))


class Dispatcher:
    def __init__(
        self,
        target: Target,
        clock: Clock,
        opts: RunOptions,
        on_record: Callable[[RequestRecord], None] | None = None,
        follow_up: FollowUp | None = None,
    ) -> None:
        self.target = target
        self.follow_up = follow_up
        self.closing = False  # set once the run stops: no follow-up is sent after
        self.waiting: set[asyncio.Task[None]] = set()  # follow-ups waiting for their send time
        self.clock = clock
        self.opts = opts
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.in_flight: dict[int, RequestRecord] = {}  # by id(): records of requests sent or waiting for a slot
        self.stop_reason = "the run stopped"  # said on the records of requests cancelled by the stop
        self.tasks: set[asyncio.Task[None]] = set()
        self.progress = Progress(0)
        self.num_taken = 0  # requests taken from the schedule (each sent or cancelled before its send)
        self._sem = asyncio.Semaphore(opts.max_in_flight) if opts.max_in_flight else None
        self._throttle: Any = None
        if opts.rate_limit is not None:
            from asyncio_throttle import Throttler

            # its sliding window is polled every 1 ms: a send that waited is at most ~1 ms behind its slot
            self._throttle = Throttler(rate_limit=opts.rate_limit[0], period=opts.rate_limit[1], retry_interval=0.001)

    def _new_record(self, i: int, spec: RequestSpec, scheduled_s: float) -> RequestRecord:
        return RequestRecord(
            request_id=spec.request_id,
            scheduled_s=scheduled_s,
            tag=spec.tag,
            input_tokens=spec.input_tokens,
            max_tokens=spec.max_tokens,
            is_warmup=i < self.opts.warmup_requests,
            session_id=spec.session_id,
            turn=spec.turn,
            estimated_s=spec.arrival_s if spec.think_s is not None else None,
        )

    async def _send_one(self, spec: RequestSpec, rec: RequestRecord) -> None:
        clock = self.clock
        self.in_flight[id(rec)] = rec
        try:
            if self._sem is not None:
                t0 = clock.now_s()
                await self._sem.acquire()
                rec.queued_s = clock.now_s() - t0
            if self._throttle is not None:
                t0 = clock.now_s()
                await self._throttle.acquire()
                rec.queued_s += clock.now_s() - t0
            try:
                self.progress.sent += 1
                await self.target.send(spec, rec)
            finally:
                if self._sem is not None:
                    self._sem.release()
        except asyncio.CancelledError:
            rec.fail("cancelled", f"cancelled: {self.stop_reason} before this request finished", clock.now_s())
            raise
        except Exception as e:  # a target bug must not lose the record or stop the run
            rec.fail("error", f"internal: {type(e).__name__}: {e}", clock.now_s())
        finally:
            self._finish(rec)
            if self.follow_up is not None and not self.closing:
                self._follow(spec, rec)

    def _follow(self, spec: RequestSpec, rec: RequestRecord) -> None:
        """The request that waits for `rec` (a session's next turn), sent at the time `follow_up` gives: past
        the run's duration, or once the run is stopping, it is not sent."""
        assert self.follow_up is not None
        nxt = self.follow_up(spec, rec)
        if nxt is None:
            return
        follower, at_s = nxt
        limit = self.opts.duration_s
        if limit is not None and at_s > limit:
            return

        async def send_later() -> None:
            lead = float(self.target.send_lead_s)
            try:
                await self._sleep_until(at_s - lead, spin=lead == 0)
            finally:
                self.waiting.discard(task)
            if self.closing:
                return
            self.num_taken += 1
            await self._send_one(follower, self._new_record(self.num_taken - 1, follower, at_s))

        task = self._spawn(send_later())
        self.waiting.add(task)

    async def wait_all(self) -> None:
        """Until no request is in flight or waiting to follow one (follow-ups are spawned as others end)."""
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    def _finish(self, rec: RequestRecord) -> None:
        self.in_flight.pop(id(rec), None)
        p = self.progress
        p.finished += 1
        if rec.status != "ok":
            p.errors += 1
        if rec.sent_s is not None:
            late = rec.sent_s - rec.scheduled_s - rec.queued_s
            if late > p.max_lateness_s:
                p.max_lateness_s = late
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def open_loop(self, specs: Iterable[RequestSpec], fill: Callable[[float], bool] | None = None) -> None:
        """Send each spec at its arrival time. Returns once all are sent (not finished).

        A target with `send_lead_s` (client worker processes) is handed each request that much early and
        holds it until its scheduled time itself, so the hand-over is not counted as lateness twice.
        `fill` (a stream's): called with the slack before each send to build requests ahead in it."""
        limit = self.opts.duration_s
        lead = float(self.target.send_lead_s)
        for i, spec in enumerate(specs):
            if limit is not None and spec.arrival_s > limit:
                break
            await self._sleep_until(spec.arrival_s - lead, spin=lead == 0, fill=fill)  # the target is precise itself
            self.num_taken += 1
            self._spawn(self._send_one(spec, self._new_record(i, spec, spec.arrival_s)))

    async def _sleep_until(self, t_s: float, *, spin: bool = True,
                           fill: Callable[[float], bool] | None = None) -> None:
        """Sleep to an absolute time on the run clock. asyncio's timers wake up to ~1 ms late (epoll
        rounds its timeout up to whole ms), so the wake-up is a timerfd's (slobench.run.precise_sleep), or
        without one, a sleep to just short of the deadline and then yields to the loop until it passes.
        `fill(slack_s)` (a stream's) first uses the slack, one step per loop turn, while it says it did."""
        now = self.clock.now_s
        spin_s = self.opts.spin_s if spin else 0.0
        if fill is not None:
            await asyncio.sleep(0)  # the send just spawned goes first
            while fill(t_s - now() - spin_s):
                await asyncio.sleep(0)
        await sleep_until(self.clock, t_s, spin_s)

    async def closed_loop(self, specs: Iterable[RequestSpec]) -> None:
        """N users; each sends its next request when its last one ends. Returns when all are finished."""
        users = self.opts.closed_loop_users or 1
        rate = self.opts.closed_loop_rate_rps
        limit = self.opts.duration_s
        it: Iterator[tuple[int, RequestSpec]] = iter(enumerate(specs))
        next_slot = [self.clock.now_s()]  # pacing for the optional rate cap: one slot per request

        async def user() -> None:
            for i, spec in it:
                now = self.clock.now_s()
                if limit is not None and now > limit:
                    return
                scheduled = now
                if rate is not None:
                    scheduled = max(now, next_slot[0])
                    next_slot[0] = scheduled + 1.0 / rate
                    if scheduled > now:
                        await asyncio.sleep(scheduled - now)
                self.num_taken += 1
                await self._send_one(spec, self._new_record(i, spec, scheduled))

        await asyncio.gather(*(user() for _ in range(users)))

    async def drain(self, grace_s: float | None) -> None:
        """Wait for in-flight requests; after `grace_s` (if given) cancel the rest. No follow-up leaves after."""
        self.closing = True
        for t in list(self.waiting):  # a follow-up still waiting for its time is not sent
            t.cancel()
        if not self.tasks:
            return
        pending = set(self.tasks)
        if grace_s is None or grace_s > 0:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def run(
    specs: Iterable[RequestSpec],
    target: Target,
    *,
    clock: Clock | None = None,
    opts: RunOptions | None = None,
    slo: SLO | None = None,
    run_dir: str | Path | None = None,
    manifest: dict[str, Any] | None = None,
    monitors: Sequence[Callable[[Clock], Awaitable[None]]] = (),
    handle_sigint: bool = True,
    seed: int = 0,
    settle: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> RunResult:
    """Run one load test against an already started target and return its records and summary.

    `specs`: a sequence (sorted by arrival here) or an iterator in schedule order (see the module doc).
    An iterator may offer `count_hint()` (its expected length, run in a thread once the run starts) and
    either may offer `row_report()` (what a trace reader dropped or altered, as summary.json's
    `trace_rows`; called after the last request is taken). `monitors` are coroutines started beside the
    run (e.g. a /metrics scraper) and cancelled at its end. `settle`: after an early stop, waits for the
    server to let go of the cancelled requests (`slobench.run.server_idle.wait_idle`); what it says is kept
    in summary.json's `stopped_early`.
    """
    opts = opts or RunOptions()
    # One clock per run: the target stamps with its own, so the dispatcher must use that very object.
    if clock is None:
        clock = target.clock
    elif target.clock is not clock:
        raise ValueError("run(): `clock` must be the target's own clock (target.clock); timestamps would mix clocks")
    row_report = getattr(specs, "row_report", None)
    count_hint = getattr(specs, "count_hint", None)
    plan = None
    if isinstance(specs, Sequence) and SessionPlan.waits(specs):  # sessions that wait for the server
        if opts.closed_loop_users:
            raise SpecError("session mode", "wait", "a closed loop paces by its users; use the scheduled session mode")
        plan = SessionPlan(specs)
        specs = plan.first_turns(specs)
    schedule, first, total = _schedule(specs, opts.duration_s)
    if plan is not None and total is not None:
        total += len(plan.later)  # the held-back turns, each sent unless its session fails first
    if first is not None:
        target.check_compatible(first)  # e.g. token-id prompts on the chat API: refuse before sending
    writer = RunWriter(Path(run_dir), {**(manifest or {})}) if run_dir is not None else None
    disp = Dispatcher(target, clock, opts, on_record=writer.write if writer else None,
                      follow_up=plan.next_turn if plan is not None else None)
    disp.progress.total = total
    interrupted = False

    fill = getattr(specs, "fill", None)
    if fill is not None and not opts.closed_loop_users:
        while fill(float("inf")):  # a stream builds what it may ahead before the clock starts
            pass
    clock.reset()
    clock.origin_ns += int(START_LEAD_S * 1e9)
    if writer is not None:
        writer.update_manifest({"clock": {"wall_anchor_unix_s": clock.wall_anchor_unix_s + START_LEAD_S},
                                "event_loop": loop_name()})
    if opts.closed_loop_users:
        sender = asyncio.ensure_future(disp.closed_loop(schedule))
    else:
        sender = asyncio.ensure_future(disp.open_loop(schedule, fill=fill))
    monitor_tasks = [asyncio.ensure_future(m(clock)) for m in monitors]
    if total is None and callable(count_hint):
        monitor_tasks.append(asyncio.ensure_future(_estimate_total(count_hint, disp.progress)))

    # One signal policy from the first send to the last file written (slobench.run.interrupts): while
    # sending, SIGINT or SIGTERM stops the run (in-flight requests get their grace); after, it is only noted,
    # and every file is still written with summary.json marked interrupted.
    with interrupts.hold(install=handle_sigint) as held:
        stop = asyncio.Event()

        settling: list[asyncio.Future[dict[str, Any]]] = []

        def on_sigint() -> None:
            nonlocal interrupted
            for waiting in settling:
                waiting.cancel()
            if interrupted:  # second Ctrl-C: stop waiting at once
                for t in list(disp.tasks):
                    t.cancel()
            interrupted = True
            sender.cancel()
            stop.set()

        def on_write_error(_e: BaseException) -> None:  # the disk is full: stop sending, nothing more is recorded
            sender.cancel()
            stop.set()

        if writer is not None:
            writer.on_error = on_write_error

        stopped: list[early_stop.StoppedEarly] = []
        counter = _miss_counter(opts, slo, total, target)
        if counter is not None:
            def on_decided(decided: early_stop.StoppedEarly) -> None:
                stopped.append(decided)
                disp.stop_reason = "stopped early (the verdict was decided)"
                sender.cancel()
                stop.set()

            monitor_tasks.append(asyncio.ensure_future(
                early_stop.watch(counter, disp.records, disp.in_flight, clock.now_s, on_decided)))

        held.stop_with(on_sigint)
        live = _start_live(disp.progress) if opts.progress else None
        cancelled_from_outside = False
        send_error: BaseException | None = None
        gc_stats = quiet_gc.hold() if opts.hold_gc else None  # released in the `finally` below
        if gc_stats is not None:
            monitor_tasks.append(asyncio.ensure_future(quiet_gc.valve(gc_stats)))
        try:
            # Race "everything sent and finished" against Ctrl-C, which may come at any point.
            stop_task = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({sender, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                if not stop.is_set() and disp.tasks:
                    all_done = asyncio.ensure_future(disp.wait_all())
                    await asyncio.wait({all_done, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                    all_done.cancel()
            finally:
                stop_task.cancel()
            if stop.is_set():
                await disp.drain(0 if stopped or (writer is not None and writer.error is not None) else opts.grace_s)
            if stopped and settle is not None and not interrupted:
                settling.append(asyncio.ensure_future(settle()))
                await asyncio.wait(settling)  # Ctrl-C cancels it: no more waiting
                if not settling[0].cancelled():
                    stopped[0] = replace(stopped[0], server_idle=settling[0].result())
            elif not sender.cancelled() and (send_error := sender.exception()) is not None:
                # A stream that fails part-way (a trace damaged at row 900,000) stops the run: what was sent is
                # kept and summarised, then the error is raised. Anything else, or nothing sent, is raised now.
                if not (isinstance(send_error, SlobenchError) and disp.num_taken):
                    raise send_error
        except asyncio.CancelledError:
            # Cancelled by our caller: cancel what is in flight (each becomes a cancelled record), keep a
            # valid run directory, and let the cancellation propagate.
            cancelled_from_outside = interrupted = True
            sender.cancel()
            await disp.drain(0)
        finally:
            held.stop_with(None)  # from here to the last file written a signal is noted, not acted on
            for m in monitor_tasks:
                m.cancel()
            await asyncio.gather(*monitor_tasks, return_exceptions=True)
            if live is not None:
                live.stop()
            if writer is not None:
                writer.flush()
            if gc_stats is not None:
                quiet_gc.release()

        interrupted = interrupted or held.received  # a signal that came as the last request ended
        # Past a failed write only what reached requests.jsonl is summarised: the file and summary.json agree.
        write_error = writer.error if writer is not None else None
        records = disp.records if writer is None or write_error is None else disp.records[:writer.num_written]
        warmup_cut = _cut_warmup(records) if opts.warmup_auto else None
        if warmup_cut is not None and writer is not None and write_error is None:
            try:
                writer.rewrite(records)  # the file and the summary agree on which requests were warm-up
            except ResultsNotWritten as e:
                write_error = e
        # a stream's length is known once it ran out; an interrupted one's is not (an estimate is no count)
        unknown = interrupted or send_error is not None or write_error is not None
        trace_rows = row_report() if callable(row_report) else None
        if trace_rows is not None and writer is not None:
            try:
                writer.update_manifest({"trace_rows": trace_rows})
            except ResultsNotWritten as e:
                write_error = write_error or e
        summary = summarize(records, slo, seed=seed)
        summary = replace(
            summary,
            client=summary.client if gc_stats is None else replace(summary.client, gc=gc_stats.to_dict()),
            warmup={"rule": "MSER-5", "num_requests": warmup_cut} if warmup_cut is not None else None,
            interrupted=interrupted or held.received or send_error is not None or write_error is not None,
            stopped_by=str(send_error or write_error) if (send_error or write_error) is not None else None,
            num_scheduled=total if total is not None else None if unknown else disp.num_taken,
            trace_rows=trace_rows,
            # several replicas routed by the client: how many each got
            fleet=target.fleet_summary(),
        )
        if stopped:
            summary = replace(summary, stopped_early=stopped[0].to_dict(),
                              attainment=early_stop.stopped_attainment(stopped[0], summary.duration_s))
        if writer is not None:
            try:
                writer.finish(summary)
                summary = interrupts.marked(held, summary, writer.run_dir)  # a signal while they were written
                said = f"{SUMMARY} summarises them" if write_error is not None else ""
            except ResultsNotWritten as e:
                said = f"{SUMMARY} could not be written either" if write_error is not None else ""
                write_error = write_error or e
            if write_error is not None:
                raise ResultsNotWritten("; ".join(filter(None, (str(write_error), said))))
        interrupted = interrupted or held.received
    if cancelled_from_outside:
        raise asyncio.CancelledError
    if send_error is not None:
        raise send_error
    return RunResult(disp.records, summary, interrupted, disp.progress)


def _miss_counter(opts: RunOptions, slo: SLO | None, total: int | None, target: Target
                  ) -> early_stop.MissCounter | None:
    """The early-stop decider of this run, or None where it has none: not asked for, no SLO, or the measured
    requests unknown (a stream's count, a warm-up cut chosen after the run)."""
    if not opts.early_stop or slo is None or total is None or opts.warmup_auto:
        return None
    measured = total - min(opts.warmup_requests, total)
    if measured < 1:
        return None
    return early_stop.MissCounter(slo, measured, in_flight_rules=target.records_live)


def _schedule(specs: Iterable[RequestSpec], duration_s: float | None
              ) -> tuple[Iterator[RequestSpec], RequestSpec | None, int | None]:
    """The requests in send order, the first (for `check_compatible`), and how many will be sent when
    that is known without taking them all (a sequence: sorted and counted; an iterator: neither)."""
    if isinstance(specs, Sequence):
        ordered = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
        total = len(ordered) if duration_s is None else sum(1 for s in ordered if s.arrival_s <= duration_s)
        return iter(ordered), (ordered[0] if ordered else None), total
    it = iter(specs)
    first = next(it, None)
    if first is None:
        return iter(()), None, 0
    return _in_order(chain((first,), it)), first, None


def _in_order(specs: Iterator[RequestSpec]) -> Iterator[RequestSpec]:
    """An iterator's requests, refused at the first one scheduled before the one before it: the runner
    cannot sort what it has not seen, and sending it late would pass for client lateness."""
    prev_s = -float("inf")
    prev_id = None
    for spec in specs:
        if spec.arrival_s < prev_s:
            raise SpecError("specs", f"request {spec.request_id} at {spec.arrival_s:.6f} s after request "
                            f"{prev_id} at {prev_s:.6f} s", "an iterator must give requests in schedule order "
                            "(pass a list to have them sorted)")
        prev_s, prev_id = spec.arrival_s, spec.request_id
        yield spec


async def _estimate_total(count_hint: Callable[[], int | None], progress: Progress) -> None:
    """The progress line's total for a stream: its hint, computed in a thread (e.g. a file's lines)."""
    n = await asyncio.to_thread(count_hint)
    if n is not None and progress.total is None:
        progress.total = n
        progress.is_total_estimate = True


def _cut_warmup(records: list[RequestRecord]) -> int:
    """Mark the leading requests MSER-5 finds transient as warm-up; return how many."""
    a = RecordArrays.from_records(records)
    cut = mser5_cut(latency_series(a.ttft_from_scheduled_s))
    drop = set(a.request_id[:cut].tolist())
    for r in records:
        if r.request_id in drop:
            r.is_warmup = True
    return cut


def _start_live(p: Progress) -> Any:
    """A rich live line: sent, finished, in flight, errors, worst lateness. None when not a terminal."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(stderr=True)
    if not console.is_terminal:
        return None

    class _View:
        def __rich__(self) -> Text:
            total = "?" if p.total is None else f"~{p.total}" if p.is_total_estimate else str(p.total)
            return Text(
                f"sent {p.sent}/{total}  finished {p.finished}  in flight {p.in_flight}  "
                f"errors {p.errors}  worst lateness {p.max_lateness_s * 1e3:.1f} ms"
            )

    live = Live(_View(), console=console, refresh_per_second=4, transient=True)
    live.start()
    return live
