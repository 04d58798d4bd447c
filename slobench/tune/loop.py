"""The tune: each configuration in turn, a server started, searched, stopped; tune.json after each.

A configuration that fails is a row with its reason, and the tune goes on. Ctrl-C (or SIGTERM, which the
CLI turns into KeyboardInterrupt) stops the current server and search, keeps the finished rows, exit 130.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slobench.errors import UsageError
from slobench.tune.calibrate_first import Calibration, calibrate_first
from slobench.tune.configs import TuneConfig
from slobench.tune.guided import (
    SIMULATED_ONLY,
    Guide,
    guided_block,
    ignored_params,
    simulate_all,
    simulated_rows,
)
from slobench.tune.result import FINISHED, TUNE, TuneRow, best_row, read_tune_doc, tune_rows, write_tune
from slobench.tune.search import SearchResult, capacity_argv, run_search, wait_ready
from slobench.tune.server_proc import ServerFailed, ServerRun, free_port, interrupts_held
from slobench.tune.table import print_table

SERVER_LOG = "server.log"
CAPACITY_DIR = "capacity"
EXIT_NONE_MEASURED = 4
EXIT_INTERRUPTED = 130


@dataclass(frozen=True, slots=True)
class TunePlan:
    out_dir: Path
    simulate: bool
    capacity_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 600.0
    grace_s: float = 30.0
    resume: bool = False
    guide: Guide | None = None

    def __post_init__(self) -> None:
        if self.ready_timeout_s <= 0:
            raise UsageError(f"--ready-timeout must be above 0 s (got {self.ready_timeout_s:g})")
        if self.grace_s < 0:
            raise UsageError(f"--stop-grace must be 0 s or more (got {self.grace_s:g})")

    @property
    def settings(self) -> dict[str, Any]:
        return {"simulate": self.simulate, "capacity_args": self.capacity_args,
                "ready_timeout_s": self.ready_timeout_s, "stop_grace_s": self.grace_s,
                "guided": None if self.guide is None else {"k": self.guide.k, "profile": self.guide.profile,
                                                           **({"calibrate": True} if self.guide.calibrate else {})}}


def prior_rows(plan: TunePlan) -> dict[str, TuneRow]:
    """The finished rows --resume keeps; without --resume, an existing tune is refused (exit 2)."""
    tune_json = plan.out_dir / TUNE
    if not tune_json.exists():
        return {}
    if not plan.resume:
        raise UsageError(f"{plan.out_dir} holds a tune already: --resume to finish it, or another --out")
    doc = read_tune_doc(plan.out_dir)
    rows = tune_rows(doc, plan.out_dir)
    old = doc.get("settings", {})
    if (old.get("simulate") != plan.simulate or old.get("capacity_args") != plan.capacity_args
            or old.get("guided") != plan.settings["guided"]):
        raise UsageError(f"--resume: {tune_json} was run with other settings ({old.get('capacity_args')}, "
                         f"simulate {old.get('simulate')}, guided {old.get('guided')}); give the same flags or another --out")
    return {r.name: r for r in rows if r.status in FINISHED}


def run_tune(configs: list[TuneConfig], plan: TunePlan) -> int:
    ignored = ignored_params(configs) if plan.guide is not None else []  # exit 2 before anything starts
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    done = prior_rows(plan)
    rows: dict[str, TuneRow] = {}
    sims: dict[str, SearchResult] = {}
    live = configs
    guide = plan.guide
    calibration: Calibration | None = None
    if guide is not None and guide.calibrate:  # the first configuration live, the profile fitted on it
        first = configs[0]
        rows[first.name], interrupted = measure(first, "[first: calibrates the guide]", plan, done.get(first.name))
        write_tune(plan.out_dir, list(rows.values()), plan.settings)
        if interrupted:
            print("slobench: interrupted before the guide was calibrated; --resume finishes the tune", file=sys.stderr)
            return EXIT_INTERRUPTED
        try:
            calibration = calibrate_first(rows[first.name], guide.profile, plan.out_dir, plan.grace_s)
        except KeyboardInterrupt:
            print("slobench: interrupted while calibrating; --resume finishes the tune", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(calibration.line(), file=sys.stderr)
        guide = replace(guide, profile=calibration.profile or guide.profile)
    if guide is not None:  # every configuration simulated; the top K by simulated capacity per GPU live
        try:
            sims = simulate_all(configs, guide, plan.out_dir, plan.capacity_args, plan.grace_s)
        except KeyboardInterrupt:
            print("slobench: interrupted while simulating; nothing more was measured", file=sys.stderr)
            return EXIT_INTERRUPTED
        order = simulated_rows(configs, sims)
        rows = {r.name: r for r in order} | {n: replace(r, simulated_capacity=sims[n].capacity) for n, r in rows.items()}
        by_name = {c.name: c for c in configs}
        live = [by_name[r.name] for r in order[:guide.k] if rows[r.name].status == SIMULATED_ONLY]

    def guided() -> dict[str, Any] | None:
        return None if guide is None else guided_block(list(rows.values()), guide, ignored,
                                                       calibration.to_dict() if calibration else None)

    code = 0
    for i, cfg in enumerate(live):
        rows[cfg.name], interrupted = measure(cfg, f"[{i + 1}/{len(live)}]", plan, done.get(cfg.name))
        if guide is not None:
            rows[cfg.name] = replace(rows[cfg.name], simulated_capacity=sims[cfg.name].capacity)
        write_tune(plan.out_dir, list(rows.values()), plan.settings, guided())
        if interrupted:
            code = EXIT_INTERRUPTED
            print("slobench: interrupted; the finished configurations are kept in "
                  f"{plan.out_dir / TUNE} (--resume finishes the tune)", file=sys.stderr)
            break
    write_tune(plan.out_dir, list(rows.values()), plan.settings, guided())  # rows kept by --resume included
    print_table(list(rows.values()), guided=guided())
    if code == 0 and best_row(list(rows.values())) is None:
        print("slobench: no configuration could be measured", file=sys.stderr)
        code = EXIT_NONE_MEASURED
    return code


def measure(cfg: TuneConfig, label: str, plan: TunePlan, kept: TuneRow | None) -> tuple[TuneRow, bool]:
    """One configuration live, or its row kept by --resume; (the row, whether Ctrl-C or SIGTERM stopped it)."""
    if kept is not None and kept.params == cfg.params:
        print(f"{label} {cfg.name}: {kept.status} in an earlier run, kept (--resume)", file=sys.stderr)
        return kept, False
    print(f"{label} {cfg.name}", file=sys.stderr)
    start = time.monotonic()
    try:
        row = one_config(cfg, plan)
    except KeyboardInterrupt:
        return TuneRow(cfg.name, cfg.params, "interrupted", cfg.gpus, cfg.command(),
                       reason="interrupted (Ctrl-C or SIGTERM)", wall_s=time.monotonic() - start), True
    row = replace(row, wall_s=time.monotonic() - start)
    print_row_line(row)
    return row, False


def print_row_line(row: TuneRow) -> None:
    cap = row.ranked_capacity or {}
    what = (f"{cap['capacity_rps']:.3g} req/s" if cap.get("capacity_rps") is not None else row.reason or "")
    print(f"  {row.name}: {row.status}: {what}", file=sys.stderr)


def one_config(cfg: TuneConfig, plan: TunePlan) -> TuneRow:
    cfg_dir = plan.out_dir / cfg.name
    cap_dir = cfg_dir / CAPACITY_DIR
    cfg_dir.mkdir(parents=True, exist_ok=True)
    rel = str(cap_dir.relative_to(plan.out_dir))
    if plan.simulate:
        argv = capacity_argv(cap_dir, url=None, knob_flags=list(cfg.argv), passed=plan.capacity_args)
        result = run_search(argv, cap_dir, cfg_dir, server=None, grace_s=plan.grace_s)
        return row_of(cfg, result, rel, simulated=True, command=argv)
    port = free_port()
    log = str((cfg_dir / SERVER_LOG).relative_to(plan.out_dir))
    ready_s = None
    server: ServerRun | None = None
    try:
        with interrupts_held():
            server = ServerRun(cfg.command(port), port, cfg_dir / SERVER_LOG, grace_s=plan.grace_s)
        ready_s = wait_ready(server, plan.ready_timeout_s, cfg.name)
        print(f"  {cfg.name}: ready after {ready_s:.1f} s on port {port}; searching", file=sys.stderr)
        argv = capacity_argv(cap_dir, url=f"{server.root_url}/v1", knob_flags=[], passed=plan.capacity_args)
        result = run_search(argv, cap_dir, cfg_dir, server=server, grace_s=plan.grace_s)
    except ServerFailed as e:
        return TuneRow(cfg.name, cfg.params, "failed", cfg.gpus, cfg.command(), reason=e.reason,
                       log_tail=e.log_tail, server_log=log, ready_s=ready_s)
    finally:
        if server is not None:
            with interrupts_held():  # a second Ctrl-C waits for the group to be gone: nothing left running
                server.stop()
    row = row_of(cfg, result, rel, simulated=False, command=cfg.command())
    return replace(row, server_log=log, ready_s=ready_s)


def row_of(cfg: TuneConfig, result: SearchResult, cap_dir: str, *, simulated: bool, command: list[str]) -> TuneRow:
    found = result.capacity is not None and result.capacity.get("capacity_rps") is not None
    status = ("simulated" if simulated else "measured") if found else (
        "inconclusive" if result.capacity is not None else "failed")
    cap = result.capacity if result.capacity is not None else None
    return TuneRow(cfg.name, cfg.params, status, cfg.gpus, command,
                   capacity=None if simulated else cap, simulated_capacity=cap if simulated else None,
                   reason=result.reason, log_tail=[] if found else result.log_tail, capacity_dir=cap_dir)
