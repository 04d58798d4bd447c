"""How much does the client itself distort what it measures, and what does it cost?

Drives the scheduled-token server (pinned to one core) with open-loop Poisson traffic from this process
(pinned to the other) and prints, per rate and client: achieved send rate, send lateness, the marginal
CPU per request (first send to last answer), and the TTFT error (the client's TTFT minus the server's own,
from its log on the same clock). Then the fixed cost: the CPU of whole processes for `--help` and a
5-request run, slobench's (from each of `--trees`) beside the floor's. "floor" is a minimal aiohttp client
that parses nothing; both run on slobench's event loop (`--loop`). With `--trees`, slobench's load runs once
per source tree in a child process. `--path N`: only the client's own path, no network. Targets: 800 req/s
of 16-token streams on one core, at most 0.3 ms of CPU a request, a 5-request run under 1 s of CPU.
Figures: docs/measurements/client_overhead.md.

    python benchmarks/client_overhead.py [--rates 400,800] [--seconds 6] [--transports raw,httpx]
                                         [--rounds N] [--max-load L] [--fixed N] [--trees DIR,DIR] [--path N]"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from result_json import write_result  # this folder is on sys.path

import slobench
from slobench.analysis.metrics import RecordArrays, achieved_send_rps, throughput
from slobench.run.clock import Clock
from slobench.run.event_loop import run_async
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets import rawhttp
from slobench.targets.base import TargetBase
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.workers import WorkerPool
from slobench.testing import TokenServerProcess
from slobench.workload import PoissonArrivals


def make_specs(rate: float, seconds: float, output_len: int, seed: int) -> list[RequestSpec]:
    arrivals = PoissonArrivals(rate).schedule(np.random.default_rng(seed), duration_s=seconds)
    prompt = tuple(range(1000, 1016))
    return [
        RequestSpec(i, float(t), prompt, len(prompt), output_len, extra_body=(("x_request_id", i),))
        for i, t in enumerate(arrivals)
    ]


class _LoadCpu(TargetBase):
    """The target, noting the process CPU time as each of the run's last requests finishes: the CPU up to
    the last one is the load's; what run() spends after it (the summary, its lazy imports) is reported
    apart. Only the last second's requests read the CPU clock (a system call: reading it on every request
    was 5% of the samples)."""

    def __init__(self, inner: OpenAITarget | WorkerPool, specs: list[RequestSpec]) -> None:
        self.inner = inner
        self.clock = inner.clock
        self.send_lead_s = inner.send_lead_s
        self.cpu_at_last_s = 0.0
        self._tail_s = max(s.arrival_s for s in specs) - 1.0

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        try:
            await self.inner.send(spec, record)
        finally:
            if spec.arrival_s >= self._tail_s:
                self.cpu_at_last_s = time.process_time()


def _opts(spin_s: float | None, hold_gc: bool = True) -> RunOptions:
    if spin_s is None:
        return RunOptions(progress=False, hold_gc=hold_gc)
    return RunOptions(progress=False, spin_s=spin_s, hold_gc=hold_gc)


def _syscalls() -> tuple[int, int]:
    """This process's read and write system calls so far (Linux's /proc/self/io; zeros elsewhere): how many
    reads a request took tells how the server's writes were batched, which moves the CPU a request."""
    try:
        with open("/proc/self/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        return int(io["syscr"]), int(io["syscw"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children only: the workers, after close()
    return ru.ru_utime + ru.ru_stime


async def measure(srv: TokenServerProcess, rate: float, seconds: float, name: str, output_len: int,
                  workers: int = 1, spin_s: float | None = None, profile: str | None = None) -> dict:
    transport, _, variant = name.partition("+")
    if variant not in ("", "gc"):
        raise SystemExit(f"--transports: unknown variant {name!r} (TRANSPORT or TRANSPORT+gc)")
    clock = Clock()
    specs = make_specs(rate, seconds, output_len, seed=int(rate))
    target: OpenAITarget | WorkerPool
    if workers > 1:
        target = WorkerPool(workers, srv.base_url, TargetOptions(model=srv.model, transport=transport),  # type: ignore[arg-type]
                            clock=clock)
    else:
        target = OpenAITarget(srv.base_url, TargetOptions(model=srv.model, transport=transport), clock)  # type: ignore[arg-type]
    await target.start()
    children0 = _children_cpu_s()
    run_dir = Path(tempfile.mkdtemp(prefix="client_overhead_run_"))
    try:
        # warm the connection pool so the first second doesn't measure connection set-up
        warm = make_specs(rate, 0.5, output_len, seed=1)
        await run(warm, target, opts=RunOptions(progress=False), handle_sigint=False)
        log_before = len(srv.read_log())
        counted = _LoadCpu(target, specs)
        prof = cProfile.Profile() if profile else None
        io0 = _syscalls()
        cpu0 = time.process_time()
        if prof:
            prof.enable()
        # a run directory as the command line writes one: each record is written as its request finishes
        res = await run(specs, counted, opts=_opts(spin_s, hold_gc=variant != "gc"),  # type: ignore[arg-type]
                        handle_sigint=False, run_dir=run_dir)
        if prof:
            prof.disable()
            prof.dump_stats(f"{profile}.{name}-{rate:g}.prof")
        cpu_all = time.process_time() - cpu0
        io1 = _syscalls()
        cpu = (counted.cpu_at_last_s or cpu0 + cpu_all) - cpu0
    finally:
        await target.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    # The workers' CPU is known only once they exit: spread it over warm-up and measured requests alike.
    worker_cpu = (_children_cpu_s() - children0) * len(specs) / (len(specs) + len(warm))
    a = RecordArrays.from_records(res.records)
    server = {e["id"]: e for e in srv.read_log()[log_before:] if e.get("id") is not None}
    errs = []
    for r in res.records:
        e = server.get(r.request_id)
        if e and r.first_token_s is not None and r.sent_s is not None and e.get("chunk_s"):
            errs.append((r.first_token_s - r.sent_s) - (e["chunk_s"][0] - e["recv_s"]))
    late = a.lateness_s[~np.isnan(a.lateness_s)]
    return {
        "rate": rate,
        "transport": name,
        "n": len(res.records),
        "ok": int(a.is_ok.sum()),
        "achieved": achieved_send_rps(a),
        "offered": throughput(a).offered_rps,  # this schedule's own rate (Poisson noise aside)
        "late_p50_ms": float(np.percentile(late, 50) * 1e3),
        "late_p99_ms": float(np.percentile(late, 99) * 1e3),
        "workers": workers,
        "cpu_ms_per_req": (cpu + worker_cpu) / max(1, len(res.records)) * 1e3,
        "parent_cpu_ms_per_req": cpu / max(1, len(res.records)) * 1e3,
        "after_ms_per_req": (cpu_all - cpu) / max(1, len(res.records)) * 1e3,
        "ttft_err_p50_ms": float(np.median(errs) * 1e3) if errs else float("nan"),
        "ttft_err_p99_ms": float(np.percentile(errs, 99) * 1e3) if errs else float("nan"),
        # over the whole run, its summary and the run directory's last writes included
        "reads_per_req": (io1[0] - io0[0]) / max(1, len(res.records)),
        "writes_per_req": (io1[1] - io0[1]) / max(1, len(res.records)),
    }


async def measure_floor(srv: TokenServerProcess, rate: float, seconds: float, output_len: int) -> dict:
    """The floor: the least an aiohttp client can do for the same traffic. It sleeps to each send time (an
    asyncio sleep: up to ~1 ms late), POSTs a small JSON body, stamps the send with aiohttp's request-sent
    hook and the first read of the body, and reads on to the end: no SSE parsing, no JSON decoding, no
    record."""
    import aiohttp

    async def call_on_sent(_session: object, ctx: Any, _params: object) -> None:
        ctx.trace_request_ctx()

    clock = Clock()
    hook = aiohttp.TraceConfig()
    hook.on_request_chunk_sent.append(call_on_sent)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=4),
                                    trace_configs=[hook])
    url = srv.base_url + "/completions"
    prompt = list(range(1000, 1016))
    stamps: dict[int, list[float]] = {}

    async def one(i: int) -> None:
        body = json.dumps({"model": srv.model, "prompt": prompt, "max_tokens": output_len, "stream": True,
                           "ignore_eos": True, "x_request_id": i}).encode()
        st = stamps[i] = [0.0, 0.0]  # sent, first read

        def on_sent() -> None:
            st[0] = clock.now_s()

        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                trace_request_ctx=on_sent) as resp:
            async for _ in resp.content.iter_any():
                if not st[1]:
                    st[1] = clock.now_s()

    async def schedule(specs: list[RequestSpec]) -> None:
        tasks = set()
        clock.reset()
        for s in specs:
            delay = s.arrival_s - clock.now_s()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.ensure_future(one(s.request_id))
            tasks.add(t)
        await asyncio.gather(*tasks)

    try:
        await schedule(make_specs(rate, 0.5, output_len, seed=1))
        stamps.clear()
        log_before = len(srv.read_log())
        specs = make_specs(rate, seconds, output_len, seed=int(rate))
        io0 = _syscalls()
        cpu0 = time.process_time()
        await schedule(specs)
        cpu = time.process_time() - cpu0
        io1 = _syscalls()
    finally:
        await session.close()
    server = {e["id"]: e for e in srv.read_log()[log_before:] if e.get("id") is not None}
    errs = [(st[1] - st[0]) - (server[i]["chunk_s"][0] - server[i]["recv_s"])
            for i, st in stamps.items() if i in server and server[i].get("chunk_s") and st[1]]
    late = np.array([stamps[s.request_id][0] - s.arrival_s for s in specs])
    span = max(st[0] for st in stamps.values()) - min(st[0] for st in stamps.values())
    offered = (len(specs) - 1) / (specs[-1].arrival_s - specs[0].arrival_s)
    return {
        "rate": rate, "transport": "floor", "n": len(specs), "ok": len(errs),
        "achieved": (len(specs) - 1) / span, "offered": offered,
        "late_p50_ms": float(np.percentile(late, 50) * 1e3), "late_p99_ms": float(np.percentile(late, 99) * 1e3),
        "workers": 1, "cpu_ms_per_req": cpu / len(specs) * 1e3, "parent_cpu_ms_per_req": cpu / len(specs) * 1e3,
        "after_ms_per_req": 0.0,
        "ttft_err_p50_ms": float(np.median(errs) * 1e3), "ttft_err_p99_ms": float(np.percentile(errs, 99) * 1e3),
        "reads_per_req": (io1[0] - io0[0]) / len(specs), "writes_per_req": (io1[1] - io0[1]) / len(specs),
    }


