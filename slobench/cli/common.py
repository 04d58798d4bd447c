"""What the verbs share: the load flags, the typed options made from them, and small helpers with public
names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reference_engine.serve_args import add_engine_spec_arguments, engine_spec_from_args
from slobench.analysis.summary import RunSummary
from slobench.errors import UsageError
from slobench.experiments.auto_rates import (
    SERVICE_RATE_RPS,
    SERVICE_REQUESTS,
    Interrupted,
    RunSize,
    plan_text,
    plan_with_probe,
    probe_text,
    sized_probe,
)
from slobench.experiments.sweep import parse_rates, run_sweep
from slobench.load_options import FLAG_NAMES, LoadOptions
from slobench.load_setup import MIN_PROBE_S, LoadSetup, probe_duration
from slobench.report import build_report
from slobench.report.sweep_progress import SweepProgress, planned_s
from slobench.report.terminal import make_console, print_headline, print_sweep_errors, run_title, sweep_table
from slobench.run.early_stop import StoppedEarly
from slobench.run.outdir import claim_out_dir, new_out_dir
from slobench.targets.bounds import parse_size


def default_out(prefix: str) -> Path:
    """`runs/<prefix>-<time>`, created now and this run's alone (`new_out_dir`); wrap what follows in
    `removed_if_unused` so a run that fails to start leaves no empty folder."""
    return new_out_dir(prefix)


def maybe_report(html: str | None, run_dirs: Sequence[Path]) -> None:
    """`--report HTML`: also write the HTML report of these run directories."""
    if html:
        path = build_report([str(d) for d in run_dirs], html)
        print(f"report: {path}")


def add_row_flags(group: Any) -> None:
    """What a trace loader keeps: shared by `run`/`sweep`/`capacity --trace` and the workload verbs."""
    group.add_argument("--no-spread", action="store_true", default=None,
                       help="keep coarse timestamps as they are: every request of a stamp at once (by default a "
                       "trace stamped in buckets, e.g. Mooncake's, has each request spread over its bucket)")
    group.add_argument("--keep-zero-rows", action="store_true", default=None,
                       help="keep rows with 0 output tokens (BurstGPT's failed requests) as max_tokens=1 requests "
                       "and rows with 0 input tokens with a 1-token prompt, instead of leaving them out")


def add_replay_flags(group: Any) -> None:
    """The trace flags of the load verbs beyond --trace, --trace-format, --time-scale and --start."""
    add_row_flags(group)
    group.add_argument("--min-tokens", choices=("max", "none"), default=None,
                       help="max (default): send min_tokens = max_tokens so each output is as long as the trace "
                       "says even where ignore_eos is not honoured; none: leave min_tokens out")



def add_load_flags(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    """The flags of every verb that sends load (run, sweep, capacity): target, engine, workload, trace, run."""
    g = p.add_argument_group("target")
    g.add_argument("--url", default=None,
                   help="base URL of an OpenAI-compatible API (default http://127.0.0.1:8000/v1); several, "
                        "comma-separated, are routed by this client (--router)")
    g.add_argument("--model", default=None, help="model name (default: the first one the server lists)")
    g.add_argument("--api", choices=("completions", "chat", "responses"), default=None, help="default: the workload's")
    g.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    g.add_argument("--header", action="append", default=None, metavar="K:V", help="extra HTTP header (repeatable)")
    g.add_argument("--extra-body", default=None, metavar="JSON", help="extra JSON fields added to every body; one that slobench sets (model, stream, "
                   "prompt/messages, max_tokens, min_tokens, ignore_eos) is refused, temperature is replaced and recorded")
    g.add_argument("--no-stream", action="store_true", default=None, help="non-streaming requests (TTFT = E2E)")
    g.add_argument("--timeout", type=float, default=None, help="per-request timeout, seconds")
    g.add_argument("--transport", choices=("raw", "httpx"), default=None,
                   help="HTTP client for the load: raw (default; slobench's own HTTP/1.1 client, the cheapest per request) "
                        "or httpx (HTTP/2 with --http2)")
    g.add_argument("--http2", action="store_true", default=None, help="HTTP/2 (implies --transport httpx)")
    g.add_argument("--max-body", type=size_arg, default=None, metavar="SIZE",
                   help="the most a server may send in one response body (an error, a whole answer, /models), "
                        "one SSE line or event, decompressed; more is a recorded error (default 64MiB)")
    g.add_argument("--max-metrics-body", type=size_arg, default=None, metavar="SIZE",
                   help="the most one /metrics page may hold, decompressed; a larger one is a failed scrape "
                        "(default 16MiB)")
    g.add_argument("--server-profile", default=None,
                   choices=("auto", "vllm", "sglang", "tgi", "llamacpp", "ollama", "openai", "generic"),
                   help="what the server accepts of slobench's extensions (token-id prompts, ignore_eos, min_tokens, "
                        "stream_options.include_usage); auto (default) probes each once before the run and falls "
                        "back where refused; a named profile fixes the choice without probing")
    g.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a local tokenizer.json (or HF tokenizer folder) of the served model: text prompts get "
                        "exactly the asked token count (never fetched from a hub)")
    g.add_argument("--client-workers", type=int, default=None, metavar="N",
                   help="send from N worker processes (the schedule stays in this one): for streams of more than "
                        "~20,000 tokens/s, which one process cannot read on time (default 1)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="send from --client-workers N Ray actors (spread over the cluster's nodes, clocks synced to "
                        "this one) at ADDRESS, or a local Ray instance when no address is given; needs "
                        "pip install 'slobench[ray]'")
    eng = p.add_argument_group("in-process engine (instead of --url)")
    add_engine_arguments(eng)
    eng.add_argument("--simulate", action="store_true", default=None,
                     help="no server, no real time: the bundled engine's scheduler and block manager on a virtual "
                          "clock with the modeled executor (--profile, --kv-blocks, ...); seconds, not minutes")
    eng.add_argument("--jitter", type=float, default=None,
                     help="with --simulate: per-step time noise, relative sd (default: a calibrated profile's "
                          "fitted noise, else 0)")
    eng.add_argument("--request-overhead", default=None, metavar="DURATION",
                     help="with --simulate: each request's fixed cost outside the steps (HTTP, parsing), added to "
                          "every time after the send, e.g. 13ms (default: a calibrated profile's fitted o, else 0)")
    eng.add_argument("--replicas", type=int, default=None, metavar="N",
                     help="with --simulate: a fleet of N identical engines behind --router (default 1)")
    eng.add_argument("--router", default=None,
                     choices=("least-outstanding", "least-tokens", "round-robin", "prefix-affinity",
                              "prefix-balanced"),
                     help="with --simulate --replicas N, or several --url A,B: how requests are spread "
                          "(default least-outstanding)")
    eng.add_argument("--prefill-replicas", type=int, default=None, metavar="P",
                     help="with --simulate: a disaggregated fleet, P prefill instances (with --decode-replicas)")
    eng.add_argument("--decode-replicas", type=int, default=None, metavar="D",
                     help="with --simulate: D decode instances taking the KV of the prefill instances")
    eng.add_argument("--colocated-replicas", type=int, default=None, metavar="C",
                     help="with --prefill/--decode-replicas: C co-located instances beside them (default 0)")
    eng.add_argument("--decode-profile", default=None, metavar="PROFILE",
                     help="with --prefill/--decode-replicas: the decode instances' cost profile (another TP degree, "
                          "say; default --profile)")
    eng.add_argument("--decode-kv-blocks", type=int, default=None, metavar="N",
                     help="with --prefill/--decode-replicas: the decode instances' KV blocks (default --kv-blocks)")
    eng.add_argument("--kv-link", default=None, metavar="BW,LAT",
                     help="with --prefill/--decode-replicas: each prefill instance's KV link, e.g. 50GB/s,20us "
                          "(default inf,0); bytes per token from the --model config (2*layers*kv_heads*head_dim*2)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default=None, help="a bundled workload name or a TOML path (default chat)")
    if sweep:
        w.add_argument("--rates", required=False, default=None,
                       help="1,2,4, geometric START:STOP:COUNT, or auto (chosen around the SLO's crossing; needs --slo)")
        w.add_argument("--refine-knee", type=int, default=None, metavar="N",
                       help="after the rates, N more, each halving the gap (geometrically) between the two "
                            "measured rates that bracket the SLO's crossing (default 0)")
    w.add_argument("--rate", type=float, default=None, help="offered rate, req/s (default: the workload's)")
    w.add_argument("--num-requests", type=int, default=None)
    w.add_argument("--duration", type=float, default=None, help="seconds of arrivals")
    w.add_argument("--input-len", type=int, default=None, help="fixed prompt length, overriding the workload")
    w.add_argument("--output-len", type=int, default=None, help="fixed output length, overriding the workload")
    w.add_argument("--seed", type=int, default=None)
    w.add_argument("--session-mode", choices=("wait", "scheduled"), default=None,
                   help="a session workload's (or a trace's sessions') turns: sent when the previous answer "
                        "ended plus the think time, a trace's gap between the turns (wait, the default), or at the "
                        "precomputed estimate, a trace's times (scheduled)")
    t = p.add_argument_group("trace replay (instead of --workload)")
    t.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a trace: one request per row at its time, with its token counts")
    t.add_argument("--trace-format", default=None,
                   choices=("azure", "burstgpt", "mooncake", "sharegpt", "slobench"),
                   help="default: detected from the content")
    t.add_argument("--time-scale", type=float, default=None, metavar="K",
                   help="multiply the trace's times by K (0.5 = twice as fast); --rate instead rescales "
                   "to a mean rate, keeping the burst shape")
    t.add_argument("--start", type=float, default=None, metavar="S",
                   help="skip the trace's first S seconds (trace time); --duration then keeps the first "
                   "seconds of the scaled replay")
    add_replay_flags(t)
    r = p.add_argument_group("run")
    r.add_argument("--slo", default=None, help="e.g. ttft=500ms,tpot=50ms[,target=0.9] or a TOML file")
    r.add_argument("--out", default=None, help="run directory (default: a new runs/<verb>-<time>)")
    r.add_argument("--overwrite", "--force", action="store_true", default=None,
                   help="replace the run already in --out (only slobench's files; never a folder holding other runs); "
                        "without it, exit 2")
    r.add_argument("--warmup", default=None, metavar="N|auto",
                   help="requests sent first and excluded from metrics; auto: cut by the MSER-5 rule after the run")
    r.add_argument("--max-in-flight", type=int, default=None, help="cap on requests in flight (waits counted)")
    r.add_argument("--concurrency", type=int, default=None, help="closed loop: N users instead of open-loop")
    r.add_argument("--rate-limit", default=None, metavar="N/PERIOD",
                   help="at most N sends per period (600/min, 10/s, 36000/h), for hosted endpoints with a rate "
                        "limit; its waits are reported as deliberate, not as client lateness")
    r.add_argument("--max-error-rate", default=None, metavar="FRACTION",
                   help="exit 1 when more than this share of requests failed (e.g. 0.05 or 5%%); by default only "
                        "a run in which no request succeeded does")
    r.add_argument("--no-progress", action="store_true", default=None)
    r.add_argument("--no-early-stop", action="store_true", default=None,
                   help="sweep and capacity: measure every probe to its end; by default a probe stops as soon as "
                        "more requests are known to miss the SLO than its target allows (its verdict is then "
                        "decided: a fail)")
    r.add_argument("--scrape-interval", type=float, default=None,
                   help="seconds between scrapes of the server's /metrics (0: off)")
    r.add_argument("--report", default=None, metavar="HTML", help="also write the HTML report here")


def size_arg(text: str) -> int:
    """An argparse type: `64MiB`, `512k`, `1048576` -> bytes; anything else, a usage error naming it."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def options_from_args(args: argparse.Namespace) -> LoadOptions:
    """The load flags of a parsed command line as the typed `LoadOptions` that `LoadSetup` takes: the one
    place they are read. A flag not given is None here (argparse holds no defaults) and takes its option
    group's default; the engine's shape flags become its knobs, modeled under --simulate."""
    values = {name: getattr(args, name) for name in FLAG_NAMES if getattr(args, name, None) is not None}
    engine = "modeled" if args.simulate else args.engine
    knobs = engine_knobs_from_args(argparse.Namespace(**{**vars(args), "engine": engine})) if engine else None
    return LoadOptions.make(args.verb, **values, engine_knobs=knobs)


