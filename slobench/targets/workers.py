"""Client worker processes: the OpenAI target's streaming work spread over N processes.

One process can read only so many streamed tokens a second before its event loop sends late (see
benchmarks/client_overhead.py). `WorkerPool` keeps the dispatcher (schedule, in-flight cap, Ctrl-C,
records) in the parent and moves each request's HTTP exchange to one of N worker processes, each with its
own event loop and connection pool: the parent hands the spec to the least busy worker `send_lead_s`
before its time, the worker holds it until then, sends it, and returns the stamped record (two small
messages, not one per token). Workers stamp on the system-wide monotonic clock, which the parent moves
onto the run's. A worker that dies fails its in-flight requests; the others carry on. Workers ignore
SIGINT: the parent's runner owns Ctrl-C.

    python -m slobench.targets.workers FD   # how the parent starts a worker (not for people)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slobench.errors import SpecError
from slobench.run import quiet_gc
from slobench.run.clock import Clock
from slobench.run.event_loop import run_async
from slobench.run.precise_sleep import sleep_until
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.base import TargetBase
from slobench.targets.capabilities import Capabilities
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions

_HEADER = struct.Struct("!I")
_STAMPED = ("sent_s", "first_token_s", "done_s")
_COPIED = ("chunk_tokens", "prompt_tokens", "cached_tokens", "output_tokens", "usage_output_tokens", "status", "error",
           "http_status", "finish_reason", "output_tokens_source", "retried")
STOP_TIMEOUT_S = 10.0
MAX_WORKERS = 64
SEND_LEAD_S = 0.005  # hand each request over this much before its scheduled time
SPIN_S = 0.0015  # without a timerfd, the last stretch before a send is yielded away, not slept (as the runner's)


class WorkerGone(Exception):
    """The worker process that held a request exited before answering."""


def _frame(msg: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    msg = pickle.loads(await reader.readexactly(size))
    if not isinstance(msg, tuple) or not msg:
        raise ValueError(f"malformed message from the other side: {msg!r}")
    return msg


@dataclass(eq=False)
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    alive: bool = True
    reader_task: asyncio.Task[None] | None = None

    def send(self, msg: tuple[Any, ...]) -> None:
        self.writer.write(_frame(msg))

    def gone(self, why: str) -> None:
        self.alive = False
        err = WorkerGone(why)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()


def _reap(proc: subprocess.Popen[bytes], writer: asyncio.StreamWriter) -> None:
    writer.close()
    proc.kill()
    proc.wait()  # killed: returns at once, and leaves no zombie


class ProbeFront(TargetBase):
    """What a pool of senders (worker processes, Ray actors) shares: one OpenAITarget of its own, `_probe`,
    answers preflight, capabilities and the model, and never sends load. Each sender builds its own target
    from `url`, `options` and `sender_caps`, which carry what preflight settled; senders already started
    that would send differently are restarted."""

    _probe: OpenAITarget
    url: str
    options: TargetOptions
    sender_caps: Capabilities | None = None  # None: each sender starts from its options' server profile

    def _started(self) -> bool:
        raise NotImplementedError

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def check_compatible(self, spec: RequestSpec) -> None:
        self._probe.check_compatible(spec)

    async def _settle_model(self) -> None:
        """The senders load the model the front found (`--model` not given): settled before any starts."""
        self.options = replace(self.options, model=await self._probe.discover_model())

    async def preflight(self) -> str:
        before = self.sender_caps if self.sender_caps is not None else self._probe.caps
        served = await self._probe.preflight()
        self.sender_caps = self._probe.caps
        if self._started() and not before.sends_like(self._probe.caps):
            await self.close()
            await self.start()
        return served

    # the probe's own, read through: a copy would go stale when preflight negotiates
    @property
    def caps(self) -> Capabilities:  # type: ignore[override]
        return self._probe.caps

    @property
    def model(self) -> str:  # type: ignore[override]
        return self._probe.model


class WorkerPool(ProbeFront):
    """An OpenAI-compatible target at `url` whose requests are sent from `num_workers` worker processes.

    Every worker builds its own `OpenAITarget(url, options)`. The parent keeps one target of its own for
    `preflight`, `describe` and `check_compatible`, and never sends load through it.
    """

    def __init__(self, num_workers: int, url: str, options: TargetOptions | None = None,
                 clock: Clock | None = None) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or not 1 <= num_workers <= MAX_WORKERS:
            raise SpecError("client_workers", num_workers, f"must be an integer from 1 to {MAX_WORKERS}")
        self.num_workers = num_workers
        self.send_lead_s = SEND_LEAD_S
        self.url = url
        self.options = options if options is not None else TargetOptions()
        self.clock = clock if clock is not None else Clock()
        self._probe = OpenAITarget(url, self.options, self.clock)  # validates the URL here
        self._workers: list[_Worker] = []
        self._ids = itertools.count()

    def __repr__(self) -> str:
        return f"WorkerPool({self.num_workers} workers, {self._probe!r})"

    def describe(self) -> dict[str, Any]:
        return {**self._probe.describe(), "client_workers": self.num_workers}

    def _started(self) -> bool:
        return bool(self._workers)

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    # ---- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._workers:
            return
        await self._settle_model()
        await self._probe.start()
        spawns = [asyncio.ensure_future(self._spawn(i)) for i in range(self.num_workers)]  # they start in parallel
        results = await asyncio.gather(*spawns, return_exceptions=True)
        self._workers = [w for w in results if isinstance(w, _Worker)]
        failed = [e for e in results if isinstance(e, BaseException)]
        if failed:
            await self.close()
            raise failed[0]

    async def _spawn(self, index: int) -> _Worker:
        parent_sock, child_sock = socket.socketpair()
        try:
            env = dict(os.environ)  # the API key's variable travels this way, never in a message
            here = str(Path(__file__).resolve().parents[2])  # so a checkout that is not installed works too
            env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
            proc = subprocess.Popen(
                [sys.executable, "-m", "slobench.targets.workers", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env,
            )
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
        w = _Worker(index, proc, reader, writer)
        w.send(("config", self.url, self.options, self.sender_caps))
        try:
            reply = await asyncio.wait_for(_read_frame(reader), timeout=60)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
            code = proc.poll()
            _reap(proc, writer)
            raise RuntimeError(f"client worker {index} did not start (exit code {code}): {e!r}") from None
        if reply[0] != "ready":
            _reap(proc, writer)
            raise RuntimeError(f"client worker {index} failed to start: {reply[1] if len(reply) > 1 else reply}")
        w.reader_task = asyncio.ensure_future(self._read_replies(w))
        return w

    async def _read_replies(self, w: _Worker) -> None:
        try:
            while True:
                msg = await _read_frame(w.reader)
                if msg[0] == "done":
                    fut = w.pending.pop(msg[1], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg[2])
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, pickle.UnpicklingError) as e:
            code = w.proc.poll()
            why = f"client worker {w.index} (pid {w.proc.pid}) exited" + (
                f" with code {code}" if code is not None else f": {type(e).__name__}")
            w.gone(why)

    async def close(self) -> None:
        workers, self._workers = self._workers, []
        for w in workers:
            if w.alive:
                try:
                    w.send(("stop",))
                except (ConnectionError, RuntimeError):
                    pass
        loop = asyncio.get_running_loop()
        for w in workers:
            try:
                await loop.run_in_executor(None, w.proc.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                await loop.run_in_executor(None, w.proc.wait)
            if w.reader_task is not None:
                w.reader_task.cancel()
                await asyncio.gather(w.reader_task, return_exceptions=True)
            w.writer.close()
            w.gone(f"client worker {w.index} was stopped")
        await self._probe.close()

    # ---- the seam --------------------------------------------------------------------------------------

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        live = [w for w in self._workers if w.alive]
        if not live:
            if not self._workers:
                raise RuntimeError("WorkerPool.send() before start()")
            record.fail("error", "internal: every client worker has exited", self.clock.now_s())
            return
        w = min(live, key=lambda x: len(x.pending))
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        w.pending[rid] = fut
        origin_s = self.clock.origin_ns * 1e-9
        # provisional, kept if the request is cancelled before the worker answers; its own stamp replaces it
        record.sent_s = max(self.clock.now_s(), record.scheduled_s)
        w.send(("send", rid, spec, origin_s + record.scheduled_s))
        try:
            stamped = await fut
        except asyncio.CancelledError:
            if w.pending.pop(rid, None) is not None and w.alive:
                w.send(("cancel", rid))
            raise
        except WorkerGone as e:
            record.fail("error", f"internal: {e} while this request was in flight", self.clock.now_s())
            return
        apply_stamped(record, stamped, lambda t: t - origin_s)


# ---- the worker process ----------------------------------------------------------------------------------


async def send_on_time(target: Any, spec: RequestSpec, send_at_s: float) -> dict[str, Any]:
    """Hold `spec` until `send_at_s` on `target.clock` (origin 0 in a worker or load actor: absolute
    perf_counter seconds), send it, and return the record's stamps and counts as a plain dict (a small
    message; `apply_stamped` puts it back on a record). Cancellation propagates."""
    now = target.clock.now_s
    rec = RequestRecord(spec.request_id, spec.arrival_s)
    try:
        await sleep_until(target.clock, send_at_s, SPIN_S)
        await target.send(spec, rec)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a target bug must not lose the record
        rec.fail("error", f"internal: {type(e).__name__}: {e}", now())
    return {name: getattr(rec, name) for name in (*_STAMPED, *_COPIED, "chunk_times_s")}


def apply_stamped(record: RequestRecord, stamped: dict[str, Any], to_run_s: Callable[[float], float]) -> None:
    """Put a worker's stamps on the run's record, each time moved onto the run's clock by `to_run_s`."""
    for name in _STAMPED:
        t = stamped[name]
        setattr(record, name, None if t is None else to_run_s(t))
    record.chunk_times_s = [to_run_s(t) for t in stamped["chunk_times_s"]]
    for name in _COPIED:
        setattr(record, name, stamped[name])


