"""Load actors on Ray: the OpenAI target's streaming work spread over N actors, on one machine or many.

`RayPool` is a target like `WorkerPool` (slobench.targets.workers): the runner keeps the one schedule,
the in-flight cap, Ctrl-C and the run directory; each request's HTTP exchange happens in one of N Ray
actors, each with its own event loop and `OpenAITarget`. An actor may be on another machine, with another
monotonic clock, behind a millisecond of Ray: hand-overs and records travel in batches, and each actor's
clock is mapped onto the run's (see `RayPool`). Ray is optional (`pip install 'slobench[ray]'`); nothing
here imports it until a pool starts. Against a cluster (`--ray ADDRESS`) every node needs slobench
installed; the API key's variable, when set here, travels in the actors' `runtime_env`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slobench.errors import SpecError, UsageError
from slobench.run import quiet_gc
from slobench.run.clock import Clock
from slobench.run.clocksync import CLOCK_LIMIT_OF_TTFT, ClockMap, OffsetEstimate, measure_offset
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.rundir import MANIFEST, SUMMARY, read_manifest, write_json_atomic, write_summary
from slobench.targets.capabilities import Capabilities
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.workers import MAX_WORKERS, ProbeFront, apply_stamped, send_on_time

if TYPE_CHECKING:
    from slobench.analysis.summary import RunSummary

SEND_LEAD_S = 0.25  # hand each request to the pool this much before its time (Ray hops cost milliseconds)
BATCH_S = 0.05  # gather hand-overs (and finished records) this long before one actor call (~1 ms of CPU each)
NUM_SYNC_SAMPLES = 24  # round trips per clock estimate at start and at the end of a run
NUM_RESYNC_SAMPLES = 8  # ... and during the run, every RESYNC_S
RESYNC_S = 2.0
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
INSTALL_HINT = "pip install 'slobench[ray]'  (or: pip install 'ray>=2.40')"


def require_ray() -> Any:
    """The `ray` module, or a usage error (exit 2) that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


class ActorGone(Exception):
    """The load actor that held a request died before answering."""


# ---- the actor (runs in a Ray worker process) --------------------------------------------------------------


class LoadActor:
    """One load actor: an `OpenAITarget` on this machine's monotonic clock (origin 0: absolute seconds)."""

    def __init__(self, index: int, url: str, options: TargetOptions, caps: Capabilities | None,
                 clock_shift_s: float = 0.0) -> None:
        self.index = index
        self.url = url
        self.options = options
        self.caps = caps
        # a clock that reads `clock_shift_s` ahead of perf_counter: tests stand in a machine's clock with it
        self.clock = Clock(origin_ns=-round(clock_shift_s * 1e9))
        self.target: Any = None
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.outbox: list[tuple[int, dict[str, Any]]] = []
        self.ready: asyncio.Event | None = None
        self.gc_valve: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, Any]:
        self.target = OpenAITarget(self.url, self.options, self.clock, capabilities=self.caps)
        await self.target.start()
        self.ready = asyncio.Event()
        # the actor's process sends load: the GC's pauses would be measured (slobench/run/quiet_gc.py)
        self.gc_valve = asyncio.ensure_future(quiet_gc.valve(quiet_gc.hold()))
        node = ""
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - the node id is only a label
            pass
        return {"node_id": node, "hostname": socket.gethostname(), "pid": os.getpid()}

    async def now(self) -> float:
        return self.clock.now_s()  # the clock the target stamps with

    async def submit(self, batch: list[tuple[int, RequestSpec, float]]) -> None:
        for rid, spec, send_at_s in batch:
            self.tasks[rid] = asyncio.ensure_future(self._one(rid, spec, send_at_s))

    async def _one(self, rid: int, spec: RequestSpec, send_at_s: float) -> None:
        try:
            stamped = await send_on_time(self.target, spec, send_at_s)
        except asyncio.CancelledError:
            return  # the driver gave up on it and marks it cancelled itself
        finally:
            self.tasks.pop(rid, None)
        self.outbox.append((rid, stamped))
        assert self.ready is not None
        self.ready.set()

    async def collect(self, max_wait_s: float) -> list[tuple[int, dict[str, Any]]]:
        """A long poll: what finished since the last call, once there is some (gathered for BATCH_S)."""
        assert self.ready is not None
        if not self.outbox:
            try:
                await asyncio.wait_for(self.ready.wait(), max_wait_s)
            except TimeoutError:
                return []
            await asyncio.sleep(BATCH_S)
        self.ready.clear()
        out, self.outbox = self.outbox, []
        return out

    async def cancel(self, rids: list[int]) -> None:
        for rid in rids:
            task = self.tasks.get(rid)
            if task is not None:
                task.cancel()

    async def usage(self) -> dict[str, Any]:
        # process CPU (Ray's own threads included) and the event loop's thread alone (the load's work)
        return {"cpu_s": time.process_time(), "loop_cpu_s": time.thread_time(), "in_flight": len(self.tasks)}

    async def stop(self) -> None:
        if self.gc_valve is not None:
            self.gc_valve.cancel()
            self.gc_valve = None
            quiet_gc.release()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.target is not None:
            await self.target.close()