def load_options(**values: Any) -> LoadOptions:
    """The options of a verb that sends load without taking the load flags itself (`demo`, `profile`'s
    refinement): the groups' defaults, with `values` in place of some, as a sweep's, each run measured to its
    end (a profile is fitted from every request)."""
    return LoadOptions.make("sweep", **{"no_early_stop": True, **values})


def error_rate_verdict(n: int, ok: int, max_error_rate: float | None) -> str | None:
    """The one line that fails a run of `n` measured requests, `ok` of them successful, for its errors, or
    None. Without --max-error-rate only a run in which no request succeeded fails: its latency figures
    describe nothing."""
    if n == 0:
        return None
    failed = n - ok
    if max_error_rate is None:
        if ok == 0:
            return f"slobench: all {n} requests failed (see the errors above); exit 1"
        return None
    if failed / n > max_error_rate:
        return (f"slobench: {failed} of {n} requests failed ({failed / n:.1%}), above --max-error-rate "
                f"{max_error_rate:.1%}; exit 1")
    return None


def check_refine_knee(n: int, *, has_slo: bool) -> int:
    """`--refine-knee N`, checked (exit 2 naming it): 0 or more, and only with an SLO to bracket."""
    if n < 0:
        raise UsageError(f"--refine-knee {n}: expected 0 or more extra rates")
    if n and not has_slo:
        raise UsageError("--refine-knee narrows the SLO's crossing: give --slo too")
    return n


