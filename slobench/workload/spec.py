"""The TOML workload spec (`WorkloadSpec`: every key, with an example, in its docstring), loading one by
name (the bundled specs: `slobench.workload.bundled`) or path, and `generate`: a spec, a run's shape and a
seed become requests."""

from __future__ import annotations

import math
import tomllib
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from slobench.errors import SpecError, UsageError
from slobench.input_file import SETTINGS, open_input
from slobench.run.records import RequestSpec, with_drawn_ids
from slobench.workload.arrivals import ArrivalProcess, PoissonArrivals, make_arrivals
from slobench.workload.base import APIS, AS_IT_IS, RunShape
from slobench.workload.bundled import bundled_workload, list_workloads
from slobench.workload.lengths import FixedLength, LengthDist, length_from_dict
from slobench.workload.phases import (
    Phase,
    RequestClass,
    boundaries,
    curve_from_dict,
    rescale,
    schedule_phases,
)
from slobench.workload.prompts import (
    DEFAULT_TOKEN_ID_RANGE,
    TokenPromptDraws,
    text_prompts,
    token_prompt_batches,
    token_prompt_heads,
)
from slobench.workload.ranges import MAX_NUM_REQUESTS, MAX_TOKEN_ID, check_count, check_duration_s
from slobench.workload.reasoning import ReasoningSpec
from slobench.workload.sessions import SessionSpec, SystemPrompts, build_requests

__all__ = ["WorkloadSpec", "generate", "load_workload", "phase_boundaries"]

PROMPT_KINDS = ("tokens", "text")
MIN_TOKENS_POLICIES = ("none", "max")

_TOP_KEYS = frozenset(
    {
        "name",
        "description",
        "api",
        "prompt",
        "num_requests",
        "duration_s",
        "ignore_eos",
        "min_tokens",
        "token_ids",
        "arrival",
        "input",
        "output",
        "class",
        "mix",
        "phase",
        "sessions",
        "system_prompts",
        "reasoning",
    }
)
_ARRIVAL_KEYS = frozenset({"process", "rate_rps", "cv"})
_PHASE_KEYS = frozenset({"name", "duration_s", "rate_rps", "arrival", "mix"})
DEFAULT_CLASS = "default"

T = TypeVar("T")


