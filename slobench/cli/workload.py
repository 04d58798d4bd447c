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

from slobench.cli.common import add_row_flags
from slobench.errors import UsageError
from slobench.printable import printable
from slobench.workload import generate, list_workloads, load_workload, phase_boundaries
from slobench.workload.traces import load_trace

_FORMAT_HELP = "azure, burstgpt, mooncake, sharegpt or slobench (default: detected from the content)"


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    epilog = p.epilog
    wsub = p.add_subparsers(dest="workload_cmd", required=True)

    c = wsub.add_parser("convert", help="a trace in any known format -> slobench JSONL", epilog=epilog,
                        formatter_class=fmt)
    c.add_argument("trace")
    c.add_argument("-o", "--out", required=True, help="output .jsonl")
    c.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    c.add_argument("--seed", type=int, default=0, help="Mooncake bucket spreading / ShareGPT arrival times")
    add_row_flags(c)

    f = wsub.add_parser("fit", help="fit arrival burstiness and lengths; write a spec", epilog=epilog,
                        formatter_class=fmt)
    f.add_argument("trace")
    f.add_argument("-o", "--out", default=None, help="spec .toml to write (default: print only)")
    f.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    f.add_argument("--lengths", choices=("auto", "lognormal", "empirical"), default="auto",
                   help="length model written: auto = lognormal when it regenerates p50/p90/p99 within 10%%, "
                   "else the empirical quantile table")
    f.add_argument("--arrivals", choices=("curve", "gamma"), default="curve",
                   help="arrival model written: curve (default) = Poisson modulated by the trace's per-second "
                   "rate curve, keeping its burstiness at 1 s and 1 min; gamma = a gamma renewal process")
    f.add_argument("--seed", type=int, default=0)
    add_row_flags(f)

    s = wsub.add_parser("show", help="counts, rates and length quantiles of a spec or a trace", epilog=epilog,
                        formatter_class=fmt)
    s.add_argument("source", help="a bundled workload name, a spec .toml, or a trace file")
    s.add_argument("--trace-format", default=None, help=_FORMAT_HELP)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--rate", type=float, default=None, help="spec: generate at this rate")
    s.add_argument("--num-requests", type=int, default=None)
    s.add_argument("--duration", type=float, default=None)
    add_row_flags(s)


def workload(args: argparse.Namespace) -> int:
    cmd = args.workload_cmd
    if cmd == "convert":
        return _convert(args)
    if cmd == "fit":
        return _fit(args)
    return _show(args)


def _load(path: str, fmt: str | None, seed: int, args: argparse.Namespace) -> Any:
    trace = load_trace(path, fmt, seed=seed, spread=not args.no_spread, keep_zero=bool(args.keep_zero_rows))
    if trace.problems:
        print(f"warning: {printable(trace.problem_summary())}", file=sys.stderr)  # it quotes the file's rows
    for note in trace.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    return trace


def entry_to_json(e: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"arrival_s": round(e.arrival_s, 9), "input_tokens": e.input_tokens,
                         "max_tokens": e.output_tokens}
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
            f"max {x.max():8.0f}")


def _is_spec(source: str) -> bool:
    return source.endswith(".toml") or (source in list_workloads() and not Path(source).is_file())


def _show(args: argparse.Namespace) -> int:
    if _is_spec(args.source):
        spec = load_workload(args.source)
        reqs = generate(spec, rate_rps=args.rate, num_requests=args.num_requests, duration_s=args.duration,
                        seed=args.seed)
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
                f", {trace.num_zero_kept} with zero tokens raised to 1" if trace.num_zero_kept else "")
        print(f"{trace.path}: {trace.format}, {len(trace.entries)} requests from {trace.num_rows} rows "
              f"({len(trace.problems)} unreadable{zero})")
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
