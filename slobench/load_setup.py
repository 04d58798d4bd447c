"""What every load-sending verb builds from its options: the workload (a spec or a trace replay), the SLO,
the target (through `slobench.targets.build`), the run options, the manifest, and the probe that measures
one (rate, seed). The command line turns its flags into a `LoadOptions` once (`slobench.cli.common`) and
prints; this decides."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO, parse_duration_s
from slobench.analysis.summary import RunSummary
from slobench.errors import SpecError, UsageError
from slobench.experiments.probe import LiveProbe, Probe, VirtualProbe
from slobench.fleet.disagg import DisaggFleet, KVLink, split_fleet_knobs
from slobench.fleet.simulate import ModeledEngine, calibrated_extras
from slobench.load_flags import parse_error_rate, parse_rate_limit
from slobench.load_options import MAX_JITTER_SD, LoadOptions
from slobench.printable import printable
from slobench.redact import redact_text
from slobench.run.clock import Clock
from slobench.run.manifest import build_manifest
from slobench.run.records import REQUESTS
from slobench.run.runner import RunOptions
from slobench.run.scrape import MetricsScraper, metrics_url_for
from slobench.run.server_idle import http_samples, local_samples, wait_idle
from slobench.targets.build import build
from slobench.targets.capabilities import TOO_LONG, Capabilities
from slobench.targets.options import DEFAULT_URL, OVERRIDABLE, TargetOptions, Timeouts, prompt_api
from slobench.targets.ray_pool import note_client_clocks, require_ray
from slobench.workload import WorkloadSpec, load_workload, phase_boundaries
from slobench.workload.base import RunShape, Workload
from slobench.workload.limits import BoundedSpecs, ServerLimits, shortened_note
from slobench.workload.replay import TraceReplay
from slobench.workload.sessions import with_session_mode
from slobench.workload.text import load_tokenizer
from slobench.workload.trace_stream import StreamingReplay
from slobench.workload.traces import may_hold_sessions
from slobench.workload.word_fit import WordFit

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


def open_replay(o: LoadOptions, api: str, warn: Any) -> Any:
    """The replay the load verbs' trace flags describe. `run`, against a target or
    simulated, streams the trace (a StreamingReplay: rows read and prompts built as the run goes, so a long
    trace starts at once in flat memory and `--num-requests 200` reads little more than 200 rows; what the
    rows became is reported after the run, in summary.json `trace_rows`); `sweep` and `capacity` replay one
    trace at several rates and load it once (a TraceReplay, whose warnings come now), and so does a `run` of
    a trace whose sessions wait for the server (`--session-mode wait`, the default where the trace's first
    rows show session fields: `slobench.workload.trace_sessions`), as the runner must hold back later turns."""
    assert o.trace is not None
    mode = o.session_mode or "wait"
    if o.verb == "run" and not (mode == "wait" and may_hold_sessions(o.trace, o.trace_format)):
        return StreamingReplay.open(
            o.trace, o.trace_format, time_scale=o.time_scale, start_s=o.start, api=api, spread=not o.no_spread,
            keep_zero=o.keep_zero_rows, min_tokens=o.min_tokens or "max",
        )
    return TraceReplay.open(
        o.trace, o.trace_format, seed=o.seed, time_scale=o.time_scale, start_s=o.start, api=api, warn=warn,
        spread=not o.no_spread, keep_zero=o.keep_zero_rows, min_tokens=o.min_tokens or "max", session_mode=mode,
    )


class LoadSetup:
    """What every load-sending verb builds from its `LoadOptions`."""

    def __init__(self, options: LoadOptions, *, command: Sequence[str] | None = None) -> None:
        """`command`: what the manifest records as the command line (default: this process's, sys.argv)."""
        self.options = o = options  # each group checked itself when made
        self.command = list(sys.argv[1:] if command is None else command)
        # the engine's knobs, and a disaggregated fleet's shape beside them as the fleet reads it; empty for a URL
        self.engine_knobs: dict[str, Any] = {**(o.engine_knobs or {}), **o.sim_group.fleet_knobs()}
        self.min_duration_s: float | None = None  # sweeps and capacity: see probe_duration
        self.said: set[str] = set()  # the refusals already explained (note_refusals): each once per command
        self.check_fleet()
        self.workload: Workload
        if o.trace is not None:  # a trace stands where a WorkloadSpec stands
            self.workload = open_replay(o, prompt_api(o.api or "completions"),
                                        warn=lambda msg: print(f"slobench: {printable(msg)}", file=sys.stderr))
        else:
            wl = o.workload or "chat"
            self.workload = wl if isinstance(wl, WorkloadSpec) else load_workload(wl)
            if o.session_mode is not None:
                if self.workload.sessions is None:
                    raise UsageError(f"--session-mode applies to a workload with sessions; {self.workload.name!r} "
                                     "has no [sessions] table")
                self.workload = with_session_mode(self.workload, o.session_mode)
        self.slo: SLO | None = o.slo
        if o.no_stream and self.slo is not None and self.slo.tpot_s is not None:  # before any request is sent
            raise UsageError("--slo tpot=... needs streaming: with --no-stream each answer arrives whole, so TPOT "
                             "cannot be measured; drop tpot from --slo or drop --no-stream")
        self.api = o.api or self.workload.api
        self.headers: dict[str, str] = o.headers
        self.extra_body: dict[str, Any] | None = o.extra_body
        self.max_error_rate = parse_error_rate(o.max_error_rate)
        if o.tokenizer:
            load_tokenizer(Path(o.tokenizer))  # a missing or unreadable file is exit 2 before any request
        self.target_opts = self.target_options()  # checked now: a bad --extra-body is exit 2 before any request
        for key in self.target_opts.extra_body_overrides:
            print(f"slobench: --extra-body sets {key} to {json.dumps(self.extra_body[key])} in every request "  # type: ignore[index]
                  f"(slobench's default {OVERRIDABLE[key]}); recorded in the manifest as "
                  "target.extra_body_overrides", file=sys.stderr)

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
            api=prompt_api(self.api),  # type: ignore[arg-type]  # TargetOptions checks it
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
            self.workload, seed=o.seed, command=self.command,
            target=(
                {**target.describe(), "served": served} if o.engine else
                {"url": redact_text(o.url or DEFAULT_URL), "model": target.model, "api": self.api, "stream": not o.no_stream, "served": served}
                | ({"capabilities": target.caps.to_dict()} if target.caps is not None else {})
                | ({"tokenizer": o.tokenizer} if o.tokenizer else {})
                | ({"client_workers": o.client_workers} if o.client_workers != 1 else {})
                | ({"extra_body_overrides": {k: self.extra_body[k] for k in overrides}}  # type: ignore[index]
                   if (overrides := self.target_opts.extra_body_overrides) else {})
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

    def idle_wait(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        """After a probe stopped early: the wait for the server's gauges to show it idle (`server_idle`)."""
        if self.options.engine:
            fetch = local_samples(self.engine_target.metrics_text)
        else:
            fetch = http_samples([metrics_url_for(u) for u in self.urls], self.headers, self.options.max_metrics_body)
        return lambda: wait_idle(fetch)

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
        if o.api is not None:  # what --api named (a Responses request is simulated as the chat one it carries)
            target["api"] = o.api
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
        return build_manifest(self.workload, seed=o.seed, command=self.command,
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
        """What the option groups cannot check without building it: a disaggregated fleet's shape and KV link,
        and Ray installed (exit 2 with the pip line, before any network call)."""
        o = self.options
        if o.sim_group.is_disaggregated:
            DisaggFleet(o.prefill_replicas, o.decode_replicas, o.colocated_replicas,
                        KVLink.parse(o.kv_link or "inf,0"))  # bad values are exit 2 here, before any run
        if o.ray is not None:
            require_ray()

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
                              monitors_for=self.monitors if scrape else None, after_run=after_run,
                              settle=self.idle_wait())
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
            early_stop=o.early_stop,
        )


def server_limits(caps: Capabilities | None, api: str) -> ServerLimits:
    """What preflight learnt of the server that bounds the workload (none for the bundled engine in process)."""
    if caps is None:
        return ServerLimits()
    as_text = api != "completions" or not caps.token_prompts
    fit = WordFit(caps.tokens_per_word, caps.template_overhead, caps.tokens_per_word_sd, caps.probe_words) \
        if caps.probe_words else None  # measured at preflight (`preflight._measure_words`)
    return ServerLimits(id_range=None if as_text else caps.token_id_range, max_model_len=caps.max_model_len,
                        as_text=as_text, template_overhead=caps.template_overhead, word_fit=fit)


def note_shortened(bounded: BoundedSpecs, limits: ServerLimits) -> None:
    if bounded.num_shortened:
        print(f"slobench: {shortened_note(bounded.num_shortened, limits.max_model_len)}", file=sys.stderr)


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


MAX_OVERHEAD_S = 3600.0  # a simulated request's fixed cost outside the steps


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


async def run_once(setup: LoadSetup, out: Path | None) -> tuple[Any, Probe, str]:
    """One run at the options' rate and seed, through `setup`'s probe (preflight, the server's limits, the
    /metrics scraper, the notes after it): what `slobench run` and `slobench.run_load` both do. Returns the
    ProbeResult, the probe (its monitors' notes) and what was served."""
    o = setup.options
    async with setup.probe(first=(o.rate, o.seed)) as (probe, manifest, served):
        res = await probe(o.rate, o.seed, out, {**manifest, "rate_rps": o.rate})
    return res, probe, served
