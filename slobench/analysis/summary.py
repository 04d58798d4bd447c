"""A run's records into its `RunSummary`: the typed results model written to summary.json and read by the
terminal, the HTML report, sweeps, capacity searches, the gate and the history."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import numpy as np

from slobench.analysis.metrics import (
    GapCounts,
    RecordArrays,
    achieved_send_rps,
    describe,
    finite_values,
    quantiles,
    throughput,
)
from slobench.analysis.past_capacity import completion_counts, shortfall
from slobench.analysis.sessions import SessionColumns, session_metrics, session_results
from slobench.analysis.slo import SLO, Attainment, attainment, quantile_cis, samples_beyond
from slobench.errors import SpecError, UsageError
from slobench.redact import redact_message
from slobench.run.columnar import Columns, columns_of_rows
from slobench.run.records import RequestRecord
from slobench.run.run_reader import read_run_columns

# A send is late when it left more than this after its scheduled time, or 5% of the TTFT SLO if that is
# larger. Why 10 ms: at typical TTFT SLOs (>=200 ms) it is a <5% distortion of the tightest number we judge,
# and a healthy asyncio client keeps p99 under 2 ms even at 500 req/s (benchmarks/client_overhead.py).
LATENESS_LIMIT_S = 0.010
# The client is called the bottleneck when more than this share of its sends were late: one send delayed by
# a server sharing the client's cores is 1-5% of a short run and must not decide it; a starved event loop
# makes many late.
LATE_SHARE_LIMIT = 0.05
# ... or when it sent at a rate more than 5% below the one scheduled.
ACHIEVED_RATE_MIN_FRACTION = 0.95
# Below this many sends there is no verdict either way: one late send is 1% of 100 sends but 3-5% of the
# 20-40 a short run at 1-3 req/s makes, and the achieved rate rests on the span of a few sends.
MIN_SENDS_FOR_VERDICT = 100


def lateness_limit_s(slo: SLO | None) -> float:
    if slo is not None and slo.ttft_s is not None:
        return max(LATENESS_LIMIT_S, 0.05 * slo.ttft_s)
    return LATENESS_LIMIT_S


Intervals = Literal["all", "attainment", "none"]
DIST_KEYS = ("mean", "p50", "p90", "p99", "max")
CI_QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


@dataclass(frozen=True, slots=True)
class Dist:
    """One latency (or length) distribution: mean, p50/p90/p99, max of the finite values and how many there
    were; with intervals, each quantile's 95% interval and how many samples lie beyond it (NOTES-statistics
    asks for >= 100 before a p99 is trusted)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None
    count: int | None = None  # None where the summary read does not record it
    ci: Mapping[str, tuple[float | None, float | None]] | None = None  # "p50" -> (low, high)
    beyond: Mapping[str, int] | None = None

    @classmethod
    def of(cls, x: np.ndarray, *, intervals: bool = False, seed: int = 0) -> Dist:
        finite = finite_values(x)
        d = describe(finite)
        n = len(finite)
        ci = beyond = None
        if intervals:
            ci = dict(zip([name for _, name in CI_QUANTILES],
                          quantile_cis(finite, [q for q, _ in CI_QUANTILES], seed=seed), strict=True))
            beyond = {name: samples_beyond(n, q) for q, name in CI_QUANTILES}
        return cls(d["mean"], d["p50"], d["p90"], d["p99"], d["max"], n, ci, beyond)

    def get(self, stat: str) -> float | None:
        return getattr(self, stat) if stat in DIST_KEYS else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in DIST_KEYS}
        if self.count is not None:
            out["count"] = self.count
        for _, name in CI_QUANTILES:
            if self.ci is not None and name in self.ci:
                out[f"{name}_ci"] = list(self.ci[name])
            if self.beyond is not None and name in self.beyond:
                out[f"{name}_beyond"] = self.beyond[name]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Dist:
        if not isinstance(d, Mapping):
            return cls()
        ci = {n: (d[f"{n}_ci"][0], d[f"{n}_ci"][1]) for _, n in CI_QUANTILES if isinstance(d.get(f"{n}_ci"), list | tuple)}
        beyond = {n: int(d[f"{n}_beyond"]) for _, n in CI_QUANTILES if d.get(f"{n}_beyond") is not None}
        return cls(mean=_num(d.get("mean")), p50=_num(d.get("p50")), p90=_num(d.get("p90")), p99=_num(d.get("p99")),
                   max=_num(d.get("max")), count=d.get("count"), ci=ci or None, beyond=beyond or None)


