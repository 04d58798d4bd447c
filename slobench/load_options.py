"""What a load verb is asked to do, as four typed, frozen option groups: the target, the workload, the run,
and the simulator or in-process engine with its fleet. Each group holds its own defaults and checks itself
once, when made; `LoadOptions` joins them and checks what spans two. The CLI makes them from its flags
(`slobench.cli.common.options_from_args`, argparse defaults all None), the Python API from keywords
(`slobench.run_load`) and the GitHub Action from its inputs, all through `LoadOptions.make`, so a value
meets the same check and the same default whichever way it came. A bad value is a UsageError (exit 2)
naming its flag."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO, load_slo
from slobench.errors import SpecError, UsageError
from slobench.load_flags import (
    check_urls,
    parse_error_rate,
    parse_extra_body,
    parse_headers,
    parse_rate_limit,
)
from slobench.run.outdir import check_out_file
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_METRICS_BODY_BYTES
from slobench.targets.options import TRANSPORTS, TransportName, check_extra_body
from slobench.targets.workers import MAX_WORKERS
from slobench.workload.ranges import (
    MAX_NUM_REQUESTS,
    MAX_TOKENS,
    MAX_USERS,
    check_count,
    check_duration_s,
    check_rate_rps,
    check_requests_in,
)
from slobench.workload.spec import WorkloadSpec

MAX_JITTER_SD = 10.0  # step-time noise, relative sd: beyond it a step's time is noise alone


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _as_flag(name: str, value: Any, check: Callable[..., None], *args: Any) -> None:
    """Run a typed value's own check, `check(*args)`; its SpecError becomes the flag's UsageError (exit 2,
    the flag named)."""
    try:
        check(*args)
    except SpecError as e:
        raise UsageError(f"{_flag(name)} {value!r}: {e.why}") from None


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # a frozen group normalises its own fields once, in __post_init__


@dataclass(frozen=True, slots=True)
class TargetGroup:
    """Which server and how to talk to it (the CLI's "target" flags)."""

    url: str | None = None  # None: http://127.0.0.1:8000/v1; "A,B": several replicas, routed here
    model: str | None = None  # None: the first model the server lists
    api: str | None = None  # None: the workload's
    api_key_env: str | None = "OPENAI_API_KEY"  # None: no key
    header: tuple[str, ...] = ()
    extra_body: str | Mapping[str, Any] | None = None  # JSON text or a mapping; a dict once made
    no_stream: bool = False
    timeout: float = 600.0
    transport: TransportName = "raw"
    http2: bool = False
    server_profile: str = "auto"
    tokenizer: str | None = None
    client_workers: int = 1
    ray: str | None = None
    max_body: int = DEFAULT_MAX_BODY_BYTES
    max_metrics_body: int = DEFAULT_MAX_METRICS_BODY_BYTES
    headers: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set(self, "header", tuple(self.header))
        _set(self, "headers", parse_headers(self.header))
        body = parse_extra_body(self.extra_body)
        if body is not None:
            check_extra_body(body)
        _set(self, "extra_body", body)
        if self.url is not None:
            check_urls(self.url)
        if self.api not in (None, "completions", "chat", "responses"):
            raise UsageError(f"--api {self.api}: expected completions, chat or responses")
        if self.transport not in TRANSPORTS:
            raise UsageError(f"--transport {self.transport}: expected raw or httpx")
        if math.isnan(self.timeout) or self.timeout < 0:
            raise UsageError(f"--timeout {self.timeout}: must be a number >= 0")
        if not 1 <= self.client_workers <= MAX_WORKERS:  # before any network call: a bad flag is exit 2, not 3
            raise UsageError(f"--client-workers must be from 1 to {MAX_WORKERS} (got {self.client_workers})")


@dataclass(frozen=True, slots=True)
class WorkloadGroup:
    """What to send and when: a workload spec or a trace, its rate, bounds, lengths and seed."""

    workload: str | WorkloadSpec | None = None  # a bundled name, a TOML path, or a spec (Python); None: "chat"
    rate: float | None = None  # None: the workload's own
    num_requests: int | None = None
    duration: float | None = None
    input_len: int | None = None
    output_len: int | None = None
    seed: int = 0
    trace: str | None = None
    trace_format: str | None = None
    time_scale: float | None = None
    start: float = 0.0
    no_spread: bool = False
    keep_zero_rows: bool = False
    min_tokens: str | None = None
    rates: str | None = None  # sweep and capacity
    refine_knee: int = 0  # sweep
    session_mode: str | None = None  # "wait" or "scheduled": overrides a session workload's [sessions] mode, or a trace's

    def __post_init__(self) -> None:
        # the workload's own range checks (slobench.workload.ranges), with the flag named
        for name, limit in (("num_requests", MAX_NUM_REQUESTS), ("input_len", MAX_TOKENS), ("output_len", MAX_TOKENS)):
            if (value := getattr(self, name)) is not None:
                _as_flag(name, value, check_count, name, value, limit)
        if self.duration is not None:
            _as_flag("duration", self.duration, check_duration_s, "duration", self.duration)
        if self.rate is not None:
            _as_flag("rate", self.rate, check_rate_rps, "rate", self.rate)
        _as_flag("duration", self.duration, check_requests_in, self.rate, self.duration)
        if not 0 <= self.seed < 2**63:
            raise UsageError(f"--seed {self.seed}: must be from 0 to 2**63 - 1")
        for name in ("time_scale", "start"):
            v = getattr(self, name)
            if v is not None and (math.isnan(v) or v < 0):
                raise UsageError(f"{_flag(name)} {v}: must be a number >= 0")
        if self.trace is None:  # a flag that would be ignored is a usage error, not a silent no-op
            given = [name for name in ("trace_format", "time_scale", "start", "no_spread", "keep_zero_rows",
                                       "min_tokens") if getattr(self, name) != _DEFAULTS[name]]
            if given:
                raise UsageError(f"{_flag(given[0])} applies only to --trace")
        else:
            if self.workload is not None:
                raise UsageError("--trace and --workload conflict: a trace replay sends the trace's requests; give one")
            if self.input_len is not None or self.output_len is not None:
                raise UsageError("--input-len / --output-len do not apply to --trace (it has the lengths)")
        if self.session_mode is not None and self.session_mode not in ("wait", "scheduled"):
            raise UsageError(f"--session-mode {self.session_mode!r}: expected wait or scheduled")
        if self.refine_knee < 0:
            raise UsageError(f"--refine-knee {self.refine_knee}: expected 0 or more extra rates")


@dataclass(frozen=True, slots=True)
class RunGroup:
    """How a run goes and where it is written: SLO, output, warm-up, loop shape, limits, progress."""

    slo: str | SLO | None = None  # `ttft=500ms,...`, an SLO TOML's path, or an SLO
    out: str | None = None  # None: a new runs/<verb>-<time>
    overwrite: bool = False
    warmup: str = "0"  # a number of requests, or "auto"
    max_in_flight: int | None = None
    concurrency: int | None = None
    rate_limit: str | None = None
    max_error_rate: str | None = None
    no_progress: bool = False
    # sweep and capacity probes stop once their verdict against the SLO is decided (slobench.run.early_stop)
    # unless this is set; a single run is always measured to its end
    no_early_stop: bool = False
    scrape_interval: float = 1.0  # seconds between /metrics scrapes; 0: off
    report: str | None = None

    def __post_init__(self) -> None:
        if self.slo is not None and not isinstance(self.slo, SLO):
            _set(self, "slo", load_slo(self.slo))  # a bare number, a bad key, a missing file: exit 2 now
        _set(self, "warmup", str(self.warmup))
        if self.warmup != "auto" and not (self.warmup.isascii() and self.warmup.isdigit()):
            raise UsageError(f"--warmup: expected a number of requests or 'auto' (got {self.warmup!r})")
        for name in ("concurrency", "max_in_flight"):
            v = getattr(self, name)
            if v is not None and not 1 <= v <= MAX_USERS:
                raise UsageError(f"{_flag(name)} {v}: must be from 1 to {MAX_USERS:,}")
        if self.concurrency is not None and self.max_in_flight is not None:
            raise UsageError("--concurrency (closed loop: N users) and --max-in-flight (a cap on an open loop) "
                             "exclude each other; drop one")
        interval = self.scrape_interval
        if not (interval >= 0 and interval < math.inf):
            raise UsageError(f"--scrape-interval: must be a number of seconds >= 0 (got {interval})")
        parse_rate_limit(self.rate_limit)
        parse_error_rate(self.max_error_rate)
        if self.report:
            check_out_file(Path(self.report), "--report")


@dataclass(frozen=True, slots=True)
class SimGroup:
    """The bundled engine in process (`engine`), or simulated (`simulate`), and a simulated fleet's shape.
    `engine_knobs` are the engine's (`EngineSpec` fields, as the manifest records them); the fleet's
    topology is its own fields here."""

    engine: str | None = None
    engine_knobs: Mapping[str, Any] | None = None
    max_num_seqs: int | None = None
    simulate: bool = False
    jitter: float | None = None
    request_overhead: str | None = None
    replicas: int = 1
    router: str = "least-outstanding"
    prefill_replicas: int = 0
    decode_replicas: int = 0
    colocated_replicas: int = 0
    kv_link: str | None = None
    decode_profile: str | None = None  # the decode instances' own cost profile (default: the engine's)
    decode_kv_blocks: int | None = None  # and KV blocks

    def __post_init__(self) -> None:
        if (self.engine or self.simulate) and self.engine_knobs is None:
            raise ValueError("SimGroup.engine_knobs: needed with engine or simulate (the engine's shape)")
        if self.jitter is not None and (math.isnan(self.jitter) or self.jitter < 0):
            raise UsageError(f"--jitter {self.jitter}: must be a number >= 0")
        if self.replicas != 1 and not self.simulate:
            raise UsageError("--replicas needs --simulate (against a real fleet, point --url at its load balancer)")
        if self.replicas < 1:
            raise UsageError(f"--replicas must be >= 1 (got {self.replicas})")
        if self.is_disaggregated or self.colocated_replicas or self.kv_link is not None:
            if not self.simulate:
                raise UsageError("--prefill-replicas/--decode-replicas/--kv-link need --simulate")
            if not self.is_disaggregated:
                raise UsageError("--kv-link and --colocated-replicas need --prefill-replicas and --decode-replicas")
            if self.replicas != 1:
                raise UsageError("--replicas with --prefill/--decode-replicas: give co-located ones as "
                                 "--colocated-replicas")
        for name in ("decode_profile", "decode_kv_blocks"):  # a flag that would be ignored is an error
            if getattr(self, name) is not None and not self.is_disaggregated:
                raise UsageError(f"{_flag(name)} applies only with --prefill-replicas and --decode-replicas")

    @property
    def is_disaggregated(self) -> bool:
        return bool(self.prefill_replicas or self.decode_replicas)

    def fleet_knobs(self) -> dict[str, Any]:
        """A disaggregated fleet's shape as `slobench.fleet.disagg.split_fleet_knobs` reads it beside the
        engine's knobs (and the manifest records it); empty for any other fleet."""
        if not self.is_disaggregated:
            return {}
        knobs: dict[str, Any] = {"prefill_replicas": self.prefill_replicas, "decode_replicas": self.decode_replicas,
                                 "colocated_replicas": self.colocated_replicas, "kv_link": self.kv_link or "inf,0"}
        for name in ("decode_profile", "decode_kv_blocks"):  # only when given: other fleets' knobs stay as they are
            if getattr(self, name) is not None:
                knobs[name] = getattr(self, name)
        return knobs


GROUPS = (TargetGroup, WorkloadGroup, RunGroup, SimGroup)
_OWNER = {f.name: g for g in GROUPS for f in fields(g) if f.init}
_DEFAULTS = {f.name: f.default for g in GROUPS for f in fields(g) if f.init}
FLAG_NAMES = frozenset(_OWNER)  # every load flag's dest


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """The four groups of one load verb (`verb`: run, sweep or capacity). A flag's value reads by its dest
    name (`options.rate`, `options.url`) from the group that holds it."""

    verb: str
    target_group: TargetGroup = TargetGroup()
    workload_group: WorkloadGroup = WorkloadGroup()
    run_group: RunGroup = RunGroup()
    sim_group: SimGroup = SimGroup()

    def __post_init__(self) -> None:
        t, w, r, s = self.target_group, self.workload_group, self.run_group, self.sim_group
        off_url = "--simulate" if s.simulate else "--engine" if s.engine else None
        if off_url and t.url is not None:
            raise UsageError(f"{off_url} runs the bundled engine here, so --url would be ignored; drop one of them")
        if r.warmup.isascii() and r.warmup.isdigit() and w.num_requests is not None and int(r.warmup) >= w.num_requests:
            raise UsageError(f"--warmup {r.warmup} leaves nothing to measure of --num-requests "
                             f"{w.num_requests}; use fewer warm-up requests or more requests")
        if t.tokenizer and (s.engine or s.simulate):
            raise UsageError("--tokenizer applies to --url targets (the bundled engine takes token ids)")
        if t.ray is not None:
            if s.engine or s.simulate:
                raise UsageError("--ray needs --url: the in-process engine and --simulate send nothing over HTTP")
            if "," in str(t.url or ""):
                raise UsageError("--ray with several --url: not supported; point --url at the fleet's load balancer")
        if r.no_early_stop and self.verb == "run":
            raise UsageError("--no-early-stop applies to sweep and capacity probes; a run is always measured to its end")
        if w.trace is not None:
            rescaled = [f for f, on in (("--rate", w.rate is not None), ("--rates", w.rates is not None),
                                        ("capacity", self.verb == "capacity")) if on]
            if w.time_scale is not None and r.concurrency is not None:
                raise UsageError("--time-scale and --concurrency conflict: a closed loop sends each request when one "
                                 "ends, not at the trace's times; give one")
            if w.time_scale is not None and rescaled:
                what = "a capacity search" if rescaled[0] == "capacity" else rescaled[0]
                raise UsageError(f"--time-scale and {what} conflict: a rate rescales the trace to that mean rate, "
                                 "which replaces --time-scale; give one")

    @classmethod
    def make(cls, verb: str, **values: Any) -> LoadOptions:
        """The options of `verb` from flag values by dest name; a value left out or None takes its group's
        default. A name that is no load flag is a TypeError (a bug, or a misspelt keyword)."""
        by_group: dict[type, dict[str, Any]] = {g: {} for g in GROUPS}
        for name, value in values.items():
            if name not in _OWNER:
                raise TypeError(f"LoadOptions.make: no load flag {name!r}")
            if value is not None:
                by_group[_OWNER[name]][name] = value
        return cls(verb, TargetGroup(**by_group[TargetGroup]), WorkloadGroup(**by_group[WorkloadGroup]),
                   RunGroup(**by_group[RunGroup]), SimGroup(**by_group[SimGroup]))

    def with_values(self, **values: Any) -> LoadOptions:
        """A copy with these flag values (by dest name) put in the groups that hold them, every group checked
        again; None sets a value back to its group's default."""
        groups: dict[type, Any] = {TargetGroup: self.target_group, WorkloadGroup: self.workload_group,
                                   RunGroup: self.run_group, SimGroup: self.sim_group}
        changed: dict[type, dict[str, Any]] = {}
        for name, value in values.items():
            if name not in _OWNER:
                raise TypeError(f"LoadOptions.with_values: no load flag {name!r}")
            changed.setdefault(_OWNER[name], {})[name] = value
        for owner, new in changed.items():
            defaults = {f.name: f.default for f in fields(owner)}
            groups[owner] = replace(groups[owner], **{k: defaults[k] if v is None else v for k, v in new.items()})
        return LoadOptions(self.verb, groups[TargetGroup], groups[WorkloadGroup], groups[RunGroup], groups[SimGroup])

    @staticmethod
    def as_argv(verb: str, **values: Any) -> list[str]:
        """The `slobench VERB ...` command line that gives these values (what the Python API records as the
        manifest's `command`, where the CLI records its own argv)."""
        argv = [verb]
        for name, value in values.items():
            if value is None or value is False:
                continue
            flag = _flag(name)
            if value is True:
                argv.append(flag)
            elif isinstance(value, tuple | list):
                for item in value:
                    argv += [flag, str(item)]
            elif isinstance(value, Mapping):
                argv += [flag, json.dumps(dict(value))]
            elif isinstance(value, WorkloadSpec):
                argv += [flag, value.name]
            elif isinstance(value, SLO):
                argv += [flag, value.as_flag()]
            else:
                argv += [flag, value if isinstance(value, str) else f"{value:g}" if isinstance(value, float)
                         else str(value)]
        return argv

    @property
    def early_stop(self) -> bool:
        """Whether each probe stops once its verdict is decided: a sweep's and a capacity search's, live."""
        return self.verb in ("sweep", "capacity") and not self.run_group.no_early_stop

    def __getattr__(self, name: str) -> Any:
        owner = _OWNER.get(name) or (TargetGroup if name == "headers" else None)
        if owner is None:
            raise AttributeError(name)
        group = {TargetGroup: self.target_group, WorkloadGroup: self.workload_group, RunGroup: self.run_group,
                 SimGroup: self.sim_group}[owner]
        return getattr(group, name)
