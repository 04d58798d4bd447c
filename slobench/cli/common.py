"""What the verbs share: the load flags, the typed options made from them, and small helpers with public
names."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reference_engine.serve_args import add_engine_spec_arguments, engine_spec_from_args
from slobench.errors import UsageError
from slobench.experiments.sweep import run_sweep
from slobench.load_setup import MIN_PROBE_S, LoadOptions, LoadSetup
from slobench.report import build_report
from slobench.report.terminal import make_console, print_headline, print_sweep_errors, run_title, sweep_table
from slobench.run.outdir import check_out_file, claim_out_dir, new_out_dir
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_METRICS_BODY_BYTES, parse_size


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
    group.add_argument("--no-spread", action="store_true",
                       help="keep coarse timestamps as they are: every request of a stamp at once (by default a "
                       "trace stamped in buckets, e.g. Mooncake's, has each request spread over its bucket)")
    group.add_argument("--keep-zero-rows", action="store_true",
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
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    g.add_argument("--header", action="append", default=[], metavar="K:V", help="extra HTTP header (repeatable)")
    g.add_argument("--extra-body", default=None, metavar="JSON", help="extra JSON fields merged into every body")
    g.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT = E2E)")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    g.add_argument("--transport", choices=("raw", "httpx"), default="raw",
                   help="HTTP client for the load: raw (default; slobench's own HTTP/1.1 client, the cheapest per request) "
                        "or httpx (HTTP/2 with --http2)")
    g.add_argument("--http2", action="store_true", help="HTTP/2 (implies --transport httpx)")
    g.add_argument("--max-body", type=size_arg, default=DEFAULT_MAX_BODY_BYTES, metavar="SIZE",
                   help="the most a server may send in one response body (an error, a whole answer, /models), "
                        "one SSE line or event, decompressed; more is a recorded error (default 64MiB)")
    g.add_argument("--max-metrics-body", type=size_arg, default=DEFAULT_MAX_METRICS_BODY_BYTES, metavar="SIZE",
                   help="the most one /metrics page may hold, decompressed; a larger one is a failed scrape "
                        "(default 16MiB)")
    g.add_argument("--server-profile", default="auto",
                   choices=("auto", "vllm", "sglang", "tgi", "llamacpp", "ollama", "openai", "generic"),
                   help="what the server accepts of slobench's extensions (token-id prompts, ignore_eos, min_tokens, "
                        "stream_options.include_usage); auto (default) probes each once before the run and falls "
                        "back where refused; a named profile fixes the choice without probing")
    g.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a local tokenizer.json (or HF tokenizer folder) of the served model: text prompts get "
                        "exactly the asked token count (never fetched from a hub)")
    g.add_argument("--client-workers", type=int, default=1, metavar="N",
                   help="send from N worker processes (the schedule stays in this one): for streams of more than "
                        "~20,000 tokens/s, which one process cannot read on time (default 1)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="send from --client-workers N Ray actors (spread over the cluster's nodes, clocks synced to "
                        "this one) at ADDRESS, or a local Ray instance when no address is given; needs "
                        "pip install 'slobench[ray]'")
    eng = p.add_argument_group("in-process engine (instead of --url)")
    add_engine_arguments(eng)
    eng.add_argument("--simulate", action="store_true",
                     help="no server, no real time: the bundled engine's scheduler and block manager on a virtual "
                          "clock with the modeled executor (--profile, --kv-blocks, ...); seconds, not minutes")
    eng.add_argument("--jitter", type=float, default=None,
                     help="with --simulate: per-step time noise, relative sd (default: a calibrated profile's "
                          "fitted noise, else 0)")
    eng.add_argument("--request-overhead", default=None, metavar="DURATION",
                     help="with --simulate: each request's fixed cost outside the steps (HTTP, parsing), added to "
                          "every time after the send, e.g. 13ms (default: a calibrated profile's fitted o, else 0)")
    eng.add_argument("--replicas", type=int, default=1, metavar="N",
                     help="with --simulate: a fleet of N identical engines behind --router (default 1)")
    eng.add_argument("--router", default="least-outstanding",
                     choices=("least-outstanding", "least-tokens", "round-robin", "prefix-affinity",
                              "prefix-balanced"),
                     help="with --simulate --replicas N, or several --url A,B: how requests are spread "
                          "(default least-outstanding)")
    eng.add_argument("--prefill-replicas", type=int, default=0, metavar="P",
                     help="with --simulate: a disaggregated fleet, P prefill instances (with --decode-replicas)")
    eng.add_argument("--decode-replicas", type=int, default=0, metavar="D",
                     help="with --simulate: D decode instances taking the KV of the prefill instances")
    eng.add_argument("--colocated-replicas", type=int, default=0, metavar="C",
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
        w.add_argument("--rates", required=False, default=None, help="1,2,4 or geometric START:STOP:COUNT")
        w.add_argument("--refine-knee", type=int, default=0, metavar="N",
                       help="after the rates, N more, each halving the gap (geometrically) between the two "
                            "measured rates that bracket the SLO's crossing (default 0)")
    w.add_argument("--rate", type=float, default=None, help="offered rate, req/s (default: the workload's)")
    w.add_argument("--num-requests", type=int, default=None)
    w.add_argument("--duration", type=float, default=None, help="seconds of arrivals")
    w.add_argument("--input-len", type=int, default=None, help="fixed prompt length, overriding the workload")
    w.add_argument("--output-len", type=int, default=None, help="fixed output length, overriding the workload")
    w.add_argument("--seed", type=int, default=0)
    t = p.add_argument_group("trace replay (instead of --workload)")
    t.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a trace: one request per row at its time, with its token counts")
    t.add_argument("--trace-format", default=None,
                   choices=("azure", "burstgpt", "mooncake", "sharegpt", "slobench"),
                   help="default: detected from the content")
    t.add_argument("--time-scale", type=float, default=None, metavar="K",
                   help="multiply the trace's times by K (0.5 = twice as fast); --rate instead rescales "
                   "to a mean rate, keeping the burst shape")
    t.add_argument("--start", type=float, default=0.0, metavar="S",
                   help="skip the trace's first S seconds (trace time); --duration then keeps the first "
                   "seconds of the scaled replay")
    add_replay_flags(t)
    r = p.add_argument_group("run")
    r.add_argument("--slo", default=None, help="e.g. ttft=500ms,tpot=50ms[,target=0.9] or a TOML file")
    r.add_argument("--out", default=None, help="run directory (default: a new runs/<verb>-<time>)")
    r.add_argument("--overwrite", "--force", action="store_true",
                   help="replace the run already in --out (only slobench's files; never a folder holding other runs); "
                        "without it, exit 2")
    r.add_argument("--warmup", default="0", metavar="N|auto",
                   help="requests sent first and excluded from metrics; auto: cut by the MSER-5 rule after the run")
    r.add_argument("--max-in-flight", type=int, default=None, help="cap on requests in flight (waits counted)")
    r.add_argument("--concurrency", type=int, default=None, help="closed loop: N users instead of open-loop")
    r.add_argument("--rate-limit", default=None, metavar="N/PERIOD",
                   help="at most N sends per period (600/min, 10/s, 36000/h), for hosted endpoints with a rate "
                        "limit; its waits are reported as deliberate, not as client lateness")
    r.add_argument("--max-error-rate", default=None, metavar="FRACTION",
                   help="exit 1 when more than this share of requests failed (e.g. 0.05 or 5%%); by default only "
                        "a run in which no request succeeded does")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--scrape-interval", type=float, default=1.0,
                   help="seconds between scrapes of the server's /metrics (0: off)")
    r.add_argument("--report", default=None, metavar="HTML", help="also write the HTML report here")


def size_arg(text: str) -> int:
    """An argparse type: `64MiB`, `512k`, `1048576` -> bytes; anything else, a usage error naming it."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
