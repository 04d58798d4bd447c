"""`slobench tune`: the capacity search at the SLO for every server configuration, ranked per GPU."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from slobench.cli.common import default_out
from slobench.errors import UsageError
from slobench.tune.configs import (
    ENGINE_KNOBS,
    SIMULATE_ONLY_KNOBS,
    TuneConfig,
    Value,
    bundled_engine,
    cross,
    from_template,
    parse_params,
    read_config_file,
)
from slobench.tune.guided import SIMULATED_DIR, Guide, ignored_params, simulation_argv
from slobench.tune.loop import TunePlan, run_tune
from slobench.tune.search import capacity_argv, check_capacity_flags

DEFAULT_PROFILE = "cpu-tiny"  # what `slobench serve --executor modeled` runs by default

DESCRIPTION = """\
Starts a server per configuration (--serve-cmd with {port} and one {placeholder} per --param, or the
bundled engine's knobs), waits until it answers /health or /v1/models, runs `slobench capacity` against it
with the flags below, stops its process group, and ranks the configurations by capacity per GPU.
Writes OUT/tune.json after each configuration, and OUT/<configuration>/ with server.log, capacity.log
and the capacity directory. A configuration that does not start or exits is a failed row; the tune goes
on. --simulate: no server, each configuration a `capacity --simulate` with its knobs. Exit 4 when no
configuration could be measured, 130 on Ctrl-C (finished rows kept; --resume finishes the tune).
--simulate-first K --profile P: every configuration simulated first, only the top K started and measured;
without --profile (or with --calibrate), the first configuration is measured first and the profile's host
costs fitted on it."""

# `slobench capacity` flags a tune passes through to every search, as given.
PASSED_FLAGS = ("--workload", "--slo", "--replicates", "--duration", "--num-requests", "--start-rate", "--factor",
                "--tolerance", "--max-probes", "--max-rate", "--level", "--seed", "--model", "--api", "--warmup",
                "--timeout", "--input-len", "--output-len", "--scrape-interval", "--trace", "--server-profile",
                "--tokenizer")


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    c = p.add_argument_group("configurations")
    c.add_argument("--serve-cmd", metavar="TEMPLATE",
                   help="the server's command, e.g. 'vllm serve M --port {port} --max-num-seqs {max_num_seqs}' "
                        "(default: the bundled engine, `slobench serve --executor modeled`)")
    c.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2",
                   help="a parameter's values, crossed with the others' (repeatable); without --serve-cmd, a "
                        f"knob of the bundled engine: {', '.join(ENGINE_KNOBS)} "
                        f"({', '.join(SIMULATE_ONLY_KNOBS)} with --simulate)")
    c.add_argument("--config", type=Path, metavar="FILE.toml",
                   help="serve_cmd, gpus, [grid], [[link]] (zipped lists) and [[config]] tables")
    c.add_argument("--gpus", default=None,
                   help="GPUs per configuration: a number or a template such as '{tp}' (default 1; a 'gpus' "
                        "parameter wins)")
    c.add_argument("--serve-args", default="",
                   help="without --serve-cmd: more `slobench serve` flags for every configuration")
    c.add_argument("--simulate", action="store_true",
                   help="no server: each configuration a `slobench capacity --simulate` with its knobs")
    g = p.add_argument_group("guided by the simulator")
    g.add_argument("--simulate-first", type=int, default=None, metavar="K",
                   help="rank every configuration by simulated capacity per GPU first (`capacity --simulate "
                        "--profile PROFILE` with the parameters that are knobs of the bundled engine), measure "
                        "only the top K live; the rest are 'simulated only' rows")
    g.add_argument("--profile", default=None, metavar="PROFILE",
                   help="the cost profile --simulate-first simulates with (name or JSON path, as `slobench "
                        "capacity --simulate --profile`); without it, the bundled engine's cpu-tiny calibrated "
                        "on the fly (--calibrate)")
    g.add_argument("--calibrate", action="store_true",
                   help="measure the first configuration live first, fit the profile's host costs on its probes "
                        "(`slobench calibrate --from-runs`), then simulate every configuration with the fit")
    r = p.add_argument_group("tune")
    r.add_argument("--out", type=Path, help="tune directory (default: a new runs/tune-<time>)")
    r.add_argument("--resume", action="store_true",
                   help="keep the configurations finished in --out, run the rest (failed ones again)")
    r.add_argument("--dry-run", action="store_true", help="print each configuration's commands, start nothing")
    r.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a server may take to answer (default 600)")
    r.add_argument("--stop-grace", type=float, default=30.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL to a server's process group (default 30)")
    s = p.add_argument_group("capacity search (passed to each `slobench capacity`)")
    for flag in PASSED_FLAGS:
        s.add_argument(flag, dest="cap_" + flag[2:].replace("-", "_"), metavar=flag[2:].upper().replace("-", "_"),
                       help=argparse.SUPPRESS if flag not in ("--workload", "--slo", "--replicates", "--duration")
                       else f"as `slobench capacity {flag}`")
    s.add_argument("--capacity-args", default="", metavar="'FLAGS'",
                   help="any other `slobench capacity` flags, one string (also passed through: "
                        + " ".join(PASSED_FLAGS[4:]) + ")")


def capacity_args(args: argparse.Namespace) -> list[str]:
    passed: list[str] = []
    for flag in PASSED_FLAGS:
        value = getattr(args, "cap_" + flag[2:].replace("-", "_"))
        if value is not None:
            passed += [flag, value]
    try:
        extra = shlex.split(args.capacity_args)
    except ValueError as e:
        raise UsageError(f"--capacity-args: {e}") from None
    clash = {"--out", "--url", "--simulate", "--overwrite"} & set(extra)
    if clash:
        raise UsageError(f"--capacity-args: {sorted(clash)} are the tune's to set")
    return passed + extra



def configurations(args: argparse.Namespace) -> list[TuneConfig]:
    serve_cmd: str | None = args.serve_cmd
    gpus: str | int | None = args.gpus
    if args.config is not None:
        if args.param:
            raise UsageError("--config and --param: give the parameters in one place")
        file = read_config_file(args.config)
        serve_cmd = serve_cmd or file.serve_cmd
        gpus = gpus if gpus is not None else file.gpus
        sets: list[dict[str, Value]] = file.param_sets
    else:
        sets = cross(parse_params(args.param))
    if args.simulate and serve_cmd:
        raise UsageError("--simulate tunes the bundled engine's knobs: it takes no --serve-cmd")
    if serve_cmd is not None:
        return from_template(serve_cmd, sets, gpus)
    try:
        serve_args = shlex.split(args.serve_args)
    except ValueError as e:
        raise UsageError(f"--serve-args: {e}") from None
    return bundled_engine(sets, gpus, simulate=args.simulate, serve_args=serve_args)


def guide_of(args: argparse.Namespace, configs: list[TuneConfig]) -> Guide | None:
    """`--simulate-first K --profile PROFILE`, checked before anything starts (exit 2)."""
    if args.simulate_first is None:
        if args.profile is not None or args.calibrate:
            raise UsageError(f"{'--profile' if args.profile is not None else '--calibrate'} belongs to "
                             "--simulate-first: give --simulate-first K with it")
        return None
    if args.simulate:
        raise UsageError("--simulate-first measures the top K live: it takes no --simulate (which measures none)")
    templated = args.serve_cmd is not None or (args.config is not None and read_config_file(args.config).serve_cmd)
    if args.profile is None and templated:
        raise UsageError("--simulate-first with --serve-cmd needs --profile PROFILE: the profile to simulate with, "
                         "or with --calibrate the base whose host costs the first measured configuration fits "
                         "(the bundled engine's cpu-tiny says nothing of another server)")
    # without --profile, the bundled engine's own profile, calibrated on the first configuration measured
    guide = Guide(args.simulate_first, args.profile or DEFAULT_PROFILE, calibrate=args.calibrate or args.profile is None)
    ignored_params(configs)  # exit 2 when no parameter is a knob of the bundled engine
    return guide


def tune(args: argparse.Namespace) -> int:
    configs = configurations(args)
    passed = capacity_args(args)
    check_capacity_flags(passed, simulate=args.simulate)  # exit 2 before any server starts
    guide = guide_of(args, configs)
    if args.dry_run:
        skipped = ignored_params(configs) if guide is not None else []
        if skipped:
            print(f"the simulation passes over: {', '.join(skipped)} (no knob of the bundled engine)")
        if guide is not None and guide.calibrate:
            print(f"first {configs[0].name} measured live, then `slobench calibrate --from-runs` on its probes "
                  f"fits {guide.profile}'s host costs; the simulations below use the fit")
        for cfg in configs:
            out = Path(args.out or "OUT") / cfg.name / "capacity"
            if guide is not None:
                sim = simulation_argv(cfg, guide, out.parent / SIMULATED_DIR, passed)
                print(f"{cfg.name} simulated: {shlex.join(sim)}")
            if args.simulate:
                print(f"{cfg.name}: {shlex.join(capacity_argv(out, url=None, knob_flags=list(cfg.argv), passed=passed))}")
            else:
                print(f"{cfg.name} ({cfg.gpus} GPU{'s' if cfg.gpus > 1 else ''}): {shlex.join(cfg.command())}")
                print(f"  then: {shlex.join(capacity_argv(out, url='http://127.0.0.1:{port}/v1', knob_flags=[], passed=passed))}")
        return 0
    out_dir = args.out if args.out is not None else default_out("tune")
    plan = TunePlan(out_dir, args.simulate, passed, args.ready_timeout, args.stop_grace, args.resume, guide)
    code = run_tune(configs, plan)
    print(f"result: {out_dir / 'tune.json'}", file=sys.stderr)
    return code
