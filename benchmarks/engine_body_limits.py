"""How does the engine's server hold up under many concurrent huge request bodies?

Starts `python -m reference_engine.server` twice, with the body limit off (`--max-body-size 1GiB`) and on
(the default), and against each sends N concurrent uploads of SIZE MiB (a prompt of token ids, or one long
text) from a separate process, while this one probes /health back to back. Prints /health's latency during
the uploads (against its idle latency), the server's peak RSS over idle and how the uploads were answered.
Figures: docs/measurements/engine_body_limits.md.

    python benchmarks/engine_body_limits.py [--uploads 16] [--size-mib 30] [--kinds ids,text]"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Sequence

from slobench.testing import EngineServerProcess

SETTINGS = {"limit off (--max-body-size 1GiB)": ["--max-body-size", "1GiB"], "limit on (default 8 MiB)": []}


def body_of(kind: str, size: int) -> bytes:
    if kind == "ids":
        return json.dumps({"prompt": [1000] * (size // 6)}).encode()
    return json.dumps({"prompt": "a" * size}).encode()


def upload(port: int, body: bytes, statuses: list[str]) -> None:
    """One upload with Content-Length; what came back: a status code, or the error that ended it."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            try:
                s.sendall(body)
            except OSError:
                pass  # refused before the body was read: the answer is already waiting
            statuses.append(s.recv(64).split(b" ")[1].decode())
    except (OSError, IndexError) as e:
        statuses.append(type(e).__name__)


def upload_all(port: int, kind: str, size: int, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    body = body_of(kind, size)
    statuses: list[str] = []
    threads = [threading.Thread(target=upload, args=(port, body, statuses)) for _ in range(n)]
    started = time.perf_counter()  # the body is built: from here on the server is busy
    out.put(started)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((statuses, time.perf_counter() - started))


def rss_mib(pid: int | None, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


async def health_s(port: int) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await writer.drain()
    await reader.read()
    writer.close()
    return time.perf_counter() - started


async def measure(flags: Sequence[str], kind: str, size: int, n: int) -> dict[str, str]:
    with EngineServerProcess("--executor", "modeled", "--body-timeout", "120", *flags) as srv:
        idle = [await health_s(srv.port) for _ in range(20)]
        idle_rss = rss_mib(srv.pid, "VmRSS")
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        uploader = multiprocessing.Process(target=upload_all, args=(srv.port, kind, size, n, out))
        uploader.start()
        out.get(timeout=300)  # the uploads start
        during: list[float] = []
        while uploader.is_alive() and out.empty():
            during.append(await health_s(srv.port))
        statuses, wall = out.get(timeout=300)
        uploader.join()
        peak = rss_mib(srv.pid, "VmHWM")
    counts = ", ".join(f"{c}x {s}" for s, c in sorted(collections.Counter(statuses).items()))
    return {"idle": f"{statistics.median(idle) * 1e3:.1f}",
            "p50": f"{statistics.median(during) * 1e3:.1f}" if during else "-",
            "max": f"{max(during) * 1e3:.0f}" if during else "-", "probes": str(len(during)),
            "peak": f"{peak - idle_rss:.0f}", "wall": f"{wall:.1f}", "answers": counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uploads", type=int, default=16)
    ap.add_argument("--size-mib", type=int, default=30)
    ap.add_argument("--kinds", default="ids,text", help="bodies: ids (a prompt of token ids), text (one string)")
    args = ap.parse_args()
    size = args.size_mib << 20
    print(f"{args.uploads} concurrent uploads of {args.size_mib} MiB each\n")
    print("| body | server | /health idle ms | during p50 ms | during max ms | probes | peak RSS over idle MiB "
          "| all answered s | answers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for name, flags in SETTINGS.items():
            r = asyncio.run(measure(flags, kind, size, args.uploads))
            print(f"| {kind} | {name} | {r['idle']} | {r['p50']} | {r['max']} | {r['probes']} | {r['peak']} "
                  f"| {r['wall']} | {r['answers']} |", flush=True)


if __name__ == "__main__":
    main()