# What one run may ask for: past these the schedule or the prompts would not fit in memory (a typo such as
# --num-requests 1e12, or --duration 1e300) and the run would end in a MemoryError, not an answer.
MAX_NUM_REQUESTS = 10_000_000
MAX_TOKENS = 10_000_000  # a prompt's or an output's length, tokens
MAX_DURATION_S = 7 * 86_400.0
MAX_USERS = 100_000  # --concurrency, --max-in-flight


def check_load_flags(args: argparse.Namespace) -> None:
    """What argparse's types cannot say about the load flags, checked before anything starts: each number
    in its range and finite, each URL one that can be connected to, --report a file that can be written.
    UsageError (exit 2, one line) naming the flag."""
    for flag, limit in (("num_requests", MAX_NUM_REQUESTS), ("input_len", MAX_TOKENS), ("output_len", MAX_TOKENS),
                        ("concurrency", MAX_USERS), ("max_in_flight", MAX_USERS)):
        v = getattr(args, flag, None)
        if v is not None and not 1 <= v <= limit:
            raise UsageError(f"--{flag.replace('_', '-')} {v}: must be from 1 to {limit:,}")
    duration = getattr(args, "duration", None)
    if duration is not None and not 0 < duration <= MAX_DURATION_S:
        raise UsageError(f"--duration {duration:g}: must be more than 0 and at most {MAX_DURATION_S:,.0f} s (a week)")
    rate = getattr(args, "rate", None)
    if rate is not None and not 0 < rate < math.inf:
        raise UsageError(f"--rate {rate}: must be a finite number of req/s above 0")
    if rate is not None and duration is not None and rate * duration > MAX_NUM_REQUESTS:
        raise UsageError(f"--rate {rate:g} for --duration {duration:g}: {rate * duration:,.0f} requests, more than "
                         f"{MAX_NUM_REQUESTS:,} a run")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < 2**63:
        raise UsageError(f"--seed {seed}: must be from 0 to 2**63 - 1")
    for flag in ("timeout", "time_scale", "start", "jitter"):
        v = getattr(args, flag, None)
        if v is not None and (math.isnan(v) or v < 0):
            raise UsageError(f"--{flag.replace('_', '-')} {v}: must be a number >= 0")
    url = getattr(args, "url", None)
    if url is not None and not url.strip(" ,"):
        raise UsageError(f"--url {url!r}: names no server (leave --url out for the default, or give http://HOST:PORT/v1)")
    if url:
        check_urls(url)
    if getattr(args, "report", None):
        check_out_file(Path(args.report), "--report")