def parse_sweep_rates(text: str) -> list[float] | None:
    """`--rates`: a list or geometric range (`parse_rates`), or `auto` (None: chosen from the server)."""
    return None if text.strip().lower() == "auto" else parse_rates(text)


def check_auto(setup: LoadSetup) -> None:
    """`--rates auto` sizes and places every point itself, from an SLO: exit 2 for what it cannot honour."""
    o = setup.options
    if setup.slo is None:
        raise UsageError("--rates auto looks for the SLO's crossing: give --slo too")
    for flag, value in (("--num-requests", o.num_requests), ("--duration", o.duration), ("--trace", o.trace),
                        ("--concurrency", o.concurrency)):
        if value is not None:
            raise UsageError(f"--rates auto sizes each point from the server's service time (open loop, a "
                             f"workload): drop {flag}, or give the rates")


def set_size(setup: LoadSetup, size: RunSize) -> None:
    """The next runs' size: the probe makes its requests from `setup.options` when it runs."""
    setup.options = setup.options.with_values(num_requests=size.num_requests, duration=size.duration_s)


async def sweep_rates(setup: LoadSetup, rates: Sequence[float] | None, out: Path, *, seed: int) -> int:
    """One run per rate through `setup`'s probe (rates None: `--rates auto`, slobench.experiments.auto_rates),
    a progress line while it goes, a line per point and the table at the end; the exit code (130
    interrupted, 1 over --max-error-rate). `out` is claimed here, before any request (exit 2)."""
    refine = check_refine_knee(setup.options.refine_knee, has_slo=setup.slo is not None)
    if rates is None:
        check_auto(setup)
        set_size(setup, RunSize(num_requests=SERVICE_REQUESTS))
    else:
        setup.min_duration_s = MIN_PROBE_S  # high-rate points as long as low-rate ones (probe_duration)
    out = claim_out_dir(out, overwrite=setup.options.overwrite)  # exit 2, one line
    console = make_console()
    show = SweepProgress(not setup.options.no_progress)
    if show.enabled:  # one live display at a time: the sweep's line stands for each run's own
        setup.options = setup.options.with_values(no_progress=True)

    def on_run(row: dict[str, Any]) -> None:
        show.done()
        s = row["summary"]
        console.print(f"rate {row['rate_rps']:g} req/s done: {s.num_ok}/{s.num_requests} ok")
        if s.stopped_early is not None:
            console.print(f"  {StoppedEarly.from_dict(s.stopped_early).text()}", markup=False, highlight=False)

    def on_probe(rate: float, size: RunSize) -> None:
        show.add(planned := planned_s(rate, size.num_requests, size.duration_s))
        show.start(f"bracket {rate:g} req/s", planned)

    def on_measured(rate: float, s: RunSummary, is_service: bool) -> None:
        show.done()
        console.print(probe_text(rate, s, is_service), highlight=False)

    def resize(size: RunSize) -> None:
        set_size(setup, size)

    try:
        async with show, setup.probe(first=(rates[0] if rates else SERVICE_RATE_RPS, seed)) as (probe, manifest, served):
            extra: dict[str, Any] | None = None
            if rates is None:
                plan = await plan_with_probe(probe, target=setup.slo.target, seed=seed, out=out,  # type: ignore[union-attr]
                                             manifest=manifest, resize=resize, on_probe=on_probe,
                                             on_measured=on_measured)
                console.print(plan_text(plan), highlight=False)
                rates, extra = plan.rates_rps, {"auto_rates": plan.to_dict()}
                probe = sized_probe(probe, resize, plan.size)
            for r in rates:
                show.add(_planned_s(setup, r))

            def on_start(rate: float, index: int, most: int) -> None:
                show.start(f"rate {rate:g} req/s ({index}/{most})", _planned_s(setup, rate))

            doc = await run_sweep(list(rates), probe, out_dir=out, slo=setup.slo, manifest=manifest, seed=seed,
                                  on_run=on_run, refine_knee=refine, on_start=on_start, doc_extra=extra)
    except Interrupted:
        print("slobench: interrupted while bracketing the crossing, before any rate of the sweep; exit 130",
              file=sys.stderr)
        return 130
    print_sweep(doc, console, title=run_title(served, f"workload {setup.workload.name}", f"{setup.api} API", str(out)))
    maybe_report(setup.options.report, [out])
    if doc.get("interrupted"):
        print("slobench: interrupted: the last point is partial and left out of the headline; exit 130",
              file=sys.stderr)
        return 130
    n = sum(r["summary"].num_requests for r in doc["runs"])
    ok = sum(r["summary"].num_ok for r in doc["runs"])
    if (verdict := error_rate_verdict(n, ok, setup.max_error_rate)) is not None:
        print(verdict, file=sys.stderr)
        return 1
    return 0


