"""What every load-sending verb builds from its options: the workload (a spec or a trace replay), the SLO,
the target (through `slobench.targets.build`), the run options, the manifest, and the probe that measures
one (rate, seed). The command line turns its flags into a `LoadOptions` once (`slobench.cli.common`) and
prints; this decides."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slobench.analysis.slo import load_slo, parse_duration_s
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError, UsageError
from slobench.experiments.probe import LiveProbe, Probe, VirtualProbe
from slobench.fleet.disagg import DisaggFleet, KVLink, split_fleet_knobs
from slobench.fleet.simulate import ModeledEngine, calibrated_extras
from slobench.printable import printable
from slobench.redact import redact_text
from slobench.run.clock import Clock
from slobench.run.manifest import build_manifest
from slobench.run.records import REQUESTS
from slobench.run.runner import RunOptions
from slobench.run.scrape import MetricsScraper, metrics_url_for
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_METRICS_BODY_BYTES
from slobench.targets.build import build
from slobench.targets.capabilities import TOO_LONG, Capabilities
from slobench.targets.options import DEFAULT_URL, TargetOptions, Timeouts, TransportName
from slobench.targets.ray_pool import note_client_clocks, require_ray
from slobench.targets.workers import MAX_WORKERS
from slobench.workload import WorkloadSpec, load_workload, phase_boundaries
from slobench.workload.base import RunShape, Workload
from slobench.workload.limits import BoundedSpecs, ServerLimits
from slobench.workload.replay import TraceReplay
from slobench.workload.text import load_tokenizer
from slobench.workload.trace_stream import StreamingReplay

MIN_RATE_RPS = 1 / 86400  # one request a day: anything slower is a typo, and would wait for ever


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """The load flags (`slobench.cli.common.add_load_flags`) as one typed value, named as the flags' dests;
    the engine's shape flags arrive as `engine_knobs` (with --engine or --simulate; else None). `LoadSetup`
    checks them, naming the flag of a bad one."""

    verb: str  # run, sweep or capacity: what the options are for
    # target
    url: str | None
    model: str | None
    api: str | None
    api_key_env: str
    header: tuple[str, ...]
    extra_body: str | None
    no_stream: bool
    timeout: float
    transport: TransportName
    http2: bool
    server_profile: str
    tokenizer: str | None
    client_workers: int
    ray: str | None
    # the bundled engine in process (--engine), or simulated (--simulate)
    engine: str | None
    engine_knobs: dict[str, Any] | None
    max_num_seqs: int | None
    simulate: bool
    jitter: float | None
    request_overhead: str | None
    replicas: int
    router: str
    prefill_replicas: int
    decode_replicas: int
    colocated_replicas: int
    kv_link: str | None
    # workload
    workload: str | None
    rate: float | None
    num_requests: int | None
    duration: float | None
    input_len: int | None
    output_len: int | None
    seed: int
    # trace replay
    trace: str | None
    trace_format: str | None
    time_scale: float | None
    start: float
    no_spread: bool
    keep_zero_rows: bool
    min_tokens: str | None
    # run
    slo: str | None
    out: str | None
    overwrite: bool
    warmup: str
    max_in_flight: int | None
    concurrency: int | None
    rate_limit: str | None
    max_error_rate: str | None
    no_progress: bool
    scrape_interval: float
    report: str | None
    # sweep and capacity only
    rates: str | None = None
    refine_knee: int = 0
    # what a server may send (slobench.targets.bounds), bytes
    max_body: int = DEFAULT_MAX_BODY_BYTES
    max_metrics_body: int = DEFAULT_MAX_METRICS_BODY_BYTES

    def __post_init__(self) -> None:
        if (self.engine or self.simulate) and self.engine_knobs is None:
            raise ValueError("LoadOptions.engine_knobs: needed with engine or simulate (the engine's shape)")


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")  # visible ASCII, space and tab: what every client sends as is


def parse_headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for h in items:
        if ":" not in h:
            raise UsageError(f"--header: expected K:V (got {h!r})")
        k, v = h.split(":", 1)
        k, v = k.strip(), v.strip()
        if not _HEADER_NAME.fullmatch(k):
            raise UsageError(f"--header {k!r}: a header name is letters, digits and -_.!#$%&'*+^`|~ only")
        if not _HEADER_VALUE.fullmatch(v):
            raise UsageError(f"--header {k}: the value must be printable ASCII (no line breaks, control or "
                             f"non-ASCII characters; percent-encode them)")
        out[k] = v
    return out


def _parse_extra_body(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        v = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"--extra-body: not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise UsageError(f"--extra-body: expected a JSON object (got {text!r})")
    return v


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; a server would refuse the body")


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


def check_replay_flags(o: LoadOptions) -> None:
    """A flag that would be ignored is a usage error (exit 2, one line), not a silent no-op."""
    if o.trace is None:
        given = [flag for flag, dest, default in _TRACE_ONLY if getattr(o, dest) != default]
        if given:
            raise UsageError(f"{given[0]} applies only to --trace")
        return
    if o.workload is not None:
        raise UsageError("--trace and --workload conflict: a trace replay sends the trace's requests; give one")
    rescaled = [f for f, on in (("--rate", o.rate is not None), ("--rates", o.rates is not None),
                                ("capacity", o.verb == "capacity")) if on]
    if o.time_scale is not None and o.concurrency is not None:
        raise UsageError("--time-scale and --concurrency conflict: a closed loop sends each request when one "
                         "ends, not at the trace's times; give one")
    if o.time_scale is not None and rescaled:
        what = "a capacity search" if rescaled[0] == "capacity" else rescaled[0]
        raise UsageError(f"--time-scale and {what} conflict: a rate rescales the trace to that mean rate, "
                         "which replaces --time-scale; give one")


def open_replay(o: LoadOptions, api: str, warn: Any) -> Any:
    """The replay the load verbs' trace flags describe (check_replay_flags first). `run`, against a target or
    simulated, streams the trace (a StreamingReplay: rows read and prompts built as the run goes, so a long
    trace starts at once in flat memory and `--num-requests 200` reads little more than 200 rows; what the
    rows became is reported after the run, in summary.json `trace_rows`); `sweep` and `capacity` replay one
    trace at several rates and load it once (a TraceReplay, whose warnings come now)."""
    assert o.trace is not None
    if o.verb == "run":
        return StreamingReplay.open(
            o.trace, o.trace_format, time_scale=o.time_scale, start_s=o.start, api=api, spread=not o.no_spread,
            keep_zero=o.keep_zero_rows, min_tokens=o.min_tokens or "max",
        )
    return TraceReplay.open(
        o.trace, o.trace_format, seed=o.seed, time_scale=o.time_scale, start_s=o.start, api=api, warn=warn,
        spread=not o.no_spread, keep_zero=o.keep_zero_rows, min_tokens=o.min_tokens or "max",
    )


class LoadSetup:
    """What every load-sending verb builds from its `LoadOptions`."""

    def __init__(self, options: LoadOptions) -> None:
        self.options = o = options
        self.engine_knobs: dict[str, Any] = o.engine_knobs or {}  # empty for a URL target
        self.min_duration_s: float | None = None  # sweeps and capacity: see probe_duration
        self.said: set[str] = set()  # the refusals already explained (note_refusals): each once per command
        self.check_fleet()
        self.workload: Workload
        check_replay_flags(o)
        if o.trace is not None:  # a trace stands where a WorkloadSpec stands
            if o.input_len is not None or o.output_len is not None:
                raise UsageError("--input-len / --output-len do not apply to --trace (it has the lengths)")
            self.workload = open_replay(o, "chat" if o.api == "responses" else o.api or "completions",
                                        warn=lambda msg: print(f"slobench: {printable(msg)}", file=sys.stderr))
        else:
            self.workload = load_workload(o.workload or "chat")
        self.slo = load_slo(o.slo)
        if o.no_stream and self.slo is not None and self.slo.tpot_s is not None:  # before any request is sent
            raise UsageError("--slo tpot=... needs streaming: with --no-stream each answer arrives whole, so TPOT "
                             "cannot be measured; drop tpot from --slo or drop --no-stream")
        self.api = o.api or self.workload.api
        self.headers = parse_headers(o.header)
        self.extra_body = _parse_extra_body(o.extra_body)
        if o.warmup != "auto" and not str(o.warmup).isdigit():
            raise UsageError(f"--warmup: expected a number of requests or 'auto' (got {o.warmup!r})")
        if str(o.warmup).isdigit() and o.num_requests is not None and int(o.warmup) >= o.num_requests:
            raise UsageError(f"--warmup {o.warmup} leaves nothing to measure of --num-requests "
                             f"{o.num_requests}; use fewer warm-up requests or more requests")
        for flag in ("num_requests", "input_len", "output_len"):
            v = getattr(o, flag)
            if v is not None and v < 1:
                raise UsageError(f"--{flag.replace('_', '-')}: must be >= 1 (got {v})")
        if o.rate is not None and o.rate <= 0:
            raise UsageError(f"--rate: must be positive (got {o.rate})")
        if o.rate is not None and o.rate < MIN_RATE_RPS:
            raise UsageError(f"--rate {o.rate:g}: below {MIN_RATE_RPS:g} req/s, one request a day; the run "
                             "would wait for ever")
        interval = o.scrape_interval
        if interval is not None and not (interval >= 0 and interval < float("inf")):
            raise UsageError(f"--scrape-interval: must be a number of seconds >= 0 (got {interval})")
        off_url = "--simulate" if o.simulate else "--engine" if o.engine else None
        if off_url and o.url is not None:
            raise UsageError(f"{off_url} runs the bundled engine here, so --url would be ignored; drop one of them")
        if o.concurrency is not None and o.max_in_flight is not None:
            raise UsageError("--concurrency (closed loop: N users) and --max-in-flight (a cap on an open loop) "
                             "exclude each other; drop one")
        self.max_error_rate = parse_error_rate(o.max_error_rate)
        parse_rate_limit(o.rate_limit)  # a bad value is exit 2 before any request
        if o.tokenizer:
            if o.engine or o.simulate:
                raise UsageError("--tokenizer applies to --url targets (the bundled engine takes token ids)")
            load_tokenizer(Path(o.tokenizer))  # a missing or unreadable file is exit 2 before any request

    def specs(self, rate_rps: float | None, seed: int | None = None) -> Any:
        """The requests of one run at `rate_rps` (a workload spec or a trace alike: `Workload.specs`); `seed`
        defaults to --seed (capacity replicates pass their own). Every verb that sends load takes them here."""
        o = self.options
        shape = RunShape(
            rate_rps=rate_rps,
            num_requests=o.num_requests,
            duration_s=probe_duration(self.workload, o.num_requests, o.duration, rate_rps, self.min_duration_s),
            seed=o.seed if seed is None else seed,
            input_len=o.input_len,
            output_len=o.output_len,
            # (a Responses request's prompt is text, as a chat request's: the workload is generated so)
            api="chat" if self.api == "responses" else self.api,  # type: ignore[arg-type]  # TargetOptions checks it
        )
        if o.simulate and isinstance(self.workload, WorkloadSpec):  # the simulator takes them as they are made
            return self.workload.stream_specs(shape)
        return self.workload.specs(shape)

    @property
    def urls(self) -> list[str]:
        """`--url A,B,C`: several replicas, routed by this client (slobench.fleet.client_routed)."""
        urls = [u.strip() for u in str(self.options.url or DEFAULT_URL).split(",") if u.strip()]
        if not urls:
            raise UsageError("--url: no URL given")
        return urls

    def target_options(self) -> TargetOptions:
        """What `slobench.targets.build` needs from the flags."""
        o = self.options
        return TargetOptions(
            urls=tuple(self.urls),
            model=o.model,
            api=self.api,  # type: ignore[arg-type]  # TargetOptions checks it
            stream=not o.no_stream,
            api_key_env=o.api_key_env,
            headers=self.headers,
            extra_body=self.extra_body,
            timeouts=Timeouts(request_s=o.timeout),
            transport="httpx" if o.http2 else o.transport,
            http2=o.http2,
            server_profile=o.server_profile,
            tokenizer=o.tokenizer,
            client_workers=o.client_workers,
            ray=o.ray,
            router=o.router,
            engine_knobs=self.engine_knobs if o.engine else None,
            token_ids=getattr(self.workload, "token_ids", None),  # every workload kind has one
            max_body_bytes=o.max_body,
            max_metrics_body_bytes=o.max_metrics_body,
        )

    def target(self, clock: Any) -> Any:
        target = build(self.target_options(), clock)
        if self.options.engine:
            self.engine_target = target  # monitors() scrapes it
        return target

    def manifest(self, target: Any, served: str) -> dict[str, Any]:
        o = self.options
        return build_manifest(
            self.workload, seed=o.seed, command=sys.argv[1:],
            target=(
                {**target.describe(), "served": served} if o.engine else
                {"url": redact_text(o.url or DEFAULT_URL), "model": target.model, "api": self.api, "stream": not o.no_stream, "served": served}
                | ({"capabilities": target.caps.to_dict()} if target.caps is not None else {})
                | ({"tokenizer": o.tokenizer} if o.tokenizer else {})
                | ({"client_workers": o.client_workers} if o.client_workers != 1 else {})
                | ({"ray": (target.describe().get("ray") or {})} if o.ray is not None else {})
                | ({"fleet": {"replicas": len(self.urls), "router": o.router}} if len(self.urls) > 1 else {})
            ),
            slo=self.slo.to_dict() if self.slo else None,
            phases=phase_boundaries(self.workload, duration_s=o.duration),
            options={
                "num_requests": o.num_requests, "duration_s": o.duration, "input_len": o.input_len,
                "output_len": o.output_len, "warmup": o.warmup if o.warmup == "auto" else int(o.warmup),
                "max_in_flight": o.max_in_flight,
                "concurrency": o.concurrency,
            },
        )

    def monitors(self, run_dir: Path) -> list[Any]:
        """Background tasks beside each run: the server's /metrics, scraped into server_metrics.jsonl.

        An in-process engine (after `target()`) is scraped through the same exposition, rendered locally."""
        interval = self.options.scrape_interval
        if not interval or interval <= 0:
            return []
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.options.engine:
            return [MetricsScraper(self.engine_target.metrics_text, run_dir, interval)]
        urls = [metrics_url_for(u) for u in self.urls]
        source: str | list[str] = urls[0] if len(urls) == 1 else urls  # a fleet: every replica, labelled
        return [MetricsScraper(source, run_dir, interval, headers=self.headers,
                               max_body_bytes=self.options.max_metrics_body)]

    def simulated_manifest(self) -> dict[str, Any]:
        """The manifest of a --simulate run: the engine's knobs stand where a target's URL would."""
        o = self.options
        if o.engine == "torch":
            raise UsageError("--simulate runs the modeled executor only; drop --engine torch")
        for flag in ("concurrency", "max_in_flight", "warmup"):
            if getattr(o, flag) not in (None, 0, "0"):
                raise UsageError(f"--{flag.replace('_', '-')}: not supported with --simulate (open loop, every "
                                 "request measured); drop one of them")
        overhead_s, jitter_sd, source = self.simulated_extras()
        target: dict[str, Any] = {"kind": "simulated", "knobs": self.engine_knobs, "jitter_sd": jitter_sd}
        if overhead_s or source:  # left out uncalibrated: the manifest and the gate's workload identity stay put
            target["request_overhead_s"] = overhead_s
            target["calibrated_extras"] = source
        if o.replicas != 1:  # left out for one replica, for the same reason
            target["fleet"] = {"replicas": o.replicas, "router": o.router}
        if "prefill_replicas" in target["knobs"]:  # disaggregated (slobench.fleet.disagg)
            k = target["knobs"]
            target["fleet"] = {"replicas": k["colocated_replicas"] + k["prefill_replicas"] + k["decode_replicas"],
                               "router": o.router, "colocated": k["colocated_replicas"],
                               "prefill": k["prefill_replicas"], "decode": k["decode_replicas"], "kv_link": k["kv_link"]}
        return build_manifest(self.workload, seed=o.seed, command=sys.argv[1:],
                              slo=self.slo.to_dict() if self.slo else None, target=target)

    def simulated_extras(self) -> tuple[float, float, str | None]:
        """A --simulate run's request overhead (s), step-time noise sd, and the profile that supplied either
        (`calibrated_flags`). Resolved once: the manifest and the probe share it."""
        cached = getattr(self, "_extras", None)
        if cached is None:
            o = self.options
            knobs, _ = split_fleet_knobs(dict(self.engine_knobs), o.router)
            engine = ModeledEngine.from_knobs(knobs)
            cached = self._extras = calibrated_flags(
                o.request_overhead, o.jitter, engine.cost_profile,
                str(knobs.get("profile")), "--simulate", max_num_seqs=engine.max_num_seqs,
                max_num_seqs_given=o.max_num_seqs is not None)
        return cached  # type: ignore[no-any-return]

    def check_fleet(self) -> None:
        o = self.options
        replicas = o.replicas
        if replicas != 1 and not o.simulate:
            raise UsageError("--replicas needs --simulate (against a real fleet, point --url at its load balancer)")
        if replicas < 1:
            raise UsageError(f"--replicas must be >= 1 (got {replicas})")
        pools = {f: getattr(o, f.replace("-", "_")) or 0 for f in
                 ("prefill-replicas", "decode-replicas", "colocated-replicas")}
        if any(pools.values()) or o.kv_link is not None:
            if not o.simulate:
                raise UsageError("--prefill-replicas/--decode-replicas/--kv-link need --simulate")
            if not (pools["prefill-replicas"] or pools["decode-replicas"]):
                raise UsageError("--kv-link and --colocated-replicas need --prefill-replicas and --decode-replicas")
            if replicas != 1:
                raise UsageError("--replicas with --prefill/--decode-replicas: give co-located ones as "
                                 "--colocated-replicas")
            DisaggFleet(pools["prefill-replicas"], pools["decode-replicas"], pools["colocated-replicas"],
                        KVLink.parse(o.kv_link or "inf,0"))  # bad values are exit 2 here, before any run
        workers = o.client_workers
        if not 1 <= workers <= MAX_WORKERS:  # before any network call: a bad flag is exit 2, not 3
            raise UsageError(f"--client-workers must be from 1 to {MAX_WORKERS} (got {workers})")
        if o.ray is not None:
            if o.engine or o.simulate:
                raise UsageError("--ray needs --url: the in-process engine and --simulate send nothing over HTTP")
            if "," in str(o.url or ""):
                raise UsageError("--ray with several --url: not supported; point --url at the fleet's load balancer")
            require_ray()  # not installed: exit 2 with the pip line, before any network call

    @contextlib.asynccontextmanager
    async def probe(self, *, intervals: bool = True, scrape: bool = True,
                    first: tuple[float | None, int] | None = None) -> AsyncIterator[tuple[Probe, dict[str, Any], str]]:
        """The probe the flags name, its manifest and what it serves: the simulator (`--simulate`), else a
        started target (closed on the way out). Every verb that sends load measures through this.
        `intervals=False`: simulated summaries without bootstrap intervals; `scrape=False`: no /metrics
        scraper beside each run (both as a capacity search's probes run). `first`: the (rate,
        seed) measured first, whose requests are made before any connection, so a bad workload or trace is
        exit 2 before the server is touched."""
        o = self.options

        ready: dict[tuple[float | None, int], Any] = {}
        if first is not None:
            ready[first] = self.specs(first[0], seed=first[1])

        def make_specs(rate: float | None, seed: int) -> Any:
            made = ready.pop((rate, seed), None)
            return made if made is not None else self.specs(rate, seed=seed)

        if o.simulate:
            manifest = self.simulated_manifest()
            overhead_s, jitter_sd, _ = self.simulated_extras()
            yield VirtualProbe(make_specs, self.engine_knobs, slo=self.slo, api=self.api, jitter_sd=jitter_sd,
                               replicas=o.replicas, router=o.router, intervals=intervals,
                               request_overhead_s=overhead_s), manifest, "simulated"
            return
        target, clock, served = await _start_target(self)
        try:
            limits = server_limits(target.caps, self.api)
            bounded: list[BoundedSpecs] = []  # the last run's, while its specs are made as it goes
            noted: set[tuple[float | None, int]] = set()  # the same specs made again (a refinement) are said once

            def bounded_specs(rate: float | None, seed: int) -> Any:
                made = make_specs(rate, seed)
                if not limits.binds:
                    return made
                this = BoundedSpecs(made, limits)
                if isinstance(this.specs, list):
                    if (rate, seed) not in noted:
                        noted.add((rate, seed))
                        note_shortened(this, limits)  # all made already: said before the run
                else:
                    bounded[:] = [this]  # made as the run goes: said after it
                return this.specs

            async def after_run(run_dir: Path, summary: RunSummary) -> RunSummary:
                if bounded:
                    note_shortened(bounded.pop(), limits)
                self.note_refusals(run_dir, summary)
                return await note_client_clocks(target, run_dir, summary, self.slo)  # Ray actors: clocks, health

            probe = LiveProbe(bounded_specs, target, slo=self.slo, opts=self.run_options(), clock=clock,
                              monitors_for=self.monitors if scrape else None, after_run=after_run)
            yield probe, self.manifest(target, served), served
        finally:
            await target.close()

    def note_refusals(self, run_dir: Path, summary: RunSummary) -> None:
        """Say once what a run's refusals mean when the workload, not the server, is at fault: prompts too
        long for the server's context, or token ids out of its vocabulary, with the fix."""
        too_long = summary.error_counts.get(TOO_LONG)
        if too_long and TOO_LONG not in self.said:
            self.said.add(TOO_LONG)
            print(f"slobench: {too_long} requests refused as longer than the server's context (error kind "
                  f"{TOO_LONG!r}, counted apart from the server failing): lower --input-len / --output-len, or "
                  "serve a longer context", file=sys.stderr)
        if "vocabulary" in self.said or summary.num_ok == summary.num_requests or not (run_dir / REQUESTS).exists():
            return
        with open(run_dir / REQUESTS) as f:
            line = next((x for x in f if "of vocabulary" in x or "outside the vocabulary" in x), None)
        if line is not None:
            self.said.add("vocabulary")
            error = str(json.loads(line).get("error") or "")
            print(f"slobench: the server refused prompt token ids as outside its vocabulary ({printable(error)}): pass "
                  "--tokenizer with the model's tokenizer.json (ids are then drawn below its vocabulary), or "
                  "--server-profile generic (prompts sent as text)", file=sys.stderr)

    def run_options(self) -> Any:
        o = self.options
        return RunOptions(
            max_in_flight=o.max_in_flight,
            warmup_requests=0 if o.warmup == "auto" else int(o.warmup),
            warmup_auto=o.warmup == "auto",
            duration_s=o.duration,
            closed_loop_users=o.concurrency,
            closed_loop_rate_rps=o.rate if o.concurrency else None,
            rate_limit=parse_rate_limit(o.rate_limit),
            progress=not o.no_progress,
        )