def _nested(prefix: str, build: Callable[[], T]) -> T:
    """Run `build`, re-raising a SpecError with its field put under `prefix` (`p99` -> `input.p99`)."""
    try:
        return build()
    except SpecError as e:
        raise SpecError(f"{prefix}.{e.field}", e.value, e.why) from None


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload: arrivals, lengths, prompts, and optionally classes, phases, sessions and shared system
    prompts. Its TOML file (every key but the length tables optional; unknown keys are errors so typos
    surface):

        name = "chat"                  # default: the file's stem; used as the requests' tag
        description = "..."
        api = "completions"            # or "chat" (chat always sends text prompts)
        prompt = "tokens"              # or "text"
        num_requests = 1000            # default bounds; --num-requests / --duration replace both
        duration_s = 60.0
        ignore_eos = true
        min_tokens = "none"            # or "max": send min_tokens = max_tokens, for servers without ignore_eos
        token_ids = [1000, 30000]      # half-open id range for token prompts

        [arrival]                      # default: poisson at 1 req/s
        process = "gamma"              # poisson | gamma | constant
        rate_rps = 5.0
        cv = 2.0                       # gamma only; vLLM's burstiness = 1/cv²

        [input]                        # and [output]: see slobench.workload.lengths
        dist = "lognormal"
        median = 1020
        p99 = 4142
        min = 1
        max = 8192

    Traffic that changes over the run (see slobench.workload.phases and .sessions; all optional):

        [arrival]                      # also: a rate curve, non-homogeneous Poisson by thinning
        process = "diurnal"            # rate_rps (mean), peak_to_trough, period_s[, peak_s]
                                       # or process = "curve", points = [[t_s, rate_rps], ...]
        [class.doc]                    # request classes, each its own lengths (default: [input]/[output])
        input = {dist = "lognormal", median = 5000, p99 = 7800}
        output = {dist = "lognormal", median = 48, p99 = 200}
        mix = {doc = 3, chat = 1}      # class weights for a run without phases

        [[phase]]                      # segments run one after another; requests are tagged "phase/class"
        name = "morning"
        duration_s = 60
        rate_rps = 4.0                 # Poisson shorthand, or an arrival = {process = ..., ...} table
        mix = {doc = 3, chat = 1}      # default: the top-level mix, else the top-level [input]/[output]

        [sessions]                     # multi-turn: each arrival starts a conversation
        turns = {dist = "uniform", min = 2, max = 6}
        think = {dist = "exponential", mean_s = 8.0}
        response_s_per_token = 0.02    # next turn = previous scheduled arrival + output·this + think
        max_context_tokens = 8192

        [system_prompts]               # shared prefixes: Zipf popularity over groups
        num_groups = 8
        tokens = 1024                  # or one length per group
        zipf_s = 1.1

        [reasoning]                    # a reasoning model's answers: this share of each is reasoning
        share = 0.6                    # (slobench.workload.reasoning)
    """

    name: str
    input: LengthDist
    output: LengthDist
    arrival: ArrivalProcess = field(default_factory=lambda: PoissonArrivals(1.0))
    description: str = ""
    api: str = "completions"
    prompt: str = "tokens"
    num_requests: int | None = None
    duration_s: float | None = None
    ignore_eos: bool = True
    min_tokens: str = "none"
    token_ids: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE
    classes: tuple[RequestClass, ...] = ()
    mix: tuple[tuple[str, float], ...] = ()
    phases: tuple[Phase, ...] = ()
    sessions: SessionSpec | None = None
    system_prompts: SystemPrompts | None = None
    reasoning: ReasoningSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError("name", self.name, "must be a non-empty string")
        if not isinstance(self.description, str):
            raise SpecError("description", self.description, "must be a string")
        for key in ("input", "output"):
            if not hasattr(getattr(self, key), "sample"):
                raise SpecError(key, getattr(self, key), "must be a length distribution")
        if not hasattr(self.arrival, "schedule"):
            raise SpecError("arrival", self.arrival, "must be an arrival process")
        if self.api not in APIS:
            raise SpecError("api", self.api, f"must be one of {list(APIS)}")
        if self.prompt not in PROMPT_KINDS:
            raise SpecError("prompt", self.prompt, f"must be one of {list(PROMPT_KINDS)}")
        if self.api == "chat" and self.prompt == "tokens":
            raise SpecError("prompt", self.prompt, 'the chat API takes text; use prompt = "text"')
        if self.num_requests is not None:
            check_count("num_requests", self.num_requests, MAX_NUM_REQUESTS)
        if self.duration_s is not None:
            check_duration_s("duration_s", self.duration_s)
        if not isinstance(self.ignore_eos, bool):
            raise SpecError("ignore_eos", self.ignore_eos, "must be true or false")
        if self.min_tokens not in MIN_TOKENS_POLICIES:
            raise SpecError("min_tokens", self.min_tokens, f"must be one of {list(MIN_TOKENS_POLICIES)}")
        ids = self.token_ids
        if not (
            isinstance(ids, tuple) and len(ids) == 2 and all(_is_int(x) for x in ids)
            and 0 <= ids[0] < ids[1] <= MAX_TOKEN_ID
        ):
            raise SpecError("token_ids", list(ids) if isinstance(ids, tuple) else ids,
                            f"must be [lo, hi] integers with 0 <= lo < hi <= {MAX_TOKEN_ID} (hi excluded)")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise SpecError("class", names, "class names must be unique")
        known = set(names) | {DEFAULT_CLASS}
        for where, mix in [("mix", self.mix)] + [(f"phase.{p.name}.mix", p.mix) for p in self.phases]:
            for cls_name, _ in mix:
                if cls_name not in known:
                    raise SpecError(where, cls_name, f"names no class; defined: {sorted(known)}")
        if self.mix:
            Phase("check", 1.0, self.arrival, self.mix)  # the same weight checks as a phase's
        if len({p.name for p in self.phases}) != len(self.phases):
            raise SpecError("phase", [p.name for p in self.phases], "phase names must be unique")

    @property
    def is_structured(self) -> bool:
        """True when the spec uses classes, phases, sessions, system prompts or reasoning (the newer generator)."""
        return bool(self.classes or self.mix or self.phases or self.sessions or self.system_prompts or self.reasoning)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadSpec:
        for key in d:
            if key not in _TOP_KEYS:
                raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(_TOP_KEYS)}")
        if "name" not in d:
            raise SpecError("name", None, "missing")
        tables = {"arrival", "input", "output", "class", "mix", "phase", "sessions", "system_prompts", "reasoning"}
        kwargs: dict[str, Any] = {k: d[k] for k in _TOP_KEYS - tables if k in d}
        if "token_ids" in kwargs:
            ids = kwargs["token_ids"]
            kwargs["token_ids"] = tuple(ids) if isinstance(ids, list | tuple) else ids
        classes = _nested("class", lambda: _classes_from_dict(d.get("class", {}), d))
        kwargs["classes"] = classes
        for key in ("input", "output"):
            table = d.get(key)
            if table is None and classes:  # every class has its own: the first one stands in
                kwargs[key] = getattr(classes[0], key)
                continue
            if not isinstance(table, Mapping):
                raise SpecError(key, table, 'missing or not a table; e.g. dist = "lognormal", median, p99')
            kwargs[key] = _nested(key, lambda t=table: length_from_dict(t))  # type: ignore[misc]
        if "arrival" in d:
            kwargs["arrival"] = _nested("arrival", lambda: _arrival_from_dict(d["arrival"]))
        if "mix" in d:
            kwargs["mix"] = _nested("mix", lambda: _mix_from_dict(d["mix"]))
        if "phase" in d:
            phases = d["phase"]
            if not isinstance(phases, list) or not phases:
                raise SpecError("phase", phases, "must be an array of tables ([[phase]])")
            kwargs["phases"] = tuple(
                _nested(f"phase[{i}]", lambda p=p: _phase_from_dict(p))  # type: ignore[misc]
                for i, p in enumerate(phases)
            )
        if "sessions" in d:
            kwargs["sessions"] = _nested("sessions", lambda: SessionSpec.from_dict(_table(d["sessions"])))
        if "system_prompts" in d:
            kwargs["system_prompts"] = _nested(
                "system_prompts", lambda: SystemPrompts.from_dict(_table(d["system_prompts"]))
            )
        if "reasoning" in d:
            kwargs["reasoning"] = _nested("reasoning", lambda: ReasoningSpec.from_dict(_table(d["reasoning"])))
        return cls(**kwargs)

    @classmethod
    def from_toml(cls, path: str | Path) -> WorkloadSpec:
        path = Path(path)
        try:
            with open_input(path, SETTINGS) as fh:  # a regular file within its cap
                d = tomllib.load(fh)
        except FileNotFoundError:
            raise UsageError(f"{path}: workload file not found") from None
        except IsADirectoryError:
            raise UsageError(f"{path}: is a directory, not a workload file") from None
        except OSError as e:
            raise UsageError(f"{path}: cannot read the workload file ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not a text file (not UTF-8): not a workload TOML") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: not valid TOML ({e})") from None
        except RecursionError:  # the standard library's reader recurses once per nested array or table
            raise UsageError(f"{path}: arrays or inline tables nested too deeply to read (a workload needs "
                             "two levels)") from None
        d.setdefault("name", path.stem)
        try:
            return cls.from_dict(d)
        except SpecError as e:
            err = SpecError(e.field, e.value, e.why)
            err.args = (f"{path}: {e.args[0]}",)  # name the file; field/value/why stay as they were
            raise err from None

    def to_dict(self) -> dict[str, Any]:
        """A plain dict that `from_dict` reads back to an equal spec; None values are left out (TOML has no null)."""
        d: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "api": self.api,
            "prompt": self.prompt,
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "token_ids": list(self.token_ids),
            "arrival": self.arrival.to_dict(),
            "input": self.input.to_dict(),
            "output": self.output.to_dict(),
        }
        if self.classes:
            d["class"] = {c.name: c.to_dict() for c in self.classes}
        if self.mix:
            d["mix"] = dict(self.mix)
        if self.phases:
            d["phase"] = [p.to_dict() for p in self.phases]
        if self.sessions is not None:
            d["sessions"] = self.sessions.to_dict()
        if self.system_prompts is not None:
            d["system_prompts"] = self.system_prompts.to_dict()
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning.to_dict()
        return {k: v for k, v in d.items() if v is not None}

    def specs(self, shape: RunShape = AS_IT_IS) -> list[RequestSpec]:
        """The requests of one run of this shape (the `Workload` protocol's one call).

        Arrivals, input lengths, output lengths and prompts each draw from their own stream spawned from the
        seed, so a sweep that changes only the rate keeps every request's lengths (common random numbers)
        and scales its arrival times, and the first k requests are the same whatever the total. Prompt
        content also depends on the workload name and rate, so runs of a sweep never share prompt prefixes
        (see `_salted`); replicate runs at one rate should use different seeds for the same reason."""
        if self.is_structured:
            return _generate_structured(self, shape)
        return _generate_flat(self, shape)

    def stream_specs(self, shape: RunShape = AS_IT_IS) -> Iterable[RequestSpec]:
        """The same requests as `specs`, a flat workload's made as they are taken (`FlatSpecs`), so a long
        simulated run does not hold every prompt at once; a structured workload's as a list."""
        if self.is_structured:
            return _generate_structured(self, shape)
        return FlatSpecs(self, shape)

    def __str__(self) -> str:
        if self.phases:
            segs = ", ".join(f"{p.name} {p.duration_s:g}s {p.arrival}" for p in self.phases)
            head = f"{self.name}: phases [{segs}], classes {[c.name for c in self.classes]}"
        elif self.classes:
            head = f"{self.name}: {self.arrival}, classes {[c.name for c in self.classes]}"
        else:
            head = f"{self.name}: {self.arrival}, input {self.input}, output {self.output}"
        extra = "".join([
            f", sessions of {self.sessions.turns} turns" if self.sessions else "",
            f", {self.system_prompts.num_groups} system prompts" if self.system_prompts else "",
            f", {self.reasoning.share:.0%} of each answer reasoning" if self.reasoning else "",
        ])
        return f"{head}{extra}, {self.api}/{self.prompt}"


def _arrival_from_dict(d: object) -> ArrivalProcess:
    if not isinstance(d, Mapping):
        raise SpecError("process", d, "[arrival] must be a table")
    if d.get("process") in ("diurnal", "curve"):
        return curve_from_dict(d)
    for key in d:
        if key not in _ARRIVAL_KEYS:
            raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(_ARRIVAL_KEYS)}")
    return make_arrivals(d.get("process", "poisson"), d.get("rate_rps", 1.0), d.get("cv"))