# ---- the driver's side --------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Actor:
    index: int
    handle: Any
    info: dict[str, Any]
    cmap: ClockMap
    pending: dict[int, tuple[asyncio.Future[dict[str, Any]], float]] = field(default_factory=dict)  # rid: (fut, send_at)
    outgoing: list[tuple[int, RequestSpec, float]] = field(default_factory=list)
    alive: bool = True
    died: str | None = None
    collector: asyncio.Task[None] | None = None
    # this run's figures (reset by run_report)
    lateness_s: list[float] = field(default_factory=list)
    num_records: int = 0
    cpu_mark_s: float = 0.0
    loop_cpu_mark_s: float = 0.0

    def label(self) -> str:
        host = self.info.get("hostname", "?")
        return f"ray load actor {self.index} (host {host}, pid {self.info.get('pid', '?')})"


class RayPool(ProbeFront):
    """An OpenAI-compatible target whose requests are sent from `num_actors` Ray actors.

    - Batches, not messages per request: the runner hands a request over `SEND_LEAD_S` before its time;
      the pool gathers what each actor is handed and ships it every `BATCH_S` in one actor call (at once
      when a send is due sooner, as in closed loop). Each actor answers a long poll (`collect`) with every
      record finished since the last one.
    - One clock: each actor is asked for its clock `NUM_SYNC_SAMPLES` times at start, a few times every
      `RESYNC_S`, and once more at the end of each run (slobench.run.clocksync: the minimum-RTT round trip,
      uncertainty RTT/2). Send times go out mapped onto the actor's clock, its stamps come back mapped onto
      the run's, linearly between the first estimate and the latest; offsets, uncertainty and drift per
      actor go into manifest.json and the summary's client health (`note_client_clocks`), and the run is
      flagged when the uncertainty exceeds `CLOCK_LIMIT_OF_TTFT` of the TTFT SLO.
    - Faults: an actor (or its node) that dies fails the requests it held, each recorded with the reason
      and whether it had been due to be sent; later requests go to the survivors and the run goes on.

    `address`: a Ray cluster's address (`ray.init(address=...)`), or None / "local" for a local instance
    this pool starts and stops. When Ray is already initialised in this process (a test's cluster), that
    one is used and left running. Each actor builds its own `OpenAITarget(url, options)`, as for `WorkerPool`.
    `clock_shift_s` (tests): actor i's clock reads that many seconds ahead of its machine's.
    """

    def __init__(self, num_actors: int, url: str, options: TargetOptions | None = None, clock: Clock | None = None,
                 address: str | None = None, clock_shift_s: Sequence[float] = ()) -> None:
        if isinstance(num_actors, bool) or not isinstance(num_actors, int) or not 1 <= num_actors <= MAX_WORKERS:
            raise SpecError("client_workers", num_actors, f"must be an integer from 1 to {MAX_WORKERS}")
        self.num_actors = num_actors
        self.clock_shift_s = list(clock_shift_s) + [0.0] * (num_actors - len(clock_shift_s))  # tests only
        self.address = None if address in (None, "", "local") else address
        self.send_lead_s = SEND_LEAD_S
        self.url = url
        self.options = options if options is not None else TargetOptions()
        self.clock = clock if clock is not None else Clock()
        self._probe = OpenAITarget(url, self.options, self.clock)  # validates the URL here
        self._actors: list[_Actor] = []
        self._ids = itertools.count()
        self._ray: Any = None
        self._owns_ray = False
        self._flush_handle: asyncio.TimerHandle | None = None
        self._resync_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RayPool({self.num_actors} actors, {self._probe!r})"

    def describe(self) -> dict[str, Any]:
        return {**self._probe.describe(), "client_workers": self.num_actors,
                "ray": {"address": self.address or "local", "actors": self.num_actors}}

    def _started(self) -> bool:
        return bool(self._actors)

    @property
    def actor_pids(self) -> list[int]:
        return [int(a.info["pid"]) for a in self._actors if a.alive]

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._actors:
            return
        await self._settle_model()
        await self._probe.start()
        ray = self._ray = require_ray()
        if not ray.is_initialized():
            init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if self.address is None:
                # one CPU per actor, as on a cluster; a local instance is given enough of them
                init |= {"address": "local", "num_cpus": max(os.cpu_count() or 1, self.num_actors)}
            else:
                init["address"] = self.address
            ray.init(**init)
            self._owns_ray = True
        opts: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD", "max_restarts": 0}
        key_var = self.options.api_key_env
        if key_var and os.environ.get(key_var):  # the API key reaches actors on other nodes this way only
            opts["runtime_env"] = {"env_vars": {key_var: os.environ[key_var]}}
        remote_cls = ray.remote(LoadActor)
        handles = [remote_cls.options(**opts).remote(i, self.url, self.options, self.sender_caps, self.clock_shift_s[i])
                   for i in range(self.num_actors)]
        try:
            infos = await asyncio.wait_for(asyncio.gather(*(h.start.remote() for h in handles)), START_TIMEOUT_S)
        except BaseException as e:
            for h in handles:
                ray.kill(h)
            await self._shutdown_ray()
            if isinstance(e, TimeoutError):
                raise RuntimeError(f"{self.num_actors} Ray load actors did not start within {START_TIMEOUT_S:.0f} s "
                                   "(each needs one free CPU in the cluster)") from None
            raise
        for i, (h, info) in enumerate(zip(handles, infos, strict=True)):
            est = await self._sync(h, NUM_SYNC_SAMPLES)
            self._actors.append(_Actor(i, h, info, ClockMap(est)))
        for a in self._actors:
            a.collector = asyncio.ensure_future(self._collect(a))
            u = await a.handle.usage.remote()
            a.cpu_mark_s, a.loop_cpu_mark_s = u["cpu_s"], u["loop_cpu_s"]
        self._resync_task = asyncio.ensure_future(self._resync())

    async def _sync(self, handle: Any, num_samples: int) -> OffsetEstimate:
        async def probe() -> float:
            return float(await handle.now.remote())

        return await asyncio.wait_for(measure_offset(probe, lambda: time.perf_counter_ns() * 1e-9, num_samples),
                                      STOP_TIMEOUT_S)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(RESYNC_S)
            for a in self._actors:
                if a.alive:
                    await self._update_clock(a, NUM_RESYNC_SAMPLES)

    async def _update_clock(self, a: _Actor, num_samples: int) -> None:
        try:
            a.cmap = a.cmap.with_end(await self._sync(a.handle, num_samples))
        except Exception as e:  # noqa: BLE001 - a dead actor: its collector reports it
            self._gone(a, f"{type(e).__name__}")

    async def close(self) -> None:
        if self._resync_task is not None:
            self._resync_task.cancel()
            await asyncio.gather(self._resync_task, return_exceptions=True)
            self._resync_task = None
        actors, self._actors = self._actors, []
        ray = self._ray
        stops = [a.handle.stop.remote() for a in actors if a.alive]
        if stops:
            await asyncio.wait([asyncio.ensure_future(_awaited(s)) for s in stops], timeout=STOP_TIMEOUT_S)
        for a in actors:
            if a.collector is not None:
                a.collector.cancel()
                await asyncio.gather(a.collector, return_exceptions=True)
            if a.alive:
                ray.kill(a.handle)
            self._gone(a, "the pool was closed")
        await self._shutdown_ray()
        await self._probe.close()

    async def _shutdown_ray(self) -> None:
        if self._owns_ray and self._ray is not None:
            self._ray.shutdown()
            self._owns_ray = False

    # ---- records coming back -----------------------------------------------------------------------------

    async def _collect(self, a: _Actor) -> None:
        try:
            while a.alive:
                for rid, stamped in await a.handle.collect.remote(1.0):
                    entry = a.pending.pop(rid, None)
                    if entry is not None and not entry[0].done():
                        entry[0].set_result(stamped)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - RayActorError and kin: the actor or its node is gone
            self._gone(a, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}"[:300])

    def _gone(self, a: _Actor, why: str) -> None:
        if not a.alive:
            return
        a.alive = False
        a.died = why
        now = time.perf_counter_ns() * 1e-9
        num = len(a.pending) + len(a.outgoing)
        for fut, send_at in a.pending.values():
            if not fut.done():
                fut.set_exception(ActorGone(f"{a.label()} died ({why})", send_at > now))
        a.pending.clear()
        a.outgoing.clear()
        if why != "the pool was closed":
            live = sum(1 for x in self._actors if x.alive)
            print(f"slobench: {a.label()} died ({why}); its {num} unfinished requests are failed, the run goes on "
                  f"with {live} actors", file=sys.stderr)

    # ---- the seam ----------------------------------------------------------------------------------------

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        live = [a for a in self._actors if a.alive]
        if not live:
            if not self._actors:
                raise RuntimeError("RayPool.send() before start()")
            record.fail("error", "internal: every Ray load actor has died", self.clock.now_s())
            return
        a = min(live, key=lambda x: len(x.pending))
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        origin_s = self.clock.origin_ns * 1e-9
        send_at_s = origin_s + record.scheduled_s  # driver perf_counter seconds
        a.pending[rid] = (fut, send_at_s)
        a.outgoing.append((rid, spec, a.cmap.to_remote(send_at_s)))
        self._schedule_flush(send_at_s)
        # provisional, kept if the request is cancelled before the actor answers; its own stamp replaces it
        record.sent_s = max(self.clock.now_s(), record.scheduled_s)
        try:
            stamped = await fut
        except asyncio.CancelledError:
            if a.pending.pop(rid, None) is not None and a.alive:
                a.outgoing[:] = [o for o in a.outgoing if o[0] != rid]
                a.handle.cancel.remote([rid])
            raise
        except ActorGone as e:
            due = not e.args[1]
            if not due:
                record.sent_s = None
            record.fail("error", f"internal: {e.args[0]} " + (
                "while this request was in flight (or due to be sent)" if due else "before this request was sent"),
                self.clock.now_s())
            return
        cmap = a.cmap  # the latest estimate: linear between the first and it
        apply_stamped(record, stamped, lambda t: cmap.to_driver(t) - origin_s)
        a.num_records += 1
        if record.sent_s is not None:
            a.lateness_s.append(record.sent_s - record.scheduled_s)

    def _schedule_flush(self, send_at_s: float) -> None:
        loop = asyncio.get_running_loop()
        if send_at_s - time.perf_counter_ns() * 1e-9 < 2 * BATCH_S:  # due soon (closed loop, or late): now
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(BATCH_S, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        for a in self._actors:
            if a.outgoing and a.alive:
                batch, a.outgoing = a.outgoing, []
                a.handle.submit.remote(batch)  # a dead actor's call fails; its collector says so

    # ---- client health -----------------------------------------------------------------------------------

    async def run_report(self, ttft_slo_s: float | None) -> dict[str, Any]:
        """Per actor since the last report: records, lateness, CPU, its clock map (with an end estimate
        taken now), and whether it died. Flags the clock uncertainty against `ttft_slo_s`."""
        import numpy as np

        actors = []
        for a in self._actors:
            cpu_s = loop_cpu_s = None
            if a.alive:
                await self._update_clock(a, NUM_SYNC_SAMPLES)
            if a.alive:
                try:
                    u = await a.handle.usage.remote()
                    cpu_s, a.cpu_mark_s = u["cpu_s"] - a.cpu_mark_s, u["cpu_s"]
                    loop_cpu_s, a.loop_cpu_mark_s = u["loop_cpu_s"] - a.loop_cpu_mark_s, u["loop_cpu_s"]
                except Exception as e:  # noqa: BLE001
                    self._gone(a, type(e).__name__)
            late = np.asarray(a.lateness_s, dtype=float)
            actors.append({
                "index": a.index, **a.info, "alive": a.alive, "died": a.died, "num_records": a.num_records,
                "lateness_s": {"p50": float(np.percentile(late, 50)) if late.size else None,
                               "p99": float(np.percentile(late, 99)) if late.size else None},
                "cpu_s": cpu_s,  # the actor's process, Ray's threads included
                "loop_cpu_s": loop_cpu_s,  # its event loop's thread: the load itself
                "clock": a.cmap.to_dict(),
            })
            a.lateness_s, a.num_records = [], 0
        worst = max((x["clock"]["uncertainty_s"] for x in actors), default=0.0)
        limit = CLOCK_LIMIT_OF_TTFT * ttft_slo_s if ttft_slo_s else None
        flagged = limit is not None and worst > limit
        died = [x for x in actors if x["died"]]
        return {
            "num_actors": len(actors),
            "num_died": len(died),
            "actors": actors,
            "clock_uncertainty_s": worst,
            "clock_uncertainty_limit_s": limit,
            "is_clock_flagged": flagged,
            "warning": (f"CLIENT CLOCKS UNCERTAIN: the load actors' clocks are known to ±{worst * 1e3:.2f} ms, "
                        f"more than {CLOCK_LIMIT_OF_TTFT:.0%} of the TTFT SLO ({limit * 1e3:.1f} ms); send times "
                        "and cross-actor ordering are that uncertain") if flagged and limit else None,
        }


async def _awaited(ref: Any) -> Any:
    return await ref


# ---- what the CLI adds to a run directory ------------------------------------------------------------------


async def note_client_clocks(target: Any, run_dir: Path, summary: RunSummary, slo: Any) -> RunSummary:
    """After a run through a `RayPool`: its per-actor health and clocks into the summary's client health
    (summary.json rewritten) and the clocks into manifest.json. Any other target: the summary as it was."""
    if not isinstance(target, RayPool):
        return summary
    report = await target.run_report(getattr(slo, "ttft_s", None))
    warning = " ".join(w for w in (summary.client.warning, report["warning"]) if w) or None
    notes = summary.notes
    if report["num_died"]:
        notes = (*(notes or ()), f"{report['num_died']} Ray load actor(s) died during the run; their unfinished "
                 "requests are recorded as failed and the run went on")
    summary = replace(summary, client=replace(summary.client, ray=report, warning=warning), notes=notes)
    run_dir = Path(run_dir)
    if (run_dir / SUMMARY).exists():
        write_summary(run_dir, summary)
    if (run_dir / MANIFEST).exists():
        manifest = read_manifest(run_dir)
        manifest["clock_sync"] = {
            "method": "NTP-style over Ray round trips: minimum-RTT sample, uncertainty RTT/2; linear between "
                      "the first estimate and the one at the run's end",
            "limit_s": report["clock_uncertainty_limit_s"],
            "actors": [{k: x[k] for k in ("index", "node_id", "hostname", "pid", "clock")} for x in report["actors"]],
        }
        write_json_atomic(run_dir / MANIFEST, manifest)
    return summary


def client_clock_lines(summary: RunSummary) -> list[str]:
    """Per-actor health for the terminal, after the run's table."""
    ray = summary.client.ray
    if not ray:
        return []

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.2f}"

    lines = [f"ray load actors: {ray['num_actors']} ({ray['num_died']} died); clock uncertainty "
             f"±{ms(ray['clock_uncertainty_s'])} ms"]
    for x in ray["actors"]:
        c = x["clock"]
        off = (c["end"] or c["start"])["offset_s"]
        lines.append(
            f"  actor {x['index']} {x.get('hostname', '?')}: {x['num_records']} records, lateness p50 "
            f"{ms(x['lateness_s']['p50'])} / p99 {ms(x['lateness_s']['p99'])} ms, CPU "
            f"{'-' if x['cpu_s'] is None else format(x['cpu_s'], '.2f')} s, offset {off:+.6f} s "
            f"±{ms(c['uncertainty_s'])} ms, drift {c['drift_ppm']:+.1f} ppm" + (f", DIED: {x['died']}" if x["died"] else "")
        )
    return lines