# ---- the client's own path, no network: what the Python a request runs costs --------------------------

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked"
         b"\r\nDate: Thu, 03 Dec 2026 16:00:00 GMT\r\nServer: Python/3.11 aiohttp/3.14.5\r\n\r\n")


def _answer(output_len: int, one_read: bool) -> list[bytes]:
    """The token server's answer to a streamed completion, as the reads that bring it: the head, then every
    event in one read (`one_read`: a server that is behind) or an event a read, then the last chunk."""
    frame = (b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"test-model","choices":[{"index":0,'
             b'"text":" tok","logprobs":null,"finish_reason":%s}]}\n\n')
    usage = {"prompt_tokens": 16, "total_tokens": 16 + output_len, "completion_tokens": output_len}
    events = [frame % b"null"] * (output_len - 1) + [frame % b'"length"', b"data: " + json.dumps(
        {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "test-model", "choices": [],
         "usage": usage}).encode() + b"\n\n", b"data: [DONE]\n\n"]
    chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    return [_HEAD, *([b"".join(chunks)] if one_read else chunks), b"0\r\n\r\n"]


async def path_cost(n: int, output_len: int, one_read: bool) -> float:
    """Microseconds of CPU a request through the raw transport, OpenAITarget, the runner and a run
    directory's writer, with no network: each connection's socket is a stand-in (the raw transport's
    `_connect` replaced) that answers a request's write with `_answer`'s reads, one loop turn apart. No
    kernel, no server, no cold caches: the Python a request runs, steady from one run to the next."""
    reads = _answer(output_len, one_read)

    class Socket(asyncio.Transport):
        def __init__(self, conn: Any) -> None:
            super().__init__()
            self.conn, self.closing = conn, False

        def write(self, data: Any) -> None:
            loop = asyncio.get_running_loop()

            def deliver(i: int) -> None:
                if not self.closing:
                    self.conn.data_received(reads[i])
                    if i + 1 < len(reads):
                        loop.call_soon(deliver, i + 1)
            loop.call_soon(deliver, 0)

        def is_closing(self) -> bool:
            return self.closing

        def abort(self) -> None:
            self.closing = True
            self.conn.connection_lost(None)

        close = abort

    async def connect(_tr: Any, target: Any, _loop: Any, _deadline: float) -> Any:
        conn = rawhttp._Conn(target.key)
        conn.connection_made(Socket(conn))
        return conn

    rawhttp.RawHttpTransport._connect = connect  # type: ignore[method-assign]
    target = OpenAITarget("http://127.0.0.1:1/v1", TargetOptions(model="test-model"), Clock())
    await target.start()
    prompt = tuple(range(1000, 1016))
    # sent back to back (the schedule is faster than the loop): a few requests in flight at a time
    specs = [RequestSpec(i, i * 20e-6, prompt, 16, output_len, extra_body=(("x_request_id", i),)) for i in range(n)]
    run_dir = Path(tempfile.mkdtemp(prefix="client_path_"))
    try:
        await run(specs[:200], target, opts=RunOptions(progress=False), handle_sigint=False)  # the pool, the caches
        counted = _LoadCpu(target, specs)
        counted._tail_s = 0.0  # every request notes the CPU as it finishes
        cpu0 = time.process_time()
        res = await run(specs, counted, opts=RunOptions(progress=False), handle_sigint=False,  # type: ignore[arg-type]
                        run_dir=run_dir)
        cpu = counted.cpu_at_last_s - cpu0
    finally:
        await target.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    bad = [r for r in res.records if r.status != "ok" or r.output_tokens != output_len]
    if bad:
        raise SystemExit(f"path: a request went wrong: {bad[0]}")
    return cpu / n * 1e6


class _Peer:
    """The running token server as a child process sees it: its URL, model and log."""

    def __init__(self, base_url: str, model: str, log_path: str) -> None:
        self.base_url, self.model, self.log_path = base_url, model, Path(log_path)

    def read_log(self) -> list[dict[str, Any]]:
        text = self.log_path.read_text() if self.log_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def measure_in_tree(tree: str, srv: TokenServerProcess, loop: str, **kw: Any) -> dict:
    """`measure` run by a child process that imports slobench from `tree` (it inherits this process's core)."""
    job = {"base_url": srv.base_url, "model": srv.model, "log_path": str(srv.log_path), "loop": loop, **kw}
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"{tree}: the child run failed (exit {out.returncode})\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def path_in_tree(tree: str | None, loop: str, n: int, output_len: int, one_read: bool) -> float:
    """`path_cost` in a child process importing slobench from `tree` (None: this process's own tree)."""
    job = {"path": True, "loop": loop, "n": n, "output_len": output_len, "one_read": one_read}
    env = {**os.environ, "PYTHONPATH": tree} if tree else dict(os.environ)
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"{tree}: the path child failed (exit {out.returncode})\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def child_main(job_json: str) -> None:
    job = json.loads(job_json)
    if job.pop("path", False):
        print(run_on(job.pop("loop"), path_cost(**job)))
        return
    peer = _Peer(job.pop("base_url"), job.pop("model"), job.pop("log_path"))
    loop = job.pop("loop")
    print(json.dumps(run_on(loop, measure(peer, **job))))  # type: ignore[arg-type]


def run_on(loop: str, coro: Any) -> Any:
    if loop == "auto":  # what slobench itself runs on: uvloop where installed
        return run_async(coro)
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


# The floor's whole program for the fixed cost: start, POST `n` streams one after another, read each to the
# end, exit. What it costs beyond `python -c pass` is the least any Python client pays to start and stop.
FLOOR_PROGRAM = """
import asyncio, json, sys
import aiohttp
try:
    import uvloop
except ImportError:
    uvloop = None
url, model, n, output_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
async def main():
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = json.dumps({"model": model, "prompt": list(range(1000, 1016)), "max_tokens": output_len,
                               "stream": True, "ignore_eos": True}).encode()
            async with session.post(url + "/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                async for _ in resp.content.iter_any():
                    pass
if uvloop is not None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
else:
    asyncio.run(main())
"""


def _child_cpu_s(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """The CPU (user + system) one child process spends from start to exit. `cwd` holds no package: `python
    -m` puts the working directory before PYTHONPATH, and a checkout's would shadow the tree asked for."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:6])} ...: exit {proc.returncode}\n{err[-2000:]}")
    return ru.ru_utime + ru.ru_stime


def fixed_costs(srv: TokenServerProcess, trees: list[str], repeats: int, output_len: int) -> list[dict]:
    """CPU of whole processes, each the median of `repeats` after one untimed start (which writes the
    bytecode caches, as an installed package has them): the interpreter alone, the floor's 5-request
    program, and per source tree `slobench --help`, `slobench run --help` and a 5-request `slobench run`
    (preflight, the run, its summary and the printed table)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    py = sys.executable
    cmds: list[tuple[str, str, list[str], dict[str, str]]] = [
        ("python -c pass", "-", [py, "-c", "pass"], env),
        ("floor: 5 requests", "-", [py, "-c", FLOOR_PROGRAM, srv.base_url, srv.model, "5", str(output_len)], env),
    ]
    out_root = Path(tempfile.mkdtemp(prefix="client_overhead_"))
    for k, tree in enumerate(trees):
        tenv = {**env, "PYTHONPATH": tree}
        run = [py, "-m", "slobench", "run", "--url", srv.base_url, "--model", srv.model, "--num-requests", "5",
               "--rate", "50", "--input-len", "16", "--output-len", str(output_len), "--no-progress",
               "--overwrite", "--out", str(out_root / f"run{k}")]
        cmds += [("slobench --help", tree, [py, "-m", "slobench", "--help"], tenv),
                 ("slobench run --help", tree, [py, "-m", "slobench", "run", "--help"], tenv),
                 ("slobench run: 5 requests", tree, run, tenv)]
    rows = []
    for what, tree, argv, cenv in cmds:
        _child_cpu_s(argv, cenv, out_root)
        cpu = sorted(_child_cpu_s(argv, cenv, out_root) for _ in range(repeats))
        rows.append({"what": what, "tree": tree, "cpu_s": cpu[len(cpu) // 2], "min_s": cpu[0], "max_s": cpu[-1]})
    shutil.rmtree(out_root, ignore_errors=True)
    return rows


def _path_table(args: argparse.Namespace, trees: list[str | None], load_before: tuple[float, ...]) -> None:
    cost: dict[tuple[str | None, bool], list[float]] = {(t, one): [] for t in trees for one in (True, False)}
    for _ in range(args.rounds):
        for one in (True, False):
            for tree in trees:
                cost[tree, one].append(path_in_tree(tree, args.loop, args.path, args.output_len, one))
    labels = _tree_labels([t for t in trees if t]) if trees[0] else {}
    print(f"\nthe client's own path ({args.loop} loop, no network): CPU µs a request, {args.output_len}-token "
          f"streams, {args.path} requests, median of {args.rounds} [min–max]; load average before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| source tree | the stream in one read | an event a read |" + (" × first tree |" if len(trees) > 1 else ""))
    print("|---|---|---|" + ("---|" if len(trees) > 1 else ""))
    for tree in trees:
        cells = []
        for one in (True, False):
            v = np.array(cost[tree, one])
            cells.append(f"{np.median(v):.1f} [{v.min():.1f}–{v.max():.1f}]")
        ratio = ""
        if len(trees) > 1:
            r = [np.median(np.array(cost[tree, one]) / np.array(cost[trees[0], one])) for one in (True, False)]
            ratio = f" {r[0]:.2f} / {r[1]:.2f} |"
        print(f"| {labels.get(tree, tree) if tree else 'this one'} | {cells[0]} | {cells[1]} |{ratio}")


def _tree_labels(trees: list[str]) -> dict[str, str]:
    """A short name per tree for the rows: its directory's name, or its number where two share one."""
    names = [Path(t).resolve().name or t for t in trees]
    return {t: n if names.count(n) == 1 else f"{i + 1}:{n}" for i, (t, n) in enumerate(zip(trees, names, strict=True))}


def _wait_for_load(max_load: float | None, limit_s: float = 300.0) -> float:
    """Wait (up to `limit_s`) until the 1-minute load average is under `max_load`; return the load."""
    deadline = time.monotonic() + limit_s
    while max_load is not None and os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5.0)
    return os.getloadavg()[0]


def _row(r: dict) -> str:
    return (f"| {r['transport']} | {r['workers']} | {r['rate']:g} | {r['offered']:.1f} | "
            f"{r['achieved']:.1f} ({r['achieved'] / r['offered'] - 1:+.2%}) | "
            f"{r['ok']}/{r['n']} | {r['late_p50_ms']:.2f} | {r['late_p99_ms']:.2f} | {r['cpu_ms_per_req']:.2f} | "
            f"{r['parent_cpu_ms_per_req']:.2f} | {r['after_ms_per_req']:.2f} | {r['ttft_err_p50_ms']:.2f} | "
            f"{r['ttft_err_p99_ms']:.2f} | {r['reads_per_req']:.1f} / {r['writes_per_req']:.1f} |")


def _ratio(rs: list[dict], base: dict[tuple[int, float], float]) -> str:
    """Each row's CPU a request over `base`'s in the same round and at the same rate: median [min–max]."""
    ratio = np.array([r["cpu_ms_per_req"] / base[r["round"], r["rate"]] for r in rs if (r["round"], r["rate"]) in base])
    return (f"{np.median(ratio):.2f} [{ratio.min():.2f}–{ratio.max():.2f}]" if len(ratio) > 1
            else f"{ratio[0]:.2f}" if len(ratio) else "–")


def _medians(rows: list[dict], first_tree: str | None = None) -> None:
    """Per client and rate, the median over rounds and [min–max], and the CPU relative to the same
    round's floor (and, with several trees, to the first tree's)."""
    floor_cpu = {(r["round"], r["rate"]): r["cpu_ms_per_req"] for r in rows if r["transport"] == "floor"}
    first_cpu = {(r["round"], r["rate"]): r["cpu_ms_per_req"] for r in rows if r["transport"] == first_tree}
    print("\n| client | workers | target req/s | rounds | CPU ms / request | × floor (same round) | "
          + ("× first tree (same round) | " if first_tree else "") + "lateness p50 / p99 ms | TTFT error p50 / p99 ms | "
          "reads a request |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if first_tree else ""))
    keys = dict.fromkeys((r["transport"], r["workers"], r["rate"]) for r in rows)
    for name, workers, rate in keys:
        rs = [r for r in rows if (r["transport"], r["workers"], r["rate"]) == (name, workers, rate)]

        def med(k: str, rs: list[dict] = rs) -> str:
            v = np.array([r[k] for r in rs])
            return f"{np.median(v):.2f} [{v.min():.2f}–{v.max():.2f}]" if len(v) > 1 else f"{v[0]:.2f}"

        vs_first = f"{_ratio(rs, first_cpu)} | " if first_tree else ""
        print(f"| {name} | {workers} | {rate:g} | {len(rs)} | {med('cpu_ms_per_req')} | {_ratio(rs, floor_cpu)} | "
              f"{vs_first}{med('late_p50_ms')} / {med('late_p99_ms')} | {med('ttft_err_p50_ms')} / "
              f"{med('ttft_err_p99_ms')} | {med('reads_per_req')} |")


def _fixed_table(rows: list[dict], repeats: int) -> None:
    base = next(r["cpu_s"] for r in rows if r["what"] == "python -c pass")
    print(f"\nfixed cost: CPU of the whole process (user + system), median of {repeats} [min–max]")
    print("| what | source tree | CPU s | beyond `python -c pass` s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['tree']} | {r['cpu_s']:.2f} [{r['min_s']:.2f}–{r['max_s']:.2f}] | "
              f"{r['cpu_s'] - base:.2f} |")


def _write_headline(rows: list[dict], fixed: list[dict], client: str, tree: str) -> None:
    """The README's figures, when this run has them (800 and 1,200 req/s beside the floor, and the fixed
    cost): `client`'s median CPU a request and its median ratio to the same round's floor, and the CPU of
    `tree`'s whole 5-request run."""
    floor_cpu = {(r["round"], r["rate"]): r["cpu_ms_per_req"] for r in rows if r["transport"] == "floor"}
    figures: dict[str, float] = {}
    for rate in (800, 1200):
        rs = [r for r in rows if r["transport"] == client and r["rate"] == rate and (r["round"], rate) in floor_cpu]
        if rs:
            figures[f"cpu_ms_{rate}"] = round(float(np.median([r["cpu_ms_per_req"] for r in rs])), 2)
            figures[f"x_floor_{rate}"] = round(float(np.median(
                [r["cpu_ms_per_req"] / floor_cpu[r["round"], rate] for r in rs])), 2)
    run5 = [r["cpu_s"] for r in fixed if r["what"] == "slobench run: 5 requests" and r["tree"] == tree]
    if run5:
        figures["run5_cpu_s"] = round(run5[0], 2)
    write_result("client_overhead", figures, note=f"the client: {client}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="400,800")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--transports", default="raw,httpx", help="comma-separated: raw, httpx; TRANSPORT+gc leaves the GC running over the load")
    ap.add_argument("--client-workers", default="1", help="comma-separated worker counts to compare (1 = in-process)")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--spin-ms", type=float, default=None, help="RunOptions.spin_s in ms (default: the runner's)")
    ap.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                    help="the event loop of both clients (auto, the default: slobench's own choice, uvloop where "
                         "installed)")
    ap.add_argument("--fixed", type=int, default=3, metavar="N",
                    help="whole-process CPU of `--help`, a 5-request run and the floor's, median of N (0: skip)")
    ap.add_argument("--trees", default=None, metavar="DIR,DIR",
                    help="slobench from each of these source trees (PYTHONPATH), side by side: its load in a child "
                         "process per tree, and its fixed cost (default: the one imported here, in this process)")
    ap.add_argument("--path", type=int, default=0, metavar="N",
                    help="only the client's own path, no network: CPU a request over N requests (each tree's, "
                         "interleaved --rounds times), the stream in one read and an event a read")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a --trees child: one measure() as JSON
    ap.add_argument("--no-floor", action="store_true", help="skip the minimal aiohttp client (the floor)")
    ap.add_argument("--rounds", type=int, default=1, help="run every client this many times, interleaved")
    ap.add_argument("--max-load", type=float, default=None,
                    help="before each round, wait (up to 5 min) for the 1-minute load average to fall under this")
    ap.add_argument("--profile", default=None, metavar="PREFIX",
                    help="cProfile slobench's measured runs into PREFIX.CLIENT-RATE.prof (the profiler's own cost "
                         "inflates that row's CPU)")
    args = ap.parse_args()
    if args.child is not None:
        child_main(args.child)
        return
    if args.rounds < 1:
        ap.error(f"--rounds: must be at least 1 (got {args.rounds})")
    load_before = os.getloadavg()
    if args.path:
        _path_table(args, args.trees.split(",") if args.trees else [None], load_before)
        return
    cores = sorted(os.sched_getaffinity(0))
    rates = [float(r) for r in args.rates.split(",")]
    spin = None if args.spin_ms is None else args.spin_ms / 1e3
    trees = args.trees.split(",") if args.trees else []
    clients: list[tuple[str, int, str | None]] = [] if args.no_floor else [("floor", 1, None)]
    clients += [(t, int(w), tree) for tree in (trees or [None]) for t in args.transports.split(",")
                for w in args.client_workers.split(",")]
    labels = _tree_labels(trees)
    round_loads = []
    with TokenServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, log=True) as srv:
        if len(cores) >= 2:  # server on one core, client on another: neither measures the other's CPU
            os.sched_setaffinity(srv.pid or 0, {cores[-1]})
            os.sched_setaffinity(0, {cores[0]})
        rows = []
        for rnd in range(args.rounds):
            round_loads.append(_wait_for_load(args.max_load))
            order = clients[rnd % len(clients):] + clients[:rnd % len(clients)]
            for rate in rates:
                for name, workers, tree in order:
                    if name == "floor":
                        row = run_on(args.loop, measure_floor(srv, rate, args.seconds, args.output_len))
                    elif tree is not None:
                        row = measure_in_tree(tree, srv, args.loop, rate=rate, seconds=args.seconds, name=name,
                                              output_len=args.output_len, workers=workers, spin_s=spin,
                                              profile=f"{args.profile}.{labels[tree]}" if args.profile else None)
                        row["transport"] = f"{name} @{labels[tree]}"
                    else:
                        row = run_on(args.loop, measure(srv, rate, args.seconds, name, args.output_len, workers, spin,
                                                             args.profile))
                    row["round"] = rnd
                    rows.append(row)
                    if args.rounds > 1:
                        print(f"round {rnd + 1}/{args.rounds}: {_row(row)}", flush=True)
        fixed_trees = trees or [str(Path(slobench.__file__).resolve().parents[1])]
        fixed = fixed_costs(srv, fixed_trees, args.fixed, args.output_len) if args.fixed > 0 else []
    print(f"\nclient overhead ({args.loop} loop): {args.output_len}-token streams, server TTFT {args.ttft_ms:g} ms / ITL {args.itl_ms:g} ms, "
          f"{args.seconds:g} s per rate, {os.cpu_count()} cores; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
          + (f"; 1-minute load at each round's start {min(round_loads):.2f}–{max(round_loads):.2f}"
             if args.rounds > 1 else ""))
    print("| transport | workers | target req/s | scheduled req/s | achieved req/s | ok | lateness p50 ms | "
          "lateness p99 ms | client CPU ms/req | parent CPU ms/req | after-run CPU ms/req | TTFT error p50 ms | "
          "TTFT error p99 ms | reads / writes a request |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))
    if args.rounds > 1:
        first = f"{args.transports.split(',')[0]} @{labels[trees[0]]}" if len(trees) > 1 else None
        _medians(rows, first)
    if fixed:
        _fixed_table(fixed, args.fixed)
    # the headline is the last tree's (the newest, by the page's BEFORE,AFTER order) first transport
    transport = args.transports.split(",")[0]
    _write_headline(rows, fixed, f"{transport} @{labels[trees[-1]]}" if trees else transport, fixed_trees[-1])


if __name__ == "__main__":
    main()