def _table(d: object) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise SpecError("table", d, "must be a table")
    return d


def _classes_from_dict(d: object, top: Mapping[str, Any]) -> tuple[RequestClass, ...]:
    out = []
    for name, table in _table(d).items():
        t = _table(table)
        for key in t:
            if key not in ("input", "output"):
                raise SpecError(f"{name}.{key}", t[key], "unknown key; a class has input and output")
        lengths = {}
        for key in ("input", "output"):
            src = t.get(key, top.get(key))
            if not isinstance(src, Mapping):
                raise SpecError(f"{name}.{key}", src, "missing (and no top-level table to inherit)")
            lengths[key] = _nested(f"{name}.{key}", lambda s=src: length_from_dict(s))  # type: ignore[misc]
        out.append(RequestClass(str(name), lengths["input"], lengths["output"]))
    return tuple(out)


def _mix_from_dict(d: object) -> tuple[tuple[str, float], ...]:
    mix = tuple((str(k), v) for k, v in _table(d).items())
    if not mix:
        raise SpecError("mix", d, "must name at least one class")
    return mix


def _phase_from_dict(d: object) -> Phase:
    t = _table(d)
    for key in t:
        if key not in _PHASE_KEYS:
            raise SpecError(str(key), t[key], f"unknown key; allowed: {sorted(_PHASE_KEYS)}")
    for key in ("name", "duration_s"):
        if key not in t:
            raise SpecError(key, None, "every phase needs a name and a duration_s")
    if ("rate_rps" in t) == ("arrival" in t):
        raise SpecError("rate_rps", t.get("rate_rps"), "give either rate_rps (Poisson) or an arrival table")
    if "arrival" in t:
        arrival = _nested("arrival", lambda: _arrival_from_dict(t["arrival"]))
    else:
        arrival = make_arrivals("poisson", t["rate_rps"])
    mix = _nested("mix", lambda: _mix_from_dict(t["mix"])) if "mix" in t else ()
    return Phase(t["name"], t["duration_s"], arrival, mix)


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """A bundled workload by name (`chat`), or a spec file by path (anything ending in .toml or containing a /)."""
    s = str(name_or_path)
    path = Path(s)
    if isinstance(name_or_path, Path) or s.endswith(".toml") or "/" in s or "\\" in s:
        return WorkloadSpec.from_toml(path)
    bundled = bundled_workload(s)
    if bundled is None:
        raise SpecError(
            "workload", s, f"unknown workload; available: {', '.join(list_workloads()) or 'none'}"
        )
    return WorkloadSpec.from_toml(bundled)


