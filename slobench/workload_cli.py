"""The `slobench workload` verb: `convert` a trace to slobench JSONL, `fit` a spec to a trace, `show` a
spec or a trace (counts, rates, length quantiles, phases)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from slobench.errors import UsageError

VERBS: frozenset[str] = frozenset({"workload"})

_FORMAT_HELP = "azure, burstgpt, mooncake, sharegpt or slobench (default: detected from the content)"


def add_row_flags(group: Any) -> None:
    """What a trace loader keeps: shared by `run`/`sweep`/`capacity --trace` and the workload verbs."""
    group.add_argument("--no-spread", action="store_true",
                       help="keep coarse timestamps as they are: every request of a stamp at once (by default a "
                       "trace stamped in buckets, e.g. Mooncake's, has each request spread over its bucket)")
    group.add_argument("--keep-zero-rows", action="store_true",
                       help="keep rows with 0 output tokens (BurstGPT's failed requests) as max_tokens=1 requests "
                       "and rows with 0 input tokens with a 1-token prompt, instead of leaving them out")  # fmt: skip


def add_replay_flags(group: Any) -> None:
    """The trace flags of the load verbs beyond --trace, --trace-format, --time-scale and --start."""
    add_row_flags(group)
    group.add_argument("--min-tokens", choices=("max", "none"), default=None,
                       help="max (default): send min_tokens = max_tokens so each output is as long as the trace "
                       "says even where ignore_eos is not honoured; none: leave min_tokens out")  # fmt: skip


# flag, its dest, its default: flags that only mean something with --trace
_TRACE_ONLY = (("--trace-format", "trace_format", None), ("--time-scale", "time_scale", None),
               ("--start", "start", 0.0), ("--no-spread", "no_spread", False),
               ("--keep-zero-rows", "keep_zero_rows", False), ("--min-tokens", "min_tokens", None))  # fmt: skip


def check_replay_flags(args: argparse.Namespace) -> None:
    """A flag that would be ignored is a usage error (exit 2, one line), not a silent no-op."""
    if getattr(args, "trace", None) is None:
        given = [flag for flag, dest, default in _TRACE_ONLY if getattr(args, dest, default) != default]
        if given:
            raise UsageError(f"{given[0]} applies only to --trace")
        return
    if getattr(args, "workload", None) is not None:
        raise UsageError("--trace and --workload conflict: a trace replay sends the trace's requests; give one")
    rescaled = [f for f, on in (("--rate", getattr(args, "rate", None) is not None),
                                ("--rates", getattr(args, "rates", None) is not None),
                                ("capacity", getattr(args, "verb", None) == "capacity")) if on]  # fmt: skip
    if getattr(args, "time_scale", None) is not None and getattr(args, "concurrency", None) is not None:
        raise UsageError("--time-scale and --concurrency conflict: a closed loop sends each request when one "
                         "ends, not at the trace's times; give one")  # fmt: skip
    if getattr(args, "time_scale", None) is not None and rescaled:
        what = "a capacity search" if rescaled[0] == "capacity" else rescaled[0]
        raise UsageError(f"--time-scale and {what} conflict: a rate rescales the trace to that mean rate, "
                         "which replaces --time-scale; give one")  # fmt: skip


def open_replay(args: argparse.Namespace, api: str, warn: Any) -> Any:
    """The replay the load verbs' trace flags describe (check_replay_flags first). `run` against a target
    streams the trace (a StreamingReplay: rows read and prompts built as the run goes, so a long trace starts
    at once in flat memory; what the rows became is reported after the run, in summary.json `trace_rows`);
    `--simulate`, `sweep` and `capacity` replay one trace at several rates and load it whole (a
    TraceReplay, whose warnings come now)."""
    from slobench.workload.replay import TraceReplay
    from slobench.workload.trace_stream import StreamingReplay

    if getattr(args, "verb", None) == "run" and not getattr(args, "simulate", False):
        return StreamingReplay.open(
            args.trace, args.trace_format, time_scale=args.time_scale, start_s=args.start, api=api,
            spread=not getattr(args, "no_spread", False), keep_zero=getattr(args, "keep_zero_rows", False),
            min_tokens=getattr(args, "min_tokens", None) or "max",
        )  # fmt: skip
    return TraceReplay.open(
        args.trace, args.trace_format, seed=args.seed, time_scale=args.time_scale, start_s=args.start, api=api,
        warn=warn, spread=not getattr(args, "no_spread", False), keep_zero=getattr(args, "keep_zero_rows", False),
        min_tokens=getattr(args, "min_tokens", None) or "max",
    )  # fmt: skip


def add_parsers(sub: Any, *, epilog: str) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("workload", help="convert, fit or show workloads and traces", epilog=epilog,
                       formatter_class=fmt)  # fmt: skip
    wsub = p.add_subparsers(dest="workload_cmd", required=True)

    c = wsub.add_parser("convert", help="a trace in any known format -> slobench JSONL", epilog=epilog,
                        formatter_class=fmt)  # fmt: skip
    c.add_argument("trace")
    c.add_argument("-o", "--out", required=True, help="output .jsonl")
    c.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    c.add_argument("--seed", type=int, default=0, help="Mooncake bucket spreading / ShareGPT arrival times")
    add_row_flags(c)

    f = wsub.add_parser("fit", help="fit arrival burstiness and lengths; write a spec", epilog=epilog,
                        formatter_class=fmt)  # fmt: skip
    f.add_argument("trace")
    f.add_argument("-o", "--out", default=None, help="spec .toml to write (default: print only)")
    f.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    f.add_argument("--lengths", choices=("auto", "lognormal", "empirical"), default="auto",
                   help="length model written: auto = lognormal when it regenerates p50/p90/p99 within 10%%, "
                   "else the empirical quantile table")  # fmt: skip
    f.add_argument("--arrivals", choices=("curve", "gamma"), default="curve",
                   help="arrival model written: curve (default) = Poisson modulated by the trace's per-second "
                   "rate curve, keeping its burstiness at 1 s and 1 min; gamma = a gamma renewal process")  # fmt: skip
    f.add_argument("--seed", type=int, default=0)
    add_row_flags(f)

    s = wsub.add_parser("show", help="counts, rates and length quantiles of a spec or a trace", epilog=epilog,
                        formatter_class=fmt)  # fmt: skip
    s.add_argument("source", help="a bundled workload name, a spec .toml, or a trace file")
    s.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--rate", type=float, default=None, help="spec: generate at this rate")
    s.add_argument("--num-requests", type=int, default=None)
    s.add_argument("--duration", type=float, default=None)
    add_row_flags(s)


def dispatch(args: argparse.Namespace) -> int:
    cmd = args.workload_cmd
    if cmd == "convert":
        return _convert(args)
    if cmd == "fit":
        return _fit(args)
    return _show(args)


def _load(path: str, fmt: str | None, seed: int, args: argparse.Namespace) -> Any:
    from slobench.workload.traces import load_trace

    trace = load_trace(path, fmt, seed=seed, spread=not args.no_spread, keep_zero=args.keep_zero_rows)
    if trace.problems:
        print(f"warning: {trace.problem_summary()}", file=sys.stderr)
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    return trace


def entry_to_json(e: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"arrival_s": round(e.arrival_s, 9), "input_tokens": e.input_tokens,
                         "max_tokens": e.output_tokens}  # fmt: skip
    if e.tag:
        d["tag"] = e.tag
    if e.session_id is not None:
        d["session_id"] = e.session_id
    if e.hash_ids:
        d["hash_ids"] = list(e.hash_ids)
    if e.prompt is not None:
        d["prompt"] = e.prompt if isinstance(e.prompt, str) else list(e.prompt)
    return d


def _convert(args: argparse.Namespace) -> int:
    trace = _load(args.trace, args.trace_format, args.seed, args)
    out = Path(args.out)
    if trace.block_tokens != 512 and any(e.hash_ids for e in trace.entries):
        raise UsageError(f"{args.trace}: slobench JSONL assumes 512-token hash blocks")
    with open(out, "w") as fh:
        for e in trace.entries:
            fh.write(json.dumps(entry_to_json(e), separators=(",", ":")) + "\n")
    print(f"wrote {len(trace.entries)} requests ({trace.format} -> slobench JSONL) to {out}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from slobench.workload.fit import fit_trace

    trace = _load(args.trace, args.trace_format, args.seed, args)
    if len(trace.entries) < 3:
        raise UsageError(f"{args.trace}: fitting needs at least 3 usable requests (got {len(trace.entries)})")
    result = fit_trace(trace, choose=args.lengths, seed=args.seed, arrivals=args.arrivals)
    print(result.report())
    if args.out:
        Path(args.out).write_text(result.to_toml())
        print(f"wrote {args.out}")
    return 0


def _quantile_line(label: str, x: np.ndarray) -> str:
    q = np.quantile(x, (0.5, 0.9, 0.99))
    return (f"  {label:<7} mean {x.mean():9.1f}  p50 {q[0]:8.0f}  p90 {q[1]:8.0f}  p99 {q[2]:8.0f}  "
            f"max {x.max():8.0f}")  # fmt: skip


def _is_spec(source: str) -> bool:
    from slobench.workload import list_workloads

    return source.endswith(".toml") or (source in list_workloads() and not Path(source).is_file())


def _show(args: argparse.Namespace) -> int:
    if _is_spec(args.source):
        from slobench.workload import generate, load_workload, phase_boundaries

        spec = load_workload(args.source)
        reqs = generate(spec, rate_rps=args.rate, num_requests=args.num_requests, duration_s=args.duration,
                        seed=args.seed)  # fmt: skip
        print(f"{spec}")
        bounds = phase_boundaries(spec, duration_s=args.duration)
        if bounds:
            print("phases: " + ", ".join(f"{b['name']} @ {b['start_s']:g} s" for b in bounds))
        t = np.array([r.arrival_s for r in reqs])
        ins = np.array([r.input_tokens for r in reqs])
        outs = np.array([r.max_tokens for r in reqs])
        tags = [r.tag for r in reqs]
        sessions = {r.session_id for r in reqs if r.session_id is not None}
        extra = f", {len(sessions)} sessions" if sessions else ""
        print(f"generated (seed {args.seed}): {len(reqs)} requests{extra}")
    else:
        trace = _load(args.source, args.trace_format, args.seed, args)
        zero = (f", {trace.num_zero_dropped} with zero tokens left out" if trace.num_zero_dropped else
                f", {trace.num_zero_kept} with zero tokens raised to 1" if trace.num_zero_kept else "")  # fmt: skip
        print(f"{trace.path}: {trace.format}, {len(trace.entries)} requests from {trace.num_rows} rows "
              f"({len(trace.problems)} unreadable{zero})")  # fmt: skip
        t, ins, outs = trace.arrival_s, trace.input_tokens, trace.output_tokens
        tags = [e.tag for e in trace.entries]
    if len(t) == 0:
        raise UsageError(f"{args.source}: no requests")
    span = float(t[-1] - t[0])
    rate = (len(t) - 1) / span if span > 0 else float("nan")
    gaps = np.diff(t)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")
    print(f"  span {span:.1f} s, mean rate {rate:.3f} req/s, gap CV {cv:.2f}")
    print(_quantile_line("input", ins))
    print(_quantile_line("output", outs))
    print(f"  prefill:decode tokens {ins.sum() / max(outs.sum(), 1):.2f}")
    counts = Counter(tags)
    if len(counts) > 1:
        print("  by tag:")
        ins_by: dict[str, int] = Counter()
        outs_by: dict[str, int] = Counter()
        for tag, a, b in zip(tags, ins.tolist(), outs.tolist(), strict=True):
            ins_by[tag] += a
            outs_by[tag] += b
        for tag, n in counts.most_common(20):
            print(f"    {tag:<24} {n:7d} requests, prefill:decode {ins_by[tag] / max(outs_by[tag], 1):.2f}")
    return 0