def gap_dist(gaps: np.ndarray | GapCounts) -> Dist:
    """`Dist.of` the inter-token gaps, laid out or counted (`GapCounts.describe`: the same numbers)."""
    if isinstance(gaps, np.ndarray):
        return Dist.of(gaps)
    d = gaps.describe()
    return Dist(d["mean"], d["p50"], d["p90"], d["p99"], d["max"], len(gaps))


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class ClientHealth:
    """Was the load generator, not the server, the bottleneck (the share of late sends, the rate achieved),
    judged only over at least MIN_SENDS_FOR_VERDICT sends (`note` says so below that)."""

    lateness_s: Mapping[str, float | None]  # p50/p90/p99/max of how late each request was sent
    lateness_limit_s: float  # a send later than this is late
    is_bottleneck: bool
    warning: str | None
    ray: Mapping[str, Any] | None = None  # --ray: the load actors' clocks and health (slobench.targets.ray_pool)
    gc: Mapping[str, Any] | None = None  # the cyclic GC held off over the load, and any pauses (run/quiet_gc.py)
    num_sent: int | None = None  # sends judged
    late_share: float | None = None  # the share of them later than lateness_limit_s
    note: str | None = None  # why there is no verdict (too few sends)

    def to_dict(self) -> dict[str, Any]:
        return fields_to_json(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ClientHealth:
        d = d if isinstance(d, Mapping) else {}
        return cls(dict(d.get("lateness_s") or {}), float(d.get("lateness_limit_s") or LATENESS_LIMIT_S),
                   bool(d.get("is_bottleneck")), d.get("warning"), d.get("ray"), d.get("gc"),
                   d.get("num_sent"), _num(d.get("late_share")), d.get("note"))


@dataclass(frozen=True, slots=True)
class Breakdown:
    """One replica's or one request class's row: `label` is "replica" or "tag", `key` its value."""

    label: str
    key: Any
    num_requests: int
    num_ok: int
    ttft_p50_s: float | None  # on the SLO's clock (`ttft_on_slo_clock`)
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    attainment: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {self.label: self.key, "num_requests": self.num_requests, "num_ok": self.num_ok,
               "ttft_p50_s": self.ttft_p50_s, "ttft_p99_s": self.ttft_p99_s, "tpot_p50_s": self.tpot_p50_s}
        if self.attainment is not None:
            out["attainment"] = self.attainment
        return out

    @classmethod
    def from_dict(cls, label: str, d: Mapping[str, Any]) -> Breakdown:
        return cls(label, d.get(label), int(d.get("num_requests") or 0), int(d.get("num_ok") or 0),
                   _num(d.get("ttft_p50_s")), _num(d.get("ttft_p99_s")), _num(d.get("tpot_p50_s")),
                   _num(d.get("attainment")))


def _attainment_from(d: Any) -> Attainment | None:
    if not isinstance(d, Mapping) or "value" not in d:
        return None
    return Attainment(float("nan") if d["value"] is None else float(d["value"]), _num(d.get("ci_low")),
                      _num(d.get("ci_high")), int(d.get("num_requests") or 0), int(d.get("num_met") or 0),
                      float(d.get("good_throughput_rps") or 0.0))


def _json_key(key: str) -> Any:
    """A field written to summary.json under another name than its own."""
    return field(metadata={"json": key})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What one run measured: the one results model that summary.json holds and that the terminal, the HTML
    report, sweep headlines, capacity probes, the gate and the history all read (schema `SCHEMA_VERSION`
    of `slobench.run.rundir`). Built by `summarize` from one column reader; run facts the summary cannot see
    in the records (interrupted, the warm-up cut, a fleet's routing, the trace's rows) are added with
    `dataclasses.replace` by whoever measured the run. Fields are declared in summary.json's key order: the
    file is written and read field by field (`to_dict`, `from_dict`)."""

    num_requests: int
    num_warmup: int = 0
    num_ok: int
    status_counts: Mapping[str, int] = field(default_factory=dict)
    error_counts: Mapping[str, int] = field(default_factory=dict)  # by `error_kind`, the top MAX_ERROR_KINDS
    error_examples: Mapping[str, str] | None = None  # each counted kind's first message (`error_example`)
    duration_s: float
    offered_rps: float
    achieved_send_rps: float
    request_throughput_rps: float
    output_token_throughput_tps: float
    total_token_throughput_tps: float
    ttft: Dist = _json_key("ttft_s")  # from the send (the classic definition)
    ttft_from_scheduled: Dist = _json_key("ttft_from_scheduled_s")  # from the scheduled arrival (no coordinated omission)
    tpot: Dist = _json_key("tpot_s")
    itl: Dist = _json_key("itl_s")
    e2e: Dist = _json_key("e2e_s")
    e2e_from_scheduled: Dist = _json_key("e2e_from_scheduled_s")
    # where some answer carried a reasoning channel (`reasoning_summary`): time to the first answer token,
    # on both clocks, and TPOT of the answer alone; None (and absent from summary.json) otherwise
    ttfa: Dist | None = field(default=None, metadata={"json": "ttfa_s"})
    ttfa_from_scheduled: Dist | None = field(default=None, metadata={"json": "ttfa_from_scheduled_s"})
    answer_tpot: Dist | None = field(default=None, metadata={"json": "answer_tpot_s"})
    reasoning: Mapping[str, Any] | None = None
    output_tokens: Dist
    prompt_tokens: Dist
    client: ClientHealth
    deliberate_waits: Mapping[str, Any] | None = None
    prefix_cache: Mapping[str, Any] | None = None
    queue_drift: Mapping[str, Any] | None = None
    lengths: Mapping[str, Any] | None = None
    sessions: Mapping[str, Any] | None = None  # per-session results (`slobench.analysis.sessions`)
    per_replica: tuple[Breakdown, ...] = ()
    per_tag: tuple[Breakdown, ...] = ()
    slo: SLO | None = None
    attainment: Attainment | None = None
    # run facts, set by whoever measured the run
    rate_rps: float | None = None  # the nominal offered rate (a sweep point's, a probe's); None: the workload's own
    warmup: Mapping[str, Any] | None = None
    interrupted: bool | None = None
    stopped_by: str | None = None
    # the run stopped once its verdict against the SLO was decided (slobench.run.early_stop.StoppedEarly):
    # `attainment` then holds what is known (value: met among the decided; interval: its bounds)
    stopped_early: Mapping[str, Any] | None = None
    num_scheduled: int | None = None
    trace_rows: Mapping[str, Any] | None = None
    fleet: Mapping[str, Any] | None = None
    clock: str | None = None  # "virtual" for a simulated run
    run_dir: str | None = None  # a probe's directory, relative to its search's
    notes: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this slobench does not know (a newer writer's)

    # --- what readers ask for ---
    @property
    def attainment_value(self) -> float | None:
        a = self.attainment
        return None if a is None or a.num_requests == 0 else a.value

    @property
    def offered_rate_rps(self) -> float:
        """The rate this run was offered at: the nominal one where a sweep or probe set it, else measured."""
        return float(self.rate_rps if self.rate_rps is not None else self.offered_rps)

    @property
    def overloaded(self) -> bool:
        return bool((self.queue_drift or {}).get("overloaded"))

    def ttft_on_clock(self, slo: SLO | None = None) -> Dist:
        """TTFT on the clock the SLO judges by; from the scheduled arrival when there is none (no hiding)."""
        return self.ttft if from_send(slo if slo is not None else self.slo) else self.ttft_from_scheduled

    def ttfa_on_clock(self, slo: SLO | None = None) -> Dist | None:
        return self.ttfa if from_send(slo if slo is not None else self.slo) else self.ttfa_from_scheduled

    def e2e_on_clock(self, slo: SLO | None = None) -> Dist:
        return self.e2e if from_send(slo if slo is not None else self.slo) else self.e2e_from_scheduled

    def flat_metrics(self) -> dict[str, float]:
        """The numbers a gate can compare, flat: `attainment`, `ttft.p99`, `tpot.mean`, ... (`ttft` from the
        send, the classic definition; `ttft_sched` from the scheduled arrival), and a session run's
        `session_attainment`, `session_time.p99`, ... (`slobench.analysis.sessions.session_metrics`)."""
        out: dict[str, float] = {}
        if self.attainment is not None and not math.isnan(self.attainment.value):
            out["attainment"] = float(self.attainment.value)
            out["good_throughput"] = float(self.attainment.good_throughput_rps or 0.0)
        if math.isfinite(self.request_throughput_rps):
            out["throughput"] = float(self.request_throughput_rps)
        for name, d in (("ttft", self.ttft), ("ttft_sched", self.ttft_from_scheduled), ("tpot", self.tpot),
                        ("itl", self.itl), ("e2e", self.e2e), ("ttfa", self.ttfa),
                        ("ttfa_sched", self.ttfa_from_scheduled), ("answer_tpot", self.answer_tpot)):
            if d is None:
                continue
            for stat in ("mean", "p50", "p90", "p99"):
                v = getattr(d, stat)
                if v is not None and math.isfinite(v):
                    out[f"{name}.{stat}"] = float(v)
        return out | session_metrics(self.sessions)

    # --- summary.json ---
    def to_dict(self) -> dict[str, Any]:
        return {**fields_to_json(self), **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        """summary.json read back (also a lean one from an older slobench: what it lacks is left empty)."""
        if not isinstance(d, Mapping):
            raise UsageError(f"a run summary must be a JSON object (got {type(d).__name__})")
        for key in _OBJECT_KEYS:  # absent is an older writer's; another type is damage
            if d.get(key) is not None and not isinstance(d[key], Mapping):
                raise UsageError(f"a run summary's {key} must be an object (got {type(d[key]).__name__})")
        try:
            kw = {f.name: decode(d.get(key)) for f, key, decode in _CODEC}
            return cls(**kw, extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS})
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, SpecError) as e:
            raise UsageError(f"a run summary is malformed ({type(e).__name__}: {e})") from None


def fields_to_json(obj: Any) -> dict[str, Any]:
    """A summary section's JSON form, field by field in declaration order, under each field's JSON key: a
    field at its empty default (None, or no rows) is left out, `extra` is the caller's to merge."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if f.name == "extra" or (f.default in (None, ()) and v == f.default):
            continue
        out[f.metadata.get("json", f.name)] = _to_json(v)
    return out


def _to_json(v: Any) -> Any:
    if hasattr(v, "to_dict"):
        return v.to_dict()
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, tuple):
        return [_to_json(x) for x in v]
    return v