def _salted(ss: np.random.SeedSequence, name: str, rate_rps: float) -> np.random.SeedSequence:
    """The prompt stream, made distinct per workload name and rate.

    Lengths are common across a sweep on purpose, but prompt *content* must not be: a sweep sends its
    runs to one server, and run k repeating run k-1's token ids would hit the server's prefix cache and
    flatter every TTFT after the first rate. Same seed, name and rate still give the same prompts.
    """
    rate_bits = int(np.float64(rate_rps).view(np.uint64))
    key = (zlib.crc32(name.encode()), rate_bits & 0xFFFFFFFF, rate_bits >> 32)
    return np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, *key))


def generate(spec: WorkloadSpec, **shape: Any) -> list[RequestSpec]:
    """`spec.specs(RunShape(**shape))`: the requests of one run, the shape's fields given by keyword."""
    return spec.specs(RunShape(**shape))


def _generate_flat(spec: WorkloadSpec, shape: RunShape) -> list[RequestSpec]:
    plan = FlatSpecs(spec, shape)
    if plan.kind == "tokens":
        return list(plan)
    return _generate_text(plan)


class FlatSpecs(Iterable[RequestSpec]):
    """A flat workload's requests (no classes, phases, sessions or system prompts), made as they are taken:
    the arrival times and lengths are drawn at once (a few MB at 100k), each token-id prompt when its
    request is (`token_prompt_batches`: 100k chat prompts held at once are ~0.9 GB). Iterating again gives
    the same requests; `prompt_heads` is a cheap pass over each prompt's first ids."""

    def __init__(self, spec: WorkloadSpec, shape: RunShape) -> None:
        rate_rps, num_requests, duration_s = shape.rate_rps, shape.num_requests, shape.duration_s
        arrival = spec.arrival if rate_rps is None else spec.arrival.with_rate(rate_rps)
        if num_requests is None and duration_s is None:
            num_requests, duration_s = spec.num_requests, spec.duration_s
        if num_requests is None and duration_s is None:
            raise SpecError(
                "num_requests", None, f"workload {spec.name!r} sets no bound; give num_requests or duration_s"
            )
        in_dist = spec.input if shape.input_len is None else FixedLength(int(shape.input_len))
        out_dist = spec.output if shape.output_len is None else FixedLength(int(shape.output_len))
        api = spec.api if shape.api is None else shape.api
        self.kind = "text" if api == "chat" else spec.prompt
        s_arrival, s_input, s_output, s_prompt = np.random.SeedSequence(shape.seed).spawn(4)
        self.prompt_seed = _salted(s_prompt, spec.name, arrival.rate_rps)
        self.arrival_s = arrival.schedule(
            np.random.default_rng(s_arrival), num_requests=num_requests, duration_s=duration_s
        )
        n = len(self.arrival_s)
        self.input_tokens = in_dist.sample(n, np.random.default_rng(s_input))
        self.output_tokens = out_dist.sample(n, np.random.default_rng(s_output))
        self.name = spec.name
        self.pin = spec.min_tokens == "max"
        self.ignore_eos = spec.ignore_eos
        self.id_range = (int(spec.token_ids[0]), int(spec.token_ids[1]))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def spec(self, i: int, prompt: str | tuple[int, ...]) -> RequestSpec:
        n_out = int(self.output_tokens[i])
        return RequestSpec(request_id=i, arrival_s=float(self.arrival_s[i]), prompt=prompt,
                           input_tokens=int(self.input_tokens[i]), max_tokens=n_out,
                           min_tokens=n_out if self.pin else None, ignore_eos=self.ignore_eos, tag=self.name)

    def __iter__(self) -> Iterator[RequestSpec]:
        if self.kind != "tokens":
            yield from _generate_text(self)
            return
        batches = token_prompt_batches(self.input_tokens, np.random.default_rng(self.prompt_seed),
                                       id_range=self.id_range)
        i = 0
        for batch in batches:
            for p in batch:
                # every id drawn from the checked range (token_prompts): said here, once a request
                yield with_drawn_ids(self.spec(i, p), self.id_range)
                i += 1

    def prompt_draws(self) -> TokenPromptDraws | None:
        """The token-id prompts as `TokenPromptDraws` (each drawn again on demand); None for text prompts."""
        if self.kind != "tokens":
            return None
        return TokenPromptDraws(self.input_tokens, np.random.default_rng(self.prompt_seed), id_range=self.id_range)

    def with_prompts(self, prompts: Iterable[tuple[int, ...]]) -> Iterator[RequestSpec]:
        """The requests in order, each with the next of `prompts` in place of its own (a simulator's
        stand-ins, of the same lengths, for prompts nothing will read)."""
        for i, p in enumerate(prompts):
            yield with_drawn_ids(self.spec(i, p), self.id_range)

    def prompt_heads(self, num_tokens: int) -> Iterator[bytes | None]:
        """Each token-id prompt's first `num_tokens` ids as bytes (None when shorter), in request order."""
        return token_prompt_heads(self.input_tokens, np.random.default_rng(self.prompt_seed), num_tokens,
                                  id_range=self.id_range)