def server_limits(caps: Capabilities | None, api: str) -> ServerLimits:
    """What preflight learnt of the server that bounds the workload (none for the bundled engine in process)."""
    if caps is None:
        return ServerLimits()
    as_text = api != "completions" or not caps.token_prompts
    return ServerLimits(id_range=None if as_text else caps.token_id_range, max_model_len=caps.max_model_len,
                        as_text=as_text, template_overhead=caps.template_overhead)


def note_shortened(bounded: BoundedSpecs, limits: ServerLimits) -> None:
    if bounded.num_shortened:
        n = bounded.num_shortened
        print(f"slobench: {n} request{'s' * (n > 1)} shortened to fit the server's max_model_len "
              f"{limits.max_model_len} (prompt + max_tokens; the prompt's end cut first, down to half of it, "
              "then the output)", file=sys.stderr)


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
        print(f"slobench: {printable(note)}", file=sys.stderr)  # it may quote the server
    return target, clock, served


_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


MAX_OVERHEAD_S = 3600.0  # a simulated request's fixed cost outside the steps
MAX_JITTER_SD = 10.0  # step-time noise, relative sd: beyond it a step's time is noise alone


def parse_overhead_s(text: str | None) -> float | None:
    """`--request-overhead`: a duration (`13.7ms`, `0.0137s`, `0.0137`), 0 for none; None when not given."""
    if text is None:
        return None
    try:
        overhead_s = parse_duration_s(text, "--request-overhead", allow_zero=True)
    except SpecError as e:
        raise UsageError(f"--request-overhead: {e.why} (got {text!r})") from None
    if overhead_s > MAX_OVERHEAD_S:  # past this every simulated time is the overhead alone (a typo: 1e300s)
        raise UsageError(f"--request-overhead: at most {MAX_OVERHEAD_S:g} s (got {text!r})")
    return overhead_s


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
    if jitter_sd is not None and not (isinstance(jitter_sd, int | float) and 0 <= jitter_sd <= MAX_JITTER_SD):
        raise UsageError(f"--jitter: must be a relative sd from 0 to {MAX_JITTER_SD:g} (got {jitter_sd!r})")
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