def check_urls(text: str) -> None:
    """`--url A[,B...]`: each an http(s) URL with a host and a port that exists (urllib would otherwise fail
    inside the client, after the run directory was made)."""
    for url in (u.strip() for u in text.split(",")):
        if not url:
            continue
        if any(c.isspace() or not c.isprintable() for c in url):
            raise UsageError(f"--url {url!r}: a URL holds no spaces or control characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:  # a port out of 0-65535 or not a number, a bad IPv6 literal
            raise UsageError(f"--url {url}: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url {url}: expected http://HOST[:PORT]/v1 or https://HOST[:PORT]/v1")
        if port == 0:
            raise UsageError(f"--url {url}: port 0 cannot be connected to")


def options_from_args(args: argparse.Namespace) -> LoadOptions:
    """The load flags of a parsed command line as the typed `LoadOptions` that `LoadSetup` takes: the one
    place they are read. The engine's shape flags become its knobs, modeled under --simulate."""
    check_load_flags(args)
    values = {f.name: getattr(args, f.name) for f in fields(LoadOptions) if hasattr(args, f.name)}
    engine = "modeled" if args.simulate else args.engine
    knobs = engine_knobs_from_args(argparse.Namespace(**{**vars(args), "engine": engine})) if engine else None
    return LoadOptions(**{**values, "header": tuple(args.header), "engine_knobs": knobs})


def load_options(**values: Any) -> LoadOptions:
    """The load flags' defaults (those of `sweep`), with `values` in place of some: the options of a verb
    that sends load without taking the load flags itself (`demo`). A name that is no load flag is a bug."""
    p = argparse.ArgumentParser(add_help=False)
    add_load_flags(p, sweep=True)
    ns = p.parse_args([])  # nothing given: every flag at its default
    for name, value in values.items():
        if not hasattr(ns, name):
            raise TypeError(f"load_options: no load flag {name!r}")
        setattr(ns, name, value)
    ns.verb = "sweep"
    return options_from_args(ns)


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


async def sweep_rates(setup: LoadSetup, rates: Sequence[float], out: Path, *, seed: int) -> int:
    """One run per rate through `setup`'s probe, a line per point and the table at the end; the exit code
    (130 interrupted, 1 over --max-error-rate). `out` is claimed here, before any request (exit 2)."""
    refine = check_refine_knee(setup.options.refine_knee, has_slo=setup.slo is not None)
    setup.min_duration_s = MIN_PROBE_S  # high-rate points as long as low-rate ones (probe_duration)
    out = claim_out_dir(out, overwrite=setup.options.overwrite)  # exit 2, one line
    console = make_console()

    def on_run(row: dict[str, Any]) -> None:
        s = row["summary"]
        console.print(f"rate {row['rate_rps']:g} req/s done: {s.num_ok}/{s.num_requests} ok")

    async with setup.probe(first=(rates[0], seed)) as (probe, manifest, served):
        doc = await run_sweep(list(rates), probe, out_dir=out, slo=setup.slo, manifest=manifest, seed=seed,
                              on_run=on_run, refine_knee=refine)
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
    records them, with a disaggregated fleet's (slobench.fleet.disagg) when its flags are given."""
    spec = engine_spec_from_args(args, in_process=True)
    every = spec.to_knobs()
    knobs = {k: every[k] for k in _MANIFEST_KNOBS}
    if spec.scheduler != "chunked":  # recorded only when not the default, so default manifests stay as they are
        knobs["scheduler"] = spec.scheduler
    if getattr(args, "prefill_replicas", 0) or getattr(args, "decode_replicas", 0):  # slobench.fleet.disagg's knobs
        knobs.update(prefill_replicas=args.prefill_replicas, decode_replicas=args.decode_replicas,
                     colocated_replicas=getattr(args, "colocated_replicas", 0) or 0,
                     kv_link=getattr(args, "kv_link", None) or "inf,0")
        for k in ("decode_profile", "decode_kv_blocks"):  # only when given: other fleets' knobs stay as they are
            if getattr(args, k, None) is not None:
                knobs[k] = getattr(args, k)
    if spec.executor == "torch" and args.engine_device is not None:
        knobs["device"] = spec.device
    return knobs