def _generate_text(plan: FlatSpecs) -> list[RequestSpec]:
    prompts = text_prompts(plan.input_tokens, np.random.default_rng(plan.prompt_seed))
    return [plan.spec(i, p) for i, p in enumerate(prompts)]


def _effective_phases(spec: WorkloadSpec, rate_rps: float | None, duration_s: float | None) -> tuple[Phase, ...]:
    """The spec's phases with their mixes resolved; a spec without phases is one phase named after it."""
    default_mix = spec.mix or ((DEFAULT_CLASS, 1.0),)
    if spec.phases:
        phases = tuple(Phase(p.name, p.duration_s, p.arrival, p.mix or default_mix) for p in spec.phases)
        return phases if rate_rps is None else rescale(phases, rate_rps)
    arrival = spec.arrival if rate_rps is None else spec.arrival.with_rate(rate_rps)
    return (Phase(spec.name, math.inf if duration_s is None else duration_s, arrival, default_mix),)


def phase_boundaries(spec: object, *, duration_s: float | None = None) -> list[dict[str, Any]]:
    """[{name, start_s}, ...] of a phased spec in run seconds (what the manifest's `phases` holds and the
    report's timeline marks); empty for a spec without phases, or anything that is not a WorkloadSpec
    (a trace replay). `duration_s` cuts like generate's."""
    if not isinstance(spec, WorkloadSpec) or not spec.phases:
        return []
    return boundaries(spec.phases, duration_s if duration_s is not None else spec.duration_s)