# How a summary.json value becomes a field, by the field's type; any type not named here is taken as it is.
_DECODERS: dict[Any, Callable[[Any], Any]] = {
    int: lambda v: int(v or 0),
    float: lambda v: float("nan") if v is None else float(v),
    float | None: _num,
    Mapping[str, int]: lambda v: dict(v or {}),
    Dist: Dist.from_dict,
    Dist | None: lambda v: Dist.from_dict(v) if v is not None else None,
    ClientHealth: ClientHealth.from_dict,
    SLO | None: lambda v: SLO.from_dict(v) if v else None,
    Attainment | None: _attainment_from,
    tuple[str, ...] | None: lambda v: None if v is None else tuple(v),
}


def _decoder(f: Field[Any], hint: Any) -> Callable[[Any], Any]:
    if hint == tuple[Breakdown, ...]:  # per_replica, per_tag: rows keyed by "replica", "tag"
        label = f.name.removeprefix("per_")
        return lambda rows: tuple(Breakdown.from_dict(label, r) for r in rows or ())
    return _DECODERS.get(hint, lambda v: v)


_HINTS = get_type_hints(RunSummary)
# (field, its summary.json key, its decoder) for every field but `extra`
_CODEC = tuple((f, f.metadata.get("json", f.name), _decoder(f, _HINTS[f.name]))
               for f in fields(RunSummary) if f.name != "extra")