async def _serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    msg = await _read_frame(reader)
    try:
        if msg[0] != "config":
            raise ValueError(f"expected the target's config first, got {msg[0]!r}")
        # Origin 0: stamps are absolute perf_counter seconds, which the parent moves onto the run's clock.
        target = OpenAITarget(msg[1], msg[2], Clock(origin_ns=0), capabilities=msg[3])
        await target.start()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it with the worker's index
        writer.write(_frame(("error", f"{type(e).__name__}: {e}")))
        await writer.drain()
        return
    writer.write(_frame(("ready",)))
    tasks: dict[int, asyncio.Task[None]] = {}
    gc_stats = quiet_gc.hold()  # this process only sends: the GC's pauses would be measured (run/quiet_gc.py)
    gc_valve = asyncio.ensure_future(quiet_gc.valve(gc_stats))

    async def one(rid: int, spec: RequestSpec, send_at_s: float) -> None:
        try:
            stamped = await send_on_time(target, spec, send_at_s)
        except asyncio.CancelledError:
            return  # the parent gave up on it and marks it cancelled itself
        finally:
            tasks.pop(rid, None)
        writer.write(_frame(("done", rid, stamped)))

    try:
        while True:
            try:
                msg = await _read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the parent went away
            kind = msg[0]
            if kind == "send":
                tasks[msg[1]] = asyncio.ensure_future(one(msg[1], msg[2], msg[3]))
            elif kind == "cancel":
                task = tasks.get(msg[1])
                if task is not None:
                    task.cancel()
            elif kind == "stop":
                break
    finally:
        gc_valve.cancel()
        quiet_gc.release()
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await target.close()
        writer.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (args[0].isascii() and args[0].isdigit()):
        print("usage: python -m slobench.targets.workers FD (started by WorkerPool, not by hand)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's runner owns Ctrl-C
    run_async(_serve(int(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
