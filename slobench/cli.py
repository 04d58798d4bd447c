"""The `slobench` command. Thin: parses, calls the library, prints.

Exit codes (each means one thing):
  0  ok
  1  SLO not met (run) / gate found a regression
  2  bad usage or bad input (workload file, SLO string, trace, baseline)
  3  target unreachable (preflight failed: wrong URL, server down, wrong model)
  4  gate inconclusive (more replicates needed)
  5  internal error: a slobench bug (the traceback is printed; please report it)
  130  interrupted (Ctrl-C or SIGTERM): what finished is kept and summarised
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slobench import __version__
from slobench.errors import EngineError, SlobenchError, UsageError
from slobench.redact import redact_argv, redact_text

if TYPE_CHECKING:
    from slobench.probe import Probe
    from slobench.summary import RunSummary

EXIT_CODES = __doc__.split("Exit codes", 1)[1].split("\n", 1)[1] if __doc__ else ""

EPILOG = "exit codes:\n" + EXIT_CODES


def _add_load_flags(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--url", default=None,
                   help="base URL of an OpenAI-compatible API (default http://127.0.0.1:8000/v1); several, "
                        "comma-separated, are routed by this client (--router)")
    g.add_argument("--model", default=None, help="model name (default: the first one the server lists)")
    g.add_argument("--api", choices=("completions", "chat"), default=None, help="default: the workload's")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    g.add_argument("--header", action="append", default=[], metavar="K:V", help="extra HTTP header (repeatable)")
    g.add_argument("--extra-body", default=None, metavar="JSON", help="extra JSON fields merged into every body")
    g.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT = E2E)")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    g.add_argument("--transport", choices=("aiohttp", "httpx", "raw"), default="aiohttp")
    g.add_argument("--http2", action="store_true", help="HTTP/2 (implies --transport httpx)")
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
    from slobench.targets.engine import add_engine_arguments

    eng = p.add_argument_group("in-process engine (instead of --url)")
    add_engine_arguments(eng)
    eng.add_argument("--simulate", action="store_true",
                     help="no server, no real time: the bundled engine's scheduler and block manager on a virtual "
                          "clock with the modeled executor (--profile, --kv-blocks, ...); seconds, not minutes")
    eng.add_argument("--jitter", type=float, default=0.0, help="with --simulate: per-step time noise, relative sd")
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
    eng.add_argument("--kv-link", default=None, metavar="BW,LAT",
                     help="with --prefill/--decode-replicas: each prefill instance's KV link, e.g. 50GB/s,20us "
                          "(default inf,0); bytes per token from the --model config (2*layers*kv_heads*head_dim*2)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default=None, help="a bundled workload name or a TOML path (default chat)")
    if sweep:
        w.add_argument("--rates", required=False, default=None, help="1,2,4 or geometric START:STOP:COUNT")
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
                   "seconds of the scaled replay")  # fmt: skip
    from slobench.workload_cli import add_replay_flags

    add_replay_flags(t)
    r = p.add_argument_group("run")
    r.add_argument("--slo", default=None, help="e.g. ttft=500ms,tpot=50ms[,target=0.9] or a TOML file")
    r.add_argument("--out", default=None, help="run directory (default: runs/<time>)")
    r.add_argument("--overwrite", "--force", action="store_true",
                   help="replace the run already in --out (only slobench's files); without it, exit 2")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slobench",
        description="SLO-aware open-loop load testing for LLM inference servers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"slobench {__version__}")
    sub = p.add_subparsers(dest="verb", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    run_p = sub.add_parser("run", help="one open-loop run at one rate", epilog=EPILOG, formatter_class=fmt)
    _add_load_flags(run_p)
    sweep_p = sub.add_parser("sweep", help="one run per offered rate, a table at the end", epilog=EPILOG, formatter_class=fmt)
    _add_load_flags(sweep_p, sweep=True)
    sum_p = sub.add_parser("summarize", help="recompute and print a run's summary", epilog=EPILOG, formatter_class=fmt)
    sum_p.add_argument("run_dir")
    sum_p.add_argument("--slo", default=None, help="re-judge against another SLO")

    for mod in _verb_modules():
        mod.add_parsers(sub, epilog=EPILOG)
    return p


# Verbs that live beside the capability they drive. Each module has `VERBS` (the names it adds),
# `add_parsers(sub, *, epilog)` and `dispatch(args) -> int`.
VERB_MODULES = ("slobench.engine_cli", "slobench.gate_cli", "slobench.history_cli", "slobench.workload_cli",
                "slobench.profile_cli", "slobench.plan_cli")


def _verb_modules() -> list[Any]:
    import importlib

    return [importlib.import_module(m) for m in VERB_MODULES]


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # outside a run (preflight, between sweep points) SIGTERM ends like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import signal
    import threading

    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt) if on_main else None
    try:
        return _dispatch(parser, args)
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        if args.verb == "run":
            return asyncio.run(_run(args))
        if args.verb == "sweep":
            return asyncio.run(_sweep(args))
        if args.verb == "summarize":
            return _summarize(args)
        for mod in _verb_modules():
            if args.verb in mod.VERBS:
                return int(mod.dispatch(args))
        parser.error(f"unknown verb {args.verb!r}")
        return 2
    except (SlobenchError, EngineError) as e:  # the engine's own errors are bad settings or files: exit 2
        from slobench.redact import redact_text

        print(f"slobench: error: {redact_text(str(e))}", file=sys.stderr)  # a URL as typed may hold a password
        return e.exit_code if isinstance(e, SlobenchError) else 2
    except KeyboardInterrupt:
        print("slobench: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, never to be read as "SLO not met" (1)
        import traceback

        traceback.print_exc()
        print(f"slobench: internal error ({type(e).__name__}: {e}); this is a slobench bug, please report it "
              "with the traceback above; exit 5", file=sys.stderr)
        return 5


# --- helpers shared by the verbs that send load ---------------------------------------------------


def load_slo(text: str | None) -> Any:
    from slobench.slo import SLO

    if text is None:
        return None
    if text.endswith(".toml") or Path(text).is_file():
        return SLO.from_toml(text)
    return SLO.parse(text)


def _parse_headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for h in items:
        if ":" not in h:
            raise UsageError(f"--header: expected K:V (got {h!r})")
        k, v = h.split(":", 1)
        out[k.strip()] = v.strip()
    return out


def _parse_extra_body(text: str | None) -> dict[str, Any] | None:
    import json

    if text is None:
        return None
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--extra-body: not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise UsageError(f"--extra-body: expected a JSON object (got {text!r})")
    return v


def default_out(prefix: str) -> Path:
    import time

    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


MIN_PROBE_S = 60.0  # a sweep point or capacity probe lasts at least this long unless the user fixes its size


def probe_duration(workload: Any, num_requests: int | None, duration_s: float | None, rate_rps: float | None,
                   min_s: float | None) -> float | None:
    """The duration to generate for one rate of a sweep or capacity search. When neither --num-requests nor
    --duration is given, max(min_s, the workload's request count at that rate): past capacity the queue
    grows with run length, so points that shrink as the rate rises would overstate what the server carries
    (capacity.short_probe_note). Workloads with phases keep their own timeline."""
    if min_s is None or num_requests is not None or duration_s is not None or not rate_rps:
        return duration_s
    if getattr(workload, "phases", ()) or not hasattr(workload, "num_requests"):
        return duration_s
    return max(min_s, (workload.num_requests or 1000) / rate_rps)


DEFAULT_URL = "http://127.0.0.1:8000/v1"
MIN_RATE_RPS = 1 / 86400  # one request a day: anything slower is a typo, and would wait for ever


class LoadSetup:
    """What every load-sending verb builds from the common flags."""

    def __init__(self, args: argparse.Namespace) -> None:
        from slobench.workload import load_workload

        self.args = args
        self.min_duration_s: float | None = None  # sweeps and capacity: see probe_duration
        self.check_fleet()
        self.workload: Any
        from slobench.workload_cli import check_replay_flags, open_replay

        check_replay_flags(args)
        if getattr(args, "trace", None) is not None:  # a trace stands where a WorkloadSpec stands
            if args.input_len is not None or args.output_len is not None:
                raise UsageError("--input-len / --output-len do not apply to --trace (it has the lengths)")
            self.workload = open_replay(args, args.api or "completions",
                                        warn=lambda msg: print(f"slobench: {msg}", file=sys.stderr))  # fmt: skip
        else:
            self.workload = load_workload(args.workload or "chat")
        self.slo = load_slo(args.slo)
        self.api = args.api or self.workload.api
        self.headers = _parse_headers(args.header)
        self.extra_body = _parse_extra_body(args.extra_body)
        if args.warmup != "auto" and not str(args.warmup).isdigit():
            raise UsageError(f"--warmup: expected a number of requests or 'auto' (got {args.warmup!r})")
        if str(args.warmup).isdigit() and args.num_requests is not None and int(args.warmup) >= args.num_requests:
            raise UsageError(f"--warmup {args.warmup} leaves nothing to measure of --num-requests "
                             f"{args.num_requests}; use fewer warm-up requests or more requests")
        for flag in ("num_requests", "input_len", "output_len"):
            v = getattr(args, flag)
            if v is not None and v < 1:
                raise UsageError(f"--{flag.replace('_', '-')}: must be >= 1 (got {v})")
        if args.rate is not None and args.rate <= 0:
            raise UsageError(f"--rate: must be positive (got {args.rate})")
        if args.rate is not None and args.rate < MIN_RATE_RPS:
            raise UsageError(f"--rate {args.rate:g}: below {MIN_RATE_RPS:g} req/s, one request a day; the run "
                             "would wait for ever")
        interval = getattr(args, "scrape_interval", 0.0)
        if interval is not None and not (interval >= 0 and interval < float("inf")):
            raise UsageError(f"--scrape-interval: must be a number of seconds >= 0 (got {interval})")
        off_url = "--simulate" if getattr(args, "simulate", False) else "--engine" if getattr(args, "engine", None) else None
        if off_url and args.url is not None:
            raise UsageError(f"{off_url} runs the bundled engine here, so --url would be ignored; drop one of them")
        if getattr(args, "concurrency", None) is not None and getattr(args, "max_in_flight", None) is not None:
            raise UsageError("--concurrency (closed loop: N users) and --max-in-flight (a cap on an open loop) "
                             "exclude each other; drop one")
        self.max_error_rate = parse_error_rate(getattr(args, "max_error_rate", None))
        parse_rate_limit(getattr(args, "rate_limit", None))  # a bad value is exit 2 before any request
        if getattr(args, "tokenizer", None):
            if getattr(args, "engine", None) or getattr(args, "simulate", False):
                raise UsageError("--tokenizer applies to --url targets (the bundled engine takes token ids)")
            from slobench.workload.text import load_tokenizer

            load_tokenizer(Path(args.tokenizer))  # a missing or unreadable file is exit 2 before any request

    def specs(self, rate_rps: float | None, seed: int | None = None) -> list[Any]:
        """The requests of one run at `rate_rps` (a workload spec or a trace alike); `seed` defaults to
        --seed (capacity replicates pass their own). Every verb that sends load takes them from here."""
        from slobench.workload import generate

        a = self.args
        seed = a.seed if seed is None else seed
        if getattr(a, "trace", None) is not None:
            return self.workload.specs(  # type: ignore[no-any-return]
                rate_rps=rate_rps, duration_s=a.duration, num_requests=a.num_requests, seed=seed, api=self.api
            )
        return generate(
            self.workload,
            rate_rps=rate_rps,
            num_requests=a.num_requests,
            duration_s=probe_duration(self.workload, a.num_requests, a.duration, rate_rps, self.min_duration_s),
            seed=seed,
            input_len=a.input_len,
            output_len=a.output_len,
            api=self.api,
        )

    def target(self, clock: Any) -> Any:
        a = self.args
        workers = getattr(a, "client_workers", 1)
        if a.engine:
            from slobench.targets.engine import engine_target_from_args

            if workers != 1:
                raise UsageError("--client-workers needs --url: the in-process engine has no HTTP client to spread")
            self.engine_target = engine_target_from_args(a, clock, api=self.api)  # monitors() scrapes it
            return self.engine_target
        if len(self.urls) > 1:
            from slobench.fleet.client_routed import FleetTarget

            return FleetTarget([self._url_target(url, clock) for url in self.urls], a.router)
        return self._url_target(self.urls[0], clock)

    @property
    def urls(self) -> list[str]:
        """`--url A,B,C`: several replicas, routed by this client (slobench.fleet.client_routed)."""
        urls = [u.strip() for u in str(self.args.url or DEFAULT_URL).split(",") if u.strip()]
        if not urls:
            raise UsageError("--url: no URL given")
        return urls

    def _url_target(self, url: str, clock: Any) -> Any:
        from slobench.targets.openai import OpenAITarget

        a = self.args
        workers = getattr(a, "client_workers", 1)
        kwargs: dict[str, Any] = dict(
            base_url=url,
            model=a.model,
            api=self.api,
            stream=not a.no_stream,
            api_key_env=a.api_key_env,
            headers=self.headers,
            extra_body=self.extra_body,
            timeout_s=a.timeout,
            transport="httpx" if a.http2 else a.transport,
            http2=a.http2,
            server_profile=a.server_profile,
            tokenizer=a.tokenizer,
        )
        if getattr(a, "ray", None) is not None:
            from slobench.targets.ray_pool import RayPool

            return RayPool(workers, kwargs, clock=clock, address=a.ray)
        if workers != 1:
            from slobench.targets.workers import WorkerPool

            return WorkerPool(workers, kwargs, clock=clock)
        return OpenAITarget(**kwargs, clock=clock)

    def manifest(self, target: Any, served: str) -> dict[str, Any]:
        from slobench.workload import phase_boundaries

        a = self.args
        wl = self.workload.to_dict()
        return {
            "slobench_version": __version__,
            "command": redact_argv(sys.argv[1:]),
            "workload": wl,
            "workload_name": getattr(self.workload, "name", a.workload),
            "seed": a.seed,
            "target": (
                {**target.describe(), "served": served} if a.engine else
                {"url": redact_text(a.url or DEFAULT_URL), "model": target.model, "api": self.api, "stream": not a.no_stream, "served": served}
                | ({"capabilities": caps.to_dict()} if (caps := getattr(target, "caps", None)) is not None else {})
                | ({"tokenizer": a.tokenizer} if a.tokenizer else {})
                | ({"client_workers": a.client_workers} if getattr(a, "client_workers", 1) != 1 else {})
                | ({"ray": (target.describe().get("ray") or {})} if getattr(a, "ray", None) is not None else {})
                | ({"fleet": {"replicas": len(self.urls), "router": a.router}} if len(self.urls) > 1 else {})
            ),
            "slo": self.slo.to_dict() if self.slo else None,
            "phases": phase_boundaries(self.workload, duration_s=a.duration),
            "options": {
                "num_requests": a.num_requests, "duration_s": a.duration, "input_len": a.input_len,
                "output_len": a.output_len, "warmup": a.warmup if a.warmup == "auto" else int(a.warmup),
                "max_in_flight": a.max_in_flight,
                "concurrency": a.concurrency,
            },
        }

    def monitors(self, run_dir: Path) -> list[Any]:
        """Background tasks beside each run: the server's /metrics, scraped into server_metrics.jsonl.

        An in-process engine (after `target()`) is scraped through the same exposition, rendered locally."""
        from slobench.scrape import MetricsScraper, metrics_url_for

        interval = self.args.scrape_interval
        if not interval or interval <= 0:
            return []
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.args.engine:
            return [MetricsScraper(self.engine_target.metrics_text, run_dir, interval)]
        urls = [metrics_url_for(u) for u in self.urls]
        source: str | list[str] = urls[0] if len(urls) == 1 else urls  # a fleet: every replica, labelled
        return [MetricsScraper(source, run_dir, interval, headers=self.headers)]

    def simulated_manifest(self) -> dict[str, Any]:
        """The manifest of a --simulate run: the engine's knobs stand where a target's URL would."""
        from slobench.targets.engine import engine_knobs_from_args

        a = self.args
        if a.engine == "torch":
            raise UsageError("--simulate runs the modeled executor only; drop --engine torch")
        for flag in ("concurrency", "max_in_flight", "warmup"):
            if getattr(a, flag, None) not in (None, 0, "0"):
                raise UsageError(f"--{flag.replace('_', '-')}: not supported with --simulate (open loop, every "
                                 "request measured); drop one of them")
        a.engine = "modeled"
        target: dict[str, Any] = {"kind": "simulated", "knobs": engine_knobs_from_args(a), "jitter_sd": a.jitter}
        if a.replicas != 1:  # one replica leaves the manifest (and the gate's workload identity) as it was
            target["fleet"] = {"replicas": a.replicas, "router": a.router}
        if "prefill_replicas" in target["knobs"]:  # disaggregated (slobench.fleet.disagg)
            k = target["knobs"]
            target["fleet"] = {"replicas": k["colocated_replicas"] + k["prefill_replicas"] + k["decode_replicas"],
                               "router": a.router, "colocated": k["colocated_replicas"],
                               "prefill": k["prefill_replicas"], "decode": k["decode_replicas"], "kv_link": k["kv_link"]}
        return {
            "slobench_version": __version__, "command": redact_argv(sys.argv[1:]), "workload": self.workload.to_dict(),
            "workload_name": self.workload.name, "seed": a.seed, "slo": self.slo.to_dict() if self.slo else None,
            "target": target,
        }

    def check_fleet(self) -> None:
        a = self.args
        replicas = getattr(a, "replicas", 1)
        if replicas != 1 and not getattr(a, "simulate", False):
            raise UsageError("--replicas needs --simulate (against a real fleet, point --url at its load balancer)")
        if replicas < 1:
            raise UsageError(f"--replicas must be >= 1 (got {replicas})")
        pools = {f: getattr(a, f.replace("-", "_"), 0) or 0 for f in
                 ("prefill-replicas", "decode-replicas", "colocated-replicas")}
        if any(pools.values()) or getattr(a, "kv_link", None) is not None:
            from slobench.fleet.disagg import DisaggFleet, KVLink

            if not getattr(a, "simulate", False):
                raise UsageError("--prefill-replicas/--decode-replicas/--kv-link need --simulate")
            if not (pools["prefill-replicas"] or pools["decode-replicas"]):
                raise UsageError("--kv-link and --colocated-replicas need --prefill-replicas and --decode-replicas")
            if replicas != 1:
                raise UsageError("--replicas with --prefill/--decode-replicas: give co-located ones as "
                                 "--colocated-replicas")
            DisaggFleet(pools["prefill-replicas"], pools["decode-replicas"], pools["colocated-replicas"],
                        KVLink.parse(a.kv_link or "inf,0"))  # bad values are exit 2 here, before any run
        from slobench.targets.workers import MAX_WORKERS

        workers = getattr(a, "client_workers", 1)
        if not 1 <= workers <= MAX_WORKERS:  # before any network call: a bad flag is exit 2, not 3
            raise UsageError(f"--client-workers must be from 1 to {MAX_WORKERS} (got {workers})")
        if getattr(a, "ray", None) is not None:
            if a.engine or getattr(a, "simulate", False):
                raise UsageError("--ray needs --url: the in-process engine and --simulate send nothing over HTTP")
            if "," in str(a.url or ""):
                raise UsageError("--ray with several --url: not supported; point --url at the fleet's load balancer")
            from slobench.targets.ray_pool import require_ray

            require_ray()  # not installed: exit 2 with the pip line, before any network call

    @contextlib.asynccontextmanager
    async def probe(self, *, intervals: bool = True, scrape: bool = True,
                    first: tuple[float | None, int] | None = None) -> AsyncIterator[tuple[Probe, dict[str, Any], str]]:
        """The probe the flags name, its manifest and what it serves: the simulator (`--simulate`), else a
        started target (closed on the way out). Every verb that sends load measures through this.
        `intervals=False`: simulated summaries without bootstrap intervals; `scrape=False`: no /metrics
        scraper beside each run (both as a capacity search's probes have always been). `first`: the (rate,
        seed) measured first, whose requests are made before any connection, so a bad workload or trace is
        exit 2 before the server is touched."""
        from slobench.probe import LiveProbe, VirtualProbe

        a = self.args

        ready: dict[tuple[float | None, int], Any] = {}
        if first is not None:
            ready[first] = self.specs(first[0], seed=first[1])

        def make_specs(rate: float | None, seed: int) -> Any:
            made = ready.pop((rate, seed), None)
            return made if made is not None else self.specs(rate, seed=seed)

        if a.simulate:
            from slobench.targets.engine import engine_knobs_from_args

            manifest = self.simulated_manifest()
            yield VirtualProbe(make_specs, engine_knobs_from_args(a), slo=self.slo, api=self.api, jitter_sd=a.jitter,
                               replicas=a.replicas, router=a.router, intervals=intervals), manifest, "simulated"  # fmt: skip
            return
        from slobench.targets.ray_pool import note_client_clocks

        target, clock, served = await _start_target(self)
        try:
            async def after_run(run_dir: Path, summary: RunSummary) -> RunSummary:
                return await note_client_clocks(target, run_dir, summary, self.slo)  # Ray actors: clocks, health

            probe = LiveProbe(make_specs, target, slo=self.slo, opts=self.run_options(), clock=clock,
                              monitors_for=self.monitors if scrape else None, after_run=after_run)  # fmt: skip
            yield probe, self.manifest(target, served), served
        finally:
            await target.close()

    def run_options(self) -> Any:
        from slobench.runner import RunOptions

        a = self.args
        return RunOptions(
            max_in_flight=a.max_in_flight,
            warmup_requests=0 if a.warmup == "auto" else int(a.warmup),
            warmup_auto=a.warmup == "auto",
            duration_s=a.duration,
            closed_loop_users=a.concurrency,
            closed_loop_rate_rps=a.rate if a.concurrency else None,
            rate_limit=parse_rate_limit(getattr(a, "rate_limit", None)),
            progress=not a.no_progress,
        )


async def discover_model(url: str, headers: dict[str, str], api_key_env: str) -> str:
    """The first model the server lists at {url}/models (for when --model is not given)."""
    import os

    import httpx

    from slobench.errors import TargetUnreachable

    hdrs = dict(headers)
    if key := os.environ.get(api_key_env):
        hdrs["Authorization"] = f"Bearer {key}"
    models_url = url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            r = await client.get(models_url, headers=hdrs)
    except httpx.HTTPError as e:
        raise TargetUnreachable(f"GET {models_url}: {type(e).__name__}: {e or 'no answer'}") from None
    if r.status_code != 200:
        raise TargetUnreachable(f"GET {models_url}: HTTP {r.status_code}; pass --model NAME")
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise TargetUnreachable(f"GET {models_url}: no model listed; pass --model NAME") from None


async def _start_target(setup: LoadSetup) -> tuple[Any, Any, str]:
    from slobench.clock import Clock

    if setup.args.model is None and not setup.args.engine:
        setup.args.model = await discover_model(setup.urls[0], setup.headers, setup.args.api_key_env)
    clock = Clock()
    target = setup.target(clock)
    await target.start()
    try:
        served = redact_text(await target.preflight())  # it names the URL: the title and manifest show it
    except BaseException:
        await target.close()
        raise
    for note in negotiation_notes(target):
        print(f"slobench: {note}", file=sys.stderr)
    return target, clock, served


def negotiation_notes(target: Any) -> list[str]:
    """What preflight settled about the server (fallbacks, counted usage), once, for the terminal."""
    subs = getattr(target, "targets", None) or [target]
    notes: list[str] = []
    for t in subs:
        caps = getattr(t, "caps", None)
        for n in getattr(caps, "notes", ()):
            if n not in notes:
                notes.append(n)
    return notes


_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate_limit(text: str | None) -> tuple[int, float] | None:
    """`--rate-limit 600/min` -> (600, 60.0); None when not given."""
    if text is None:
        return None
    n, slash, period = str(text).strip().partition("/")
    seconds = _PERIODS.get(period.strip().lower()) if slash else None
    if seconds is None or not n.strip().isdigit() or int(n) < 1:
        raise UsageError(f"--rate-limit: expected N/PERIOD such as 600/min, 10/s or 36000/h (got {text!r})")
    return int(n), seconds


def parse_error_rate(text: str | None) -> float | None:
    """`--max-error-rate 0.05` or `5%` -> 0.05; None when not given."""
    if text is None:
        return None
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--max-error-rate: expected a fraction such as 0.05 or 5% (got {text!r})") from None
    if not 0 <= value < 1:
        raise UsageError(f"--max-error-rate: must be from 0 to below 1 (got {text!r})")
    return value


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


async def _run(args: argparse.Namespace) -> int:
    from slobench.outdir import claim_out_dir
    from slobench.report.terminal import print_run
    from slobench.targets.ray_pool import client_clock_lines

    setup = LoadSetup(args)
    out = claim_out_dir(Path(args.out) if args.out else default_out("run"),
                        overwrite=getattr(args, "overwrite", False))  # before any request: exit 2, one line
    async with setup.probe(first=(args.rate, args.seed)) as (probe, manifest, served):
        res = await probe(args.rate, args.seed, out, {**manifest, "rate_rps": args.rate})
    summary = res.summary
    print_run(summary, title=f"{served} · {setup.workload.name} · {out}")
    for line in client_clock_lines(summary):
        print(line)
    for m in getattr(probe, "last_monitors", ()):  # no /metrics is a note: the report has no server-state panels
        if getattr(m, "disabled_reason", None):
            print(f"note: no server metrics scraped ({m.disabled_reason}); the report has no server-state panels")
    print(f"run directory: {out}")
    _maybe_report(args, [out])
    if res.interrupted:
        print("slobench: interrupted: the summary covers the requests that finished; exit 130", file=sys.stderr)
        return 130
    att = summary.attainment
    if att and setup.slo and att.value < setup.slo.target:
        return 1
    if (verdict := error_rate_verdict(summary.num_requests, summary.num_ok, setup.max_error_rate)) is not None:
        print(verdict, file=sys.stderr)
        return 1
    return 0


async def _sweep(args: argparse.Namespace) -> int:
    from slobench.outdir import claim_out_dir
    from slobench.report.terminal import make_console
    from slobench.sweep import parse_rates, run_sweep

    if not args.rates:
        raise UsageError("--rates is required for sweep (e.g. --rates 1,2,4 or --rates 1:16:5)")
    rates = parse_rates(args.rates)
    setup = LoadSetup(args)
    setup.min_duration_s = MIN_PROBE_S  # high-rate points as long as low-rate ones (probe_duration)
    out = claim_out_dir(Path(args.out) if args.out else default_out("sweep"),
                        overwrite=getattr(args, "overwrite", False))  # before any request: exit 2, one line
    console = make_console()

    def on_run(row: dict[str, Any]) -> None:
        s = row["summary"]
        console.print(f"rate {row['rate_rps']:g} req/s done: {s.num_ok}/{s.num_requests} ok")

    async with setup.probe(first=(rates[0], args.seed)) as (probe, manifest, served):
        doc = await run_sweep(rates, probe, out_dir=out, slo=setup.slo, manifest=manifest, seed=args.seed,
                              on_run=on_run)
    print_sweep(doc, console, title=f"{served} · {setup.workload.name} · {out}")
    _maybe_report(args, [out])
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
    from slobench.report.terminal import print_headline, sweep_table

    console.print(sweep_table(doc["runs"], title=title))
    if doc.get("headline"):
        print_headline(doc["headline"], console)


def _maybe_report(args: argparse.Namespace, run_dirs: Sequence[Path]) -> None:
    if getattr(args, "report", None):
        from slobench.report import build_report

        path = build_report([str(d) for d in run_dirs], args.report)
        print(f"report: {path}")


def _summarize(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from slobench.records import load_run
    from slobench.report.terminal import print_run
    from slobench.summary import summarize

    run = load_run(args.run_dir)
    if args.slo:
        slo = load_slo(args.slo)
    elif run.manifest.get("slo"):
        from slobench.slo import SLO

        slo = SLO.from_dict(run.manifest["slo"])
    else:
        slo = None
    summary = summarize(run.records, slo, seed=run.manifest.get("seed", 0))
    if run.summary is not None:  # what the run alone knew: kept from its summary.json
        summary = replace(summary, interrupted=bool(run.summary.interrupted), trace_rows=run.summary.trace_rows,
                          stopped_by=run.summary.stopped_by)
    print_run(summary, title=str(args.run_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