_KNOWN_KEYS = frozenset({"schema_version", *(key for _, key, _ in _CODEC)})


def _is_object_hint(hint: Any) -> bool:
    """A field summary.json holds as a JSON object: a section with from_dict, or a Mapping (maybe None)."""
    options = get_args(hint) if get_origin(hint) in (UnionType, Union) else (hint,)
    return any(hasattr(o, "from_dict") or o is Attainment or get_origin(o) is Mapping for o in options
               if o is not type(None))


_OBJECT_KEYS = tuple(key for f, key, _ in _CODEC if _is_object_hint(_HINTS[f.name]))


def as_run_summary(s: RunSummary | Mapping[str, Any]) -> RunSummary:
    """A sweep row's summary as the typed model: in memory it is one already, read from sweep.json a dict."""
    return s if isinstance(s, RunSummary) else RunSummary.from_dict(s)


@dataclass(frozen=True, slots=True)
class RunColumns:
    """A run's measured records as columns: the one input `summarize` reads, from records in memory
    (`columns_of`) or straight from requests.jsonl (`read_columns`, without a RequestRecord per line)."""

    arrays: RecordArrays
    error_counts: dict[str, int]
    error_examples: dict[str, str]
    lengths: dict[str, Any] | None = None  # asked vs delivered lengths (`length_fidelity`)
    num_warmup: int = 0
    sessions: SessionColumns | None = None  # the session columns, where records are a session's turns


