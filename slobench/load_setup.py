"""What every load-sending verb builds from its flags: the workload (a spec or a trace replay), the SLO, the
target (through `slobench.targets.build`), the run options, the manifest, and the probe that measures one
(rate, seed). The command line parses and prints; this decides. It reads an `argparse.Namespace` of the
load flags (`slobench.cli.common.add_load_flags`), any object with those attributes will do."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO, parse_duration_s
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError, UsageError
from slobench.experiments.probe import LiveProbe, Probe, VirtualProbe
from slobench.fleet.disagg import DisaggFleet, KVLink, split_fleet_knobs
from slobench.fleet.simulate import ModeledEngine, calibrated_extras
from slobench.redact import redact_text
from slobench.run.clock import Clock
from slobench.run.manifest import build_manifest
from slobench.run.runner import RunOptions
from slobench.run.scrape import MetricsScraper, metrics_url_for
from slobench.targets.build import DEFAULT_URL, TargetOptions, build
from slobench.targets.engine import engine_knobs_from_args
from slobench.targets.ray_pool import note_client_clocks, require_ray
from slobench.targets.workers import MAX_WORKERS
from slobench.workload import WorkloadSpec, load_workload, phase_boundaries
from slobench.workload.base import RunShape, Workload
from slobench.workload.replay import TraceReplay
from slobench.workload.text import load_tokenizer
from slobench.workload.trace_stream import StreamingReplay

MIN_RATE_RPS = 1 / 86400  # one request a day: anything slower is a typo, and would wait for ever


def load_slo(text: str | None) -> Any:
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
    if text is None:
        return None
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--extra-body: not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise UsageError(f"--extra-body: expected a JSON object (got {text!r})")
    return v


MIN_PROBE_S = 60.0  # a sweep point or capacity probe lasts at least this long unless the user fixes its size


def probe_duration(workload: Any, num_requests: int | None, duration_s: float | None, rate_rps: float | None,
                   min_s: float | None) -> float | None:
    """The duration to generate for one rate of a sweep or capacity search. When neither --num-requests nor
    --duration is given, max(min_s, the workload's request count at that rate): past capacity the queue
    grows with run length, so points that shrink as the rate rises would overstate what the server carries
    (capacity.short_probe_note). Workloads with phases keep their own timeline."""
    if min_s is None or num_requests is not None or duration_s is not None or not rate_rps:
        return duration_s
    if not isinstance(workload, WorkloadSpec) or workload.phases:  # a trace replay keeps its own timeline too
        return duration_s
    return max(min_s, (workload.num_requests or 1000) / rate_rps)


# flag, its dest, its default: flags that only mean something with --trace
_TRACE_ONLY = (("--trace-format", "trace_format", None), ("--time-scale", "time_scale", None),
               ("--start", "start", 0.0), ("--no-spread", "no_spread", False),
               ("--keep-zero-rows", "keep_zero_rows", False), ("--min-tokens", "min_tokens", None))


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
                                ("capacity", getattr(args, "verb", None) == "capacity")) if on]
    if getattr(args, "time_scale", None) is not None and getattr(args, "concurrency", None) is not None:
        raise UsageError("--time-scale and --concurrency conflict: a closed loop sends each request when one "
                         "ends, not at the trace's times; give one")
    if getattr(args, "time_scale", None) is not None and rescaled:
        what = "a capacity search" if rescaled[0] == "capacity" else rescaled[0]
        raise UsageError(f"--time-scale and {what} conflict: a rate rescales the trace to that mean rate, "
                         "which replaces --time-scale; give one")


def open_replay(args: argparse.Namespace, api: str, warn: Any) -> Any:
    """The replay the load verbs' trace flags describe (check_replay_flags first). `run` against a target
    streams the trace (a StreamingReplay: rows read and prompts built as the run goes, so a long trace starts
    at once in flat memory; what the rows became is reported after the run, in summary.json `trace_rows`);
    `--simulate`, `sweep` and `capacity` replay one trace at several rates and load it whole (a
    TraceReplay, whose warnings come now)."""
    if getattr(args, "verb", None) == "run" and not getattr(args, "simulate", False):
        return StreamingReplay.open(
            args.trace, args.trace_format, time_scale=args.time_scale, start_s=args.start, api=api,
            spread=not getattr(args, "no_spread", False), keep_zero=getattr(args, "keep_zero_rows", False),
            min_tokens=getattr(args, "min_tokens", None) or "max",
        )
    return TraceReplay.open(
        args.trace, args.trace_format, seed=args.seed, time_scale=args.time_scale, start_s=args.start, api=api,
        warn=warn, spread=not getattr(args, "no_spread", False), keep_zero=getattr(args, "keep_zero_rows", False),
        min_tokens=getattr(args, "min_tokens", None) or "max",
    )


class LoadSetup:
    """What every load-sending verb builds from the common flags."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.min_duration_s: float | None = None  # sweeps and capacity: see probe_duration
        self.check_fleet()
        self.workload: Workload
        check_replay_flags(args)
        if getattr(args, "trace", None) is not None:  # a trace stands where a WorkloadSpec stands
            if args.input_len is not None or args.output_len is not None:
                raise UsageError("--input-len / --output-len do not apply to --trace (it has the lengths)")
            self.workload = open_replay(args, args.api or "completions",
                                        warn=lambda msg: print(f"slobench: {msg}", file=sys.stderr))
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
            load_tokenizer(Path(args.tokenizer))  # a missing or unreadable file is exit 2 before any request

    def specs(self, rate_rps: float | None, seed: int | None = None) -> Any:
        """The requests of one run at `rate_rps` (a workload spec or a trace alike: `Workload.specs`); `seed`
        defaults to --seed (capacity replicates pass their own). Every verb that sends load takes them here."""
        a = self.args
        return self.workload.specs(RunShape(
            rate_rps=rate_rps,
            num_requests=a.num_requests,
            duration_s=probe_duration(self.workload, a.num_requests, a.duration, rate_rps, self.min_duration_s),
            seed=a.seed if seed is None else seed,
            input_len=a.input_len,
            output_len=a.output_len,
            api=self.api,
        ))

    @property
    def urls(self) -> list[str]:
        """`--url A,B,C`: several replicas, routed by this client (slobench.fleet.client_routed)."""
        urls = [u.strip() for u in str(self.args.url or DEFAULT_URL).split(",") if u.strip()]
        if not urls:
            raise UsageError("--url: no URL given")
        return urls

    def target_options(self) -> TargetOptions:
        """What `slobench.targets.build` needs from the flags."""
        a = self.args
        return TargetOptions(
            urls=tuple(self.urls),
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
            client_workers=getattr(a, "client_workers", 1),
            ray=getattr(a, "ray", None),
            router=a.router,
            engine_knobs=engine_knobs_from_args(a) if a.engine else None,
        )

    def target(self, clock: Any) -> Any:
        target = build(self.target_options(), clock)
        if self.args.engine:
            self.engine_target = target  # monitors() scrapes it
        return target

    def manifest(self, target: Any, served: str) -> dict[str, Any]:
        a = self.args
        return build_manifest(
            self.workload, seed=a.seed, command=sys.argv[1:],
            target=(
                {**target.describe(), "served": served} if a.engine else
                {"url": redact_text(a.url or DEFAULT_URL), "model": target.model, "api": self.api, "stream": not a.no_stream, "served": served}
                | ({"capabilities": target.caps.to_dict()} if target.caps is not None else {})
                | ({"tokenizer": a.tokenizer} if a.tokenizer else {})
                | ({"client_workers": a.client_workers} if getattr(a, "client_workers", 1) != 1 else {})
                | ({"ray": (target.describe().get("ray") or {})} if getattr(a, "ray", None) is not None else {})
                | ({"fleet": {"replicas": len(self.urls), "router": a.router}} if len(self.urls) > 1 else {})
            ),
            slo=self.slo.to_dict() if self.slo else None,
            phases=phase_boundaries(self.workload, duration_s=a.duration),
            options={
                "num_requests": a.num_requests, "duration_s": a.duration, "input_len": a.input_len,
                "output_len": a.output_len, "warmup": a.warmup if a.warmup == "auto" else int(a.warmup),
                "max_in_flight": a.max_in_flight,
                "concurrency": a.concurrency,
            },
        )

    def monitors(self, run_dir: Path) -> list[Any]:
        """Background tasks beside each run: the server's /metrics, scraped into server_metrics.jsonl.

        An in-process engine (after `target()`) is scraped through the same exposition, rendered locally."""
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
        a = self.args
        if a.engine == "torch":
            raise UsageError("--simulate runs the modeled executor only; drop --engine torch")
        for flag in ("concurrency", "max_in_flight", "warmup"):
            if getattr(a, flag, None) not in (None, 0, "0"):
                raise UsageError(f"--{flag.replace('_', '-')}: not supported with --simulate (open loop, every "
                                 "request measured); drop one of them")
        a.engine = "modeled"
        overhead_s, jitter_sd, source = self.simulated_extras()
        target: dict[str, Any] = {"kind": "simulated", "knobs": engine_knobs_from_args(a), "jitter_sd": jitter_sd}
        if overhead_s or source:  # an uncalibrated run's manifest (and the gate's workload identity) as it was
            target["request_overhead_s"] = overhead_s
            target["calibrated_extras"] = source
        if a.replicas != 1:  # one replica leaves the manifest (and the gate's workload identity) as it was
            target["fleet"] = {"replicas": a.replicas, "router": a.router}
        if "prefill_replicas" in target["knobs"]:  # disaggregated (slobench.fleet.disagg)
            k = target["knobs"]
            target["fleet"] = {"replicas": k["colocated_replicas"] + k["prefill_replicas"] + k["decode_replicas"],
                               "router": a.router, "colocated": k["colocated_replicas"],
                               "prefill": k["prefill_replicas"], "decode": k["decode_replicas"], "kv_link": k["kv_link"]}
        return build_manifest(self.workload, seed=a.seed, command=sys.argv[1:],
                              slo=self.slo.to_dict() if self.slo else None, target=target)

    def simulated_extras(self) -> tuple[float, float, str | None]:
        """A --simulate run's request overhead (s), step-time noise sd, and the profile that supplied either
        (`calibrated_flags`). Resolved once: the manifest and the probe share it."""
        cached = getattr(self, "_extras", None)
        if cached is None:
            a = self.args
            knobs, _ = split_fleet_knobs(dict(engine_knobs_from_args(a)), getattr(a, "router", "least-outstanding"))
            engine = ModeledEngine.from_knobs(knobs)
            cached = self._extras = calibrated_flags(
                getattr(a, "request_overhead", None), getattr(a, "jitter", None), engine.cost_profile,
                str(knobs.get("profile")), "--simulate", max_num_seqs=engine.max_num_seqs,
                max_num_seqs_given=getattr(a, "max_num_seqs", None) is not None)
        return cached  # type: ignore[no-any-return]

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
            if not getattr(a, "simulate", False):
                raise UsageError("--prefill-replicas/--decode-replicas/--kv-link need --simulate")
            if not (pools["prefill-replicas"] or pools["decode-replicas"]):
                raise UsageError("--kv-link and --colocated-replicas need --prefill-replicas and --decode-replicas")
            if replicas != 1:
                raise UsageError("--replicas with --prefill/--decode-replicas: give co-located ones as "
                                 "--colocated-replicas")
            DisaggFleet(pools["prefill-replicas"], pools["decode-replicas"], pools["colocated-replicas"],
                        KVLink.parse(a.kv_link or "inf,0"))  # bad values are exit 2 here, before any run
        workers = getattr(a, "client_workers", 1)
        if not 1 <= workers <= MAX_WORKERS:  # before any network call: a bad flag is exit 2, not 3
            raise UsageError(f"--client-workers must be from 1 to {MAX_WORKERS} (got {workers})")
        if getattr(a, "ray", None) is not None:
            if a.engine or getattr(a, "simulate", False):
                raise UsageError("--ray needs --url: the in-process engine and --simulate send nothing over HTTP")
            if "," in str(a.url or ""):
                raise UsageError("--ray with several --url: not supported; point --url at the fleet's load balancer")
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
        a = self.args

        ready: dict[tuple[float | None, int], Any] = {}
        if first is not None:
            ready[first] = self.specs(first[0], seed=first[1])

        def make_specs(rate: float | None, seed: int) -> Any:
            made = ready.pop((rate, seed), None)
            return made if made is not None else self.specs(rate, seed=seed)

        if a.simulate:
            manifest = self.simulated_manifest()
            overhead_s, jitter_sd, _ = self.simulated_extras()
            yield VirtualProbe(make_specs, engine_knobs_from_args(a), slo=self.slo, api=self.api, jitter_sd=jitter_sd,
                               replicas=a.replicas, router=a.router, intervals=intervals,
                               request_overhead_s=overhead_s), manifest, "simulated"
            return
        target, clock, served = await _start_target(self)
        try:
            async def after_run(run_dir: Path, summary: RunSummary) -> RunSummary:
                return await note_client_clocks(target, run_dir, summary, self.slo)  # Ray actors: clocks, health

            probe = LiveProbe(make_specs, target, slo=self.slo, opts=self.run_options(), clock=clock,
                              monitors_for=self.monitors if scrape else None, after_run=after_run)
            yield probe, self.manifest(target, served), served
        finally:
            await target.close()

    def run_options(self) -> Any:
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


async def _start_target(setup: LoadSetup) -> tuple[Any, Any, str]:
    clock = Clock()
    target = setup.target(clock)
    await target.start()
    try:  # preflight also finds the model when --model is not given
        served = redact_text(await target.preflight())  # it names the URL: the title and manifest show it
    except BaseException:
        await target.close()
        raise
    for note in target.negotiation_notes():  # what preflight settled about the server, once, for the terminal
        print(f"slobench: {note}", file=sys.stderr)
    return target, clock, served


_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_overhead_s(text: str | None) -> float | None:
    """`--request-overhead`: a duration (`13.7ms`, `0.0137s`, `0.0137`), 0 for none; None when not given."""
    if text is None:
        return None
    try:
        return parse_duration_s(text, "--request-overhead", allow_zero=True)
    except SpecError as e:
        raise UsageError(f"--request-overhead: {e.why} (got {text!r})") from None


def calibrated_flags(overhead_text: str | None, jitter_sd: float | None, profile: Any, name: str,
                     verb: str, *, max_num_seqs: int | None = None,
                     max_num_seqs_given: bool = True) -> tuple[float, float, str | None]:
    """The request overhead (s) and step-time noise sd a simulation applies (`run --simulate`, `plan`):
    `--request-overhead` and `--jitter` when given, else what a calibrated profile carries
    (`slobench.fleet.simulate.calibrated_extras`; 0 for a profile without them), said on stderr. `profile`:
    the CostProfile, or a callable giving it, loaded only when a flag is missing or `max_num_seqs` is given.
    With `max_num_seqs` (the simulation's), a warning when it batches more than the calibrated server did
    (`served_max_num_seqs` in the provenance), or, when `max_num_seqs_given` is False (the default was taken
    from that value, `served_max_num_seqs`), a note saying so. The third value is `name` when the profile supplied either,
    else None. A bad flag or provenance value is a UsageError naming it."""
    overhead_s = parse_overhead_s(overhead_text)
    if jitter_sd is not None and not (isinstance(jitter_sd, int | float) and 0 <= jitter_sd < float("inf")):
        raise UsageError(f"--jitter: must be a number >= 0 (got {jitter_sd!r})")
    if max_num_seqs is not None:
        profile = profile() if callable(profile) else profile
        served = (getattr(profile, "provenance", None) or {}).get("served_max_num_seqs")
        if isinstance(served, int) and max_num_seqs > served:
            print(f"{verb}: warning: the server calibrated into {name} decoded at most {served} request"
                  f"{'s' * (served > 1)} at a time; --max-num-seqs {max_num_seqs} simulates one that batches more "
                  f"(--max-num-seqs {served} simulates that server)", file=sys.stderr)
        elif isinstance(served, int) and max_num_seqs == served and not max_num_seqs_given:
            print(f"{verb}: --max-num-seqs {served}, from {name}: the server calibrated into it decoded at most "
                  f"{served} request{'s' * (served > 1)} at a time (--max-num-seqs N simulates another)", file=sys.stderr)
    if overhead_s is not None and jitter_sd is not None:
        return overhead_s, float(jitter_sd), None
    try:
        o_prof, j_prof = calibrated_extras(profile() if callable(profile) else profile)
    except SpecError as e:
        raise UsageError(f"--profile: {e.field}: {e.why} (got {e.value!r})") from None
    added = []
    if overhead_s is None and o_prof:
        added.append(f"a request overhead of {o_prof * 1e3:.1f} ms to every time after the send")
    if jitter_sd is None and j_prof:
        added.append(f"step-time noise sd {j_prof:.2f}")
    if added:
        print(f"{verb}: the calibrated profile {name} adds {' and '.join(added)} (--request-overhead 0 / --jitter 0 "
              "leave them out)", file=sys.stderr)
    return (o_prof if overhead_s is None else overhead_s), float(j_prof if jitter_sd is None else jitter_sd), \
        (name if added else None)


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