def _planned_s(setup: LoadSetup, rate: float) -> float:
    """A point's planned seconds of arrivals (the progress line's estimate): as `LoadSetup.specs` sizes it."""
    o = setup.options
    duration = probe_duration(setup.workload, o.num_requests, o.duration, rate, setup.min_duration_s)
    return planned_s(rate, o.num_requests if o.num_requests is not None else getattr(setup.workload, "num_requests", None),
                     duration)


def print_sweep(doc: dict[str, Any], console: Any, title: str) -> None:
    console.print(sweep_table(doc["runs"], title=title))
    print_sweep_errors(doc["runs"], console)
    if doc.get("headline"):
        print_headline(doc["headline"], console)


def add_engine_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Flags that select and shape the in-process engine: `--engine modeled|torch` replaces `--url`."""
    add_engine_spec_arguments(parser, in_process=True)


# what a run's manifest records of the engine (`target.knobs`), in this order
_MANIFEST_KNOBS = ("executor", "model", "profile", "kv_blocks", "block_size", "max_num_seqs", "max_batched_tokens",
                   "max_model_len", "enable_prefix_caching")


def engine_knobs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's knobs (`EngineSpec` fields) from the flags of `add_engine_arguments`, as a manifest
    records them; a disaggregated fleet's shape is the SimGroup's own (`SimGroup.fleet_knobs`)."""
    spec = engine_spec_from_args(args, in_process=True)
    every = spec.to_knobs()
    knobs = {k: every[k] for k in _MANIFEST_KNOBS}
    if spec.scheduler != "chunked":  # recorded only when not the default, so default manifests stay as they are
        knobs["scheduler"] = spec.scheduler
    if spec.executor == "torch" and args.engine_device is not None:
        knobs["device"] = spec.device
    return knobs