def columns_of(records: Sequence[RequestRecord]) -> RunColumns:
    return run_columns(columns_of_rows(records, getattr), consume=True)


def read_columns(run_dir: Path) -> RunColumns:
    """A run directory's records straight into columns: requests.parquet where it is sound, else
    requests.jsonl (`slobench.run.run_reader.read_run_columns`). Why not through `load_run`: the report must
    read a million records in seconds, and a Python object per request costs more than the reading."""
    try:
        return run_columns(read_run_columns(Path(run_dir)), consume=True)
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise UsageError(f"{run_dir}: bad value in a request record ({type(e).__name__}: {e})") from None


def run_columns(c: Columns, *, consume: bool = False) -> RunColumns:
    """The measured (non-warm-up) records of `c` as the summary's input. consume: `c` was made for this
    call, and its chunk times may be overwritten by the gaps between them (`RecordArrays.from_columns`)."""
    measured = ~c.values["is_warmup"]
    whole = measured.all()
    m = c if whole else c.take(np.flatnonzero(measured))
    error = m.values["error"]
    errors = [str(e) for e in error[error.astype(bool)]]
    sessions = SessionColumns.of(m)  # (before the arrays, which may take m's columns over)
    return RunColumns(RecordArrays.from_columns(m, consume=consume or not whole), error_kinds(errors),
                      error_examples(errors), length_fidelity(m),
                      num_warmup=len(c) - len(m), sessions=sessions)


def summarize(source: RunColumns | Sequence[RequestRecord] | Path, slo: SLO | None, *, seed: int = 0,
              intervals: Intervals | bool = "all") -> RunSummary:
    """The one function that turns a run's records into its `RunSummary`: records in memory, their
    columns, or a run directory (its records read column by column, `read_columns`).

    intervals: "all" (bootstrap intervals of attainment and of the TTFT/TPOT/E2E quantiles: what a run
    writes), "attainment" (the report's: quantile intervals cost several times the rest), "none"
    (capacity searches on the virtual clock decide on replicates instead; True/False mean all/none)."""
    if isinstance(source, Path):
        source = read_columns(source)
    cols = source if isinstance(source, RunColumns) else columns_of(source)
    level = ("all" if intervals else "none") if isinstance(intervals, bool) else intervals
    a = cols.arrays
    tp = throughput(a)
    ci = level == "all"
    out = RunSummary(
        num_requests=len(a), num_ok=int(a.is_ok.sum()), duration_s=tp.duration_s, offered_rps=tp.offered_rps,
        request_throughput_rps=tp.request_rps, output_token_throughput_tps=tp.output_tokens_per_s,
        total_token_throughput_tps=tp.total_tokens_per_s, achieved_send_rps=achieved_send_rps(a),
        ttft=Dist.of(a.ttft_s, intervals=ci, seed=seed),
        ttft_from_scheduled=Dist.of(a.ttft_from_scheduled_s, intervals=ci, seed=seed),
        tpot=Dist.of(a.tpot_s, intervals=ci, seed=seed), itl=gap_dist(a.gaps),
        e2e=Dist.of(a.e2e_s, intervals=ci, seed=seed), e2e_from_scheduled=Dist.of(a.e2e_from_scheduled_s),
        output_tokens=Dist.of(a.output_tokens.astype(float)), prompt_tokens=Dist.of(a.prompt_tokens.astype(float)),
        client=client_health(a, slo), num_warmup=cols.num_warmup,
        status_counts=dict(Counter(a.status.tolist())), error_counts=cols.error_counts,
        error_examples=cols.error_examples or None,
        deliberate_waits=deliberate_waits(a), prefix_cache=prefix_cache(a),
        per_replica=tuple(per_replica(a, slo)), per_tag=tuple(per_tag(a, slo)), queue_drift=queue_drift(a),
        lengths=cols.lengths, slo=slo, **answer_metrics(a, ci, seed),
    )
    if slo is not None:
        if level == "none":
            met = slo.meets(a)
            n, k = len(met), int(met.sum())
            att = Attainment(k / n if n else float("nan"), None, None, n, k,
                             k / tp.duration_s if tp.duration_s > 0 else 0.0)
        else:
            att = attainment(a, slo, duration_s=tp.duration_s, seed=seed)
        out = replace(out, attainment=att)
    if cols.sessions is not None:
        out = replace(out, sessions=session_results(cols.sessions, None if slo is None else slo.meets(a),
                                                    None if slo is None else slo.session_s))
    return out


