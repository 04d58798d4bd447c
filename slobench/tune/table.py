"""The tune's terminal table: configurations by capacity per GPU, with intervals, and the winner's command."""

from __future__ import annotations

import shlex
import sys
from typing import Any, TextIO

from slobench.printable import printable
from slobench.tune.result import TuneRow, ranked


def fmt_rps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def interval_text(row: TuneRow) -> str:
    cap = row.ranked_capacity or {}
    interval = cap.get("interval_rps")
    if not interval or interval[0] is None or interval[1] is None:
        return "-"
    return f"[{fmt_rps(interval[0])}, {fmt_rps(interval[1])}]"


def params_text(row: TuneRow) -> str:
    return " ".join(f"{k}={v}" for k, v in row.params.items()) or "(defaults)"


def print_table(rows: list[TuneRow], out: TextIO | None = None, guided: dict[str, Any] | None = None) -> None:
    """The table; with `guided` (a guided tune's block) a simulated column beside the measured one, and
    whether the simulator's ranking of the measured configurations held."""
    out = out or sys.stdout
    order = ranked(rows)
    header: tuple[str, ...] = ("#", "configuration", "status", "capacity req/s", "interval", "gpus", "req/s per gpu")
    sim_header = ("simulated req/s",) if guided is not None else ()
    lines = [header + sim_header]
    for i, r in enumerate(order):
        cap = r.ranked_capacity or {}
        bound = ">=" if cap.get("is_lower_bound") else ""  # the search stopped before the SLO broke
        sim = ((fmt_rps((r.simulated_capacity or {}).get("capacity_rps")),) if guided is not None else ())
        lines.append((str(i + 1), params_text(r), r.status, bound + fmt_rps(cap.get("capacity_rps")),
                      interval_text(r), str(r.gpus), bound + fmt_rps(r.per_gpu_rps), *sim))
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip(), file=out)
    for r in order:
        if r.reason:
            print(f"{r.name}: {printable(r.reason)}", file=out)
            for tail in r.log_tail[-5:]:
                print(f"    | {printable(tail)}", file=out)
        for note in search_notes(r):
            print(f"{r.name}: {printable(note)}", file=out)
    if guided is not None:
        print(ranking_line(guided), file=out)
    leaders = [r for r in order if r.per_gpu_rps is not None]
    if not leaders:
        return
    best = leaders[0]
    print(f"best: {params_text(best)} ({fmt_rps(best.per_gpu_rps)} req/s per GPU)", file=out)
    if len(leaders) > 1 and overlaps(best, leaders[1]):
        print(f"note: its interval overlaps that of {params_text(leaders[1])}: the two are not separated at "
              f"this confidence level (more --replicates or longer --duration would)", file=out)
    print(f"command: {shlex.join(best.command)}", file=out)


BOTTLENECK = "the client was the bottleneck"
MAX_NOTES = 3  # a row's notes shown at most (all are in its capacity.json)


def search_notes(row: TuneRow) -> list[str]:
    """What the row's capacity search noted, the client-bottleneck probes counted in one line (their capacity
    is then a floor of the server's, not a measure of it)."""
    notes = (row.capacity or {}).get("notes") or []
    if (row.capacity or {}).get("capacity_rps") is None and row.reason:  # (the reason said it already)
        return []
    busy = [n for n in notes if BOTTLENECK in n]
    rest = [n for n in notes if BOTTLENECK not in n][:MAX_NOTES]
    if busy:
        rest.append(f"{BOTTLENECK} in {len(busy)} probe(s): the capacity is a floor of the server's")
    return rest


def overlaps(a: TuneRow, b: TuneRow) -> bool:
    ia = (a.ranked_capacity or {}).get("interval_rps")
    ib = (b.ranked_capacity or {}).get("interval_rps")
    if not ia or not ib or None in ia or None in ib:
        return False
    return bool(ia[0] / a.gpus <= ib[1] / b.gpus and ib[0] / b.gpus <= ia[1] / a.gpus)


def ranking_line(guided: dict[str, Any]) -> str:
    """Whether the simulator's order of the measured configurations was their measured order."""
    measured = guided["measured_order"]
    ignored = (f"; parameters the simulation passed over: {', '.join(guided['ignored_params'])}"
               if guided.get("ignored_params") else "")
    cal = guided.get("calibrated")
    profile = (f"profile {cal['base']} calibrated on {cal['source']}" if cal and cal.get("profile") else
               f"profile {guided['profile']}" + (f", not calibrated: {cal['reason']}" if cal else ""))
    head = f"guided (--simulate-first {guided['k']}, {profile})"
    if len(measured) < 2:
        return (f"{head}: ranking held trivially: {len(measured)} configuration measured with a simulated "
                f"capacity, nothing to compare{ignored}")
    if guided["ranking_held"]:
        return f"{head}: the simulator's ranking held over the {len(measured)} measured configurations{ignored}"
    return (f"{head}: the simulator's ranking did not hold: simulated {' > '.join(guided['simulated_order'])}, "
            f"measured {' > '.join(measured)}{ignored}")