def _generate_structured(spec: WorkloadSpec, shape: RunShape) -> list[RequestSpec]:
    rate_rps, num_requests, duration_s = shape.rate_rps, shape.num_requests, shape.duration_s
    input_len, output_len = shape.input_len, shape.output_len
    if num_requests is None and duration_s is None:
        num_requests, duration_s = spec.num_requests, spec.duration_s
    if num_requests is None and duration_s is None and not spec.phases:
        raise SpecError(
            "num_requests", None, f"workload {spec.name!r} sets no bound; give num_requests or duration_s"
        )
    api = spec.api if shape.api is None else shape.api
    classes = (*spec.classes, RequestClass(DEFAULT_CLASS, spec.input, spec.output))
    if input_len is not None or output_len is not None:
        classes = tuple(
            RequestClass(
                c.name,
                c.input if input_len is None else FixedLength(int(input_len)),
                c.output if output_len is None else FixedLength(int(output_len)),
            )
            for c in classes
        )
    phases = _effective_phases(spec, rate_rps, duration_s)
    s_sched, s_build, s_prompt = np.random.SeedSequence(shape.seed).spawn(3)
    # The salt needs one number per rate: the mean offered rate after any rescaling.
    mean_rps = sum(p.arrival.rate_rps for p in phases) / len(phases)
    s_prompt = _salted(s_prompt, spec.name, mean_rps)
    sched = schedule_phases(phases, classes, s_sched, num_requests=num_requests, duration_s=duration_s)
    if not spec.phases and not spec.classes and not spec.mix:
        sched = replace(sched, tags=[spec.name] * len(sched.tags))
    return build_requests(
        sched, classes, sessions=spec.sessions, system_prompts=spec.system_prompts, ss=s_build,
        ss_prompt=s_prompt, is_text=api == "chat" or spec.prompt == "text", id_range=spec.token_ids,
        num_requests=num_requests, duration_s=duration_s, ignore_eos=spec.ignore_eos,
        pin_min_tokens=spec.min_tokens == "max", reasoning=spec.reasoning,
    )