def answer_metrics(a: RecordArrays, intervals: bool, seed: int) -> dict[str, Any]:
    """The answer apart from the reasoning, where some request carried reasoning: `RunSummary`'s ttfa,
    ttfa_from_scheduled, answer_tpot and reasoning fields; none where no request did (the summary reads as
    it always did)."""
    has = a.has_reasoning
    if not has.any():
        return {}
    ok = a.is_ok
    out = a.output_tokens[ok].sum()
    reasoning = np.nan_to_num(a.reasoning_tokens[ok]).sum()
    sources = Counter(str(s) for s in a.reasoning_source[ok & has].tolist() if s)
    return {
        "ttfa": Dist.of(a.ttfa_s, intervals=intervals, seed=seed),
        "ttfa_from_scheduled": Dist.of(a.ttfa_from_scheduled_s, intervals=intervals, seed=seed),
        "answer_tpot": Dist.of(a.answer_tpot_s, intervals=intervals, seed=seed),
        "reasoning": {
            "num_reasoning": int((ok & has).sum()),
            "num_no_answer": int(a.no_answer.sum()),
            "reasoning_tokens": int(reasoning),
            "output_tokens": int(out),
            "reasoning_share": float(reasoning / out) if out else None,
            "counted_by": dict(sorted(sources.items())),  # "usage" (the server's count), "events" (counted)
        },
    }


def deliberate_waits(a: RecordArrays) -> dict[str, Any] | None:
    """Requests an in-flight cap, a closed loop's slots or --rate-limit held back on purpose (not the
    microseconds an uncontended acquire takes)."""
    waited = a.queued_s[a.queued_s > 1e-4]
    if not len(waited):
        return None
    return {"num": int(len(waited)), **quantiles(waited), "max": float(waited.max())}


def breakdown(a: RecordArrays, slo: SLO | None, keys: np.ndarray, label: str, ttft_s: np.ndarray, *,
              keep: Callable[[Any], bool] = bool, at_least: int = 1) -> list[Breakdown]:
    """Requests, failures, TTFT p50/p99 (of `ttft_s`, the caller's clock), TPOT p50 and attainment per
    distinct key of `keys` (aligned with `a`) that `keep` accepts; empty below `at_least` keys. The summary
    and the report's rate table both break fleets and classes down with it."""
    ids = sorted(k for k in dict.fromkeys(keys.tolist()) if keep(k))
    if len(ids) < at_least:
        return []
    met = slo.meets(a) if slo is not None else None
    tpot = a.tpot_s
    out = []
    for k in ids:
        sel = keys == k
        t = ttft_s[sel]
        q = quantiles(t[np.isfinite(t)])
        p = tpot[sel]
        p = p[np.isfinite(p)]
        out.append(Breakdown(label, k, int(sel.sum()), int(a.is_ok[sel].sum()), q.get("p50"), q.get("p99"),
                             float(np.median(p)) if len(p) else None,
                             float(met[sel].mean()) if met is not None else None))
    return out


def from_send(slo: SLO | None) -> bool:
    """Whether latencies are judged from the send (`clock=sent`) or, as without an SLO, from the scheduled
    arrival (no hiding): the one rule for every TTFT/E2E column, on records or on a summary."""
    return slo is not None and slo.clock == "sent"


def ttft_on_slo_clock(a: RecordArrays, slo: SLO | None) -> np.ndarray:
    """TTFT on the clock the SLO judges by (`from_send`). The terminal's and the report's per-replica and
    per-class columns both use it."""
    return a.ttft_s if from_send(slo) else a.ttft_from_scheduled_s


MAX_ERROR_KINDS = 10
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def error_kind(text: str) -> str:
    """The kind of an error, for counting: the text before its first colon (the detail after it varies per
    request), numbers replaced by N so "cut off after 3 tokens" and "after 7 tokens" are one kind, but an
    HTTP status kept whole ("HTTP 500", "HTTP 429 (rate limited, Retry-After 1)")."""
    head = text.split(":", 1)[0].strip()[:120]
    return head if head.startswith("HTTP ") else _DIGITS.sub("N", head)


def error_kinds(errors: Iterable[str]) -> dict[str, int]:
    """The most common error kinds and their counts, as the terminal and the report both show them."""
    kinds: Counter[str] = Counter()
    for text, count in Counter(errors).items():  # each distinct text parsed once (a million failures share a few)
        kinds[error_kind(text)] += count
    return dict(kinds.most_common(MAX_ERROR_KINDS))


MAX_EXAMPLE_CHARS = 200
# terminal escape sequences (CSI, OSC, two-byte ESC) and every other control character a server could send
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|[\x00-\x1f\x7f-\x9f]")


def error_example(text: str) -> str:
    """An error's own words for the terminal and the report: the detail after its kind (the server's message,
    which only requests.jsonl held), redacted, with terminal escape sequences and control characters taken
    out, at most MAX_EXAMPLE_CHARS. Escaping for HTML is the report's."""
    detail = text.split(":", 1)[1] if ":" in text else text
    clean = " ".join(_ESCAPES.sub(" ", redact_message(detail)).split())
    return clean if len(clean) <= MAX_EXAMPLE_CHARS else clean[: MAX_EXAMPLE_CHARS - 1] + "…"


def error_examples(errors: Sequence[str]) -> dict[str, str]:
    """The first message of each kind `error_kinds` counts, where it says more than the kind itself."""
    kinds = error_kinds(errors)
    out: dict[str, str] = {}
    for e in dict.fromkeys(errors):
        kind = error_kind(e)
        if kind in kinds and kind not in out:
            out[kind] = error_example(e)
    return {k: v for k, v in out.items() if v and v != k}


def per_replica(a: RecordArrays, slo: SLO | None) -> list[Breakdown]:
    """For a routed fleet: each replica's requests, failures, TTFT p50/p99 (from sent), TPOT p50 and
    attainment, so a hot spot (one replica holding the popular prefix, say) shows. Empty when no record
    names a replica."""
    return breakdown(a, slo, a.replica, "replica", ttft_on_slo_clock(a, slo), keep=lambda k: k >= 0)


def per_tag(a: RecordArrays, slo: SLO | None) -> list[Breakdown]:
    """The same per request class or phase (the records' tags), when a run has two or more: a mix where
    the long-document class misses while chat is fine reads as one number otherwise."""
    return breakdown(a, slo, a.tag, "tag", ttft_on_slo_clock(a, slo), at_least=2)


def several_tags(a: RecordArrays) -> bool:
    return len({t for t in a.tag.tolist() if t}) > 1


# A run whose last quarter of arrivals waited this many times longer for a first token than its first
# quarter (and at least DRIFT_MIN_S longer) was past capacity: its queue grew for as long as it ran.
DRIFT_RATIO = 2.0
DRIFT_MIN_S = 0.05


def queue_drift(a: RecordArrays) -> dict[str, Any] | None:
    """TTFT (from the schedule) of the first and last quarter of arrivals. When the last is over DRIFT_RATIO
    times the first, the server is past capacity at this rate: the queue grows for as long as the run
    lasts, so attainment here depends on the run's length as much as on the server (on the simulated chat
    engine: 0.97x at 20 req/s, 2.9x at 36, 6.6x at 40). Skipped for runs whose records carry several tags
    (phases change the load on purpose; classes could be either, so they are left alone too) and for
    fewer than 40 requests. A run whose completions fell clearly short of its arrivals is past capacity
    too, however short it was (slobench.analysis.past_capacity)."""
    t = a.ttft_from_scheduled_s
    if len(t) < 40 or several_tags(a):
        return None
    q = len(t) // 4
    first, last = t[:q][np.isfinite(t[:q])], t[-q:][np.isfinite(t[-q:])]
    if len(first) == 0 or len(last) == 0:
        return None
    f, l_ = float(np.median(first)), float(np.median(last))
    ratio = l_ / f if f > 0 else float("inf")
    counts = shortfall(completion_counts(a))
    drift = ratio > DRIFT_RATIO and l_ - f > DRIFT_MIN_S
    return {"ttft_p50_first_quarter_s": f, "ttft_p50_last_quarter_s": l_, "ratio": ratio, **counts,
            "overloaded": bool(drift or counts.get("completions_short"))}


# Served prompt lengths (usage.prompt_tokens) further than this from the asked ones at the median flag a run:
# text prompts on a server without a tokenizer given, or a chat template larger than guessed.
PROMPT_MISMATCH = 0.05


def length_fidelity(c: Columns) -> dict[str, Any] | None:
    """Asked against delivered lengths, over the measured requests (`c`) that completed, by one rule for
    records in memory and on disk, so the terminal and the HTML say the same.

    output: max_tokens asked vs tokens produced (p50/p99) and the share cut short, for servers that cannot
    be made to ignore EOS (produced < asked there is the model stopping, not a failure; TPOT uses produced
    tokens). prompt: input tokens asked vs the server's usage.prompt_tokens where reported, flagged past 5%
    at the median. usage_disagreements: completions whose usage count was not believed (below the number
    of streamed content events, or above max_tokens) or differs from what was counted."""
    v = c.values
    status = v["status"]
    done = np.asarray((status == "ok") | ~status.astype(bool), dtype=bool)
    max_tokens = np.trunc(np.nan_to_num(v["max_tokens"]))
    rs = done & (max_tokens > 0)
    if not rs.any():
        return None
    asked = max_tokens[rs]
    got = np.trunc(np.nan_to_num(v["output_tokens"][rs]))
    usage = v["usage_output_tokens"][rs]
    out: dict[str, Any] = {
        "output": {
            "num": int(rs.sum()),
            "requested_p50": float(np.median(asked)), "requested_p99": float(np.quantile(asked, 0.99)),
            "produced_p50": float(np.median(got)), "produced_p99": float(np.quantile(got, 0.99)),
            "share_cut_short": float(np.mean(got < asked)),
        },
        "usage_disagreements": int(np.count_nonzero(~np.isnan(usage) & (usage != got))),
    }
    want = np.trunc(np.nan_to_num(v["input_tokens"][rs]))
    served = v["prompt_tokens"][rs]
    pair = (want > 0) & ~np.isnan(served)
    if pair.any():
        want, served = want[pair], served[pair]
        rel = float(np.median(served / want - 1.0))
        out["prompt"] = {
            "num": int(pair.sum()), "requested_p50": float(np.median(want)), "served_p50": float(np.median(served)),
            "median_relative_difference": rel, "mismatch": bool(abs(rel) > PROMPT_MISMATCH),
        }
    return out


def prefix_cache(a: RecordArrays) -> dict[str, Any] | None:
    """How much of the prompts the server's prefix cache served, and TTFT with a hit against without.
    None when the server reported no cached-token counts (usage.prompt_tokens_details.cached_tokens)."""
    known = a.is_ok & np.isfinite(a.cached_tokens)
    if not known.any():
        return None
    cached = a.cached_tokens[known]
    prompt = a.prompt_tokens[known].astype(float)
    hit = cached > 0
    ttft = a.ttft_s[known]

    def p50(x: np.ndarray) -> float | None:
        x = x[np.isfinite(x)]
        return float(np.median(x)) if len(x) else None

    return {
        "num_reported": int(known.sum()),
        "num_hits": int(hit.sum()),
        "cached_token_share": float(cached.sum() / prompt.sum()) if prompt.sum() > 0 else 0.0,
        "ttft_p50_hit_s": p50(ttft[hit]),
        "ttft_p50_miss_s": p50(ttft[~hit]),
    }


def client_health(a: RecordArrays, slo: SLO | None) -> ClientHealth:
    late = a.lateness_s
    sent = late[~np.isnan(late)]
    q = quantiles(late)
    limit = lateness_limit_s(slo)
    lateness = {**q, "max": float(sent.max()) if len(sent) else None}
    share = float(np.mean(sent > limit)) if len(sent) else None
    if len(sent) < MIN_SENDS_FOR_VERDICT:
        note = (f"client: no verdict on the load generator from {len(sent)} sends (it takes >= "
                f"{MIN_SENDS_FOR_VERDICT}, so that one late send cannot decide it)") if len(sent) else None
        return ClientHealth(lateness, limit, False, None, num_sent=len(sent), late_share=share, note=note)
    offered = throughput(a).offered_rps
    achieved = achieved_send_rps(a)
    reasons = []
    if share is not None and share > LATE_SHARE_LIMIT:
        reasons.append(f"{share:.0%} of {len(sent)} sends later than {limit * 1e3:.0f} ms, p99 "
                       f"{(q.get('p99') or 0.0) * 1e3:.1f} ms")
    if np.isfinite(offered) and np.isfinite(achieved) and achieved < ACHIEVED_RATE_MIN_FRACTION * offered:
        reasons.append(f"sent {achieved:.1f} req/s of {offered:.1f} scheduled over {len(sent)} sends")
    return ClientHealth(
        lateness_s=lateness,
        lateness_limit_s=limit,
        is_bottleneck=bool(reasons),
        warning=(
            "CLIENT WAS THE BOTTLENECK (" + "; ".join(reasons) + "): these numbers describe the load "
            "generator, not the server. Lower the rate, give the client cores of its own and spread it over them "
            "(--client-workers N), or use a cap."
        )
        if reasons
        else None,
        num_sent=len(sent),
        late_share=share,
    )
