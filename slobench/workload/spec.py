"""The TOML workload spec, the bundled `workloads/`, and `generate`: a spec and a seed become requests.

A spec file (every key but the length tables optional; unknown keys are errors so typos surface):

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
"""

from __future__ import annotations

import math
import tomllib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from slobench.errors import SpecError, UsageError
from slobench.records import RequestSpec
from slobench.workload.arrivals import ArrivalProcess, PoissonArrivals, make_arrivals
from slobench.workload.lengths import FixedLength, LengthDist, length_from_dict
from slobench.workload.prompts import DEFAULT_TOKEN_ID_RANGE, text_prompts, token_prompts

__all__ = ["WORKLOADS_DIR", "WorkloadSpec", "generate", "list_workloads", "load_workload"]

# The package is installed editable, so the repo's workloads/ sits two levels above this package.
WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "workloads"

APIS = ("completions", "chat")
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
    }
)
_ARRIVAL_KEYS = frozenset({"process", "rate_rps", "cv"})

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
        if self.num_requests is not None and (not _is_int(self.num_requests) or self.num_requests < 1):
            raise SpecError("num_requests", self.num_requests, "must be an integer >= 1")
        if self.duration_s is not None and (
            isinstance(self.duration_s, bool)
            or not isinstance(self.duration_s, int | float)
            or not (math.isfinite(self.duration_s) and self.duration_s > 0)
        ):
            raise SpecError("duration_s", self.duration_s, "must be a finite number > 0")
        if not isinstance(self.ignore_eos, bool):
            raise SpecError("ignore_eos", self.ignore_eos, "must be true or false")
        if self.min_tokens not in MIN_TOKENS_POLICIES:
            raise SpecError("min_tokens", self.min_tokens, f"must be one of {list(MIN_TOKENS_POLICIES)}")
        ids = self.token_ids
        if not (
            isinstance(ids, tuple) and len(ids) == 2 and all(_is_int(x) for x in ids) and 0 <= ids[0] < ids[1]
        ):
            raise SpecError("token_ids", ids, "must be [lo, hi] integers with 0 <= lo < hi (hi excluded)")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadSpec:
        for key in d:
            if key not in _TOP_KEYS:
                raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(_TOP_KEYS)}")
        if "name" not in d:
            raise SpecError("name", None, "missing")
        kwargs: dict[str, Any] = {k: d[k] for k in _TOP_KEYS - {"arrival", "input", "output"} if k in d}
        if "token_ids" in kwargs:
            ids = kwargs["token_ids"]
            kwargs["token_ids"] = tuple(ids) if isinstance(ids, list | tuple) else ids
        for key in ("input", "output"):
            table = d.get(key)
            if not isinstance(table, Mapping):
                raise SpecError(key, table, 'missing or not a table; e.g. dist = "lognormal", median, p99')
            kwargs[key] = _nested(key, lambda t=table: length_from_dict(t))  # type: ignore[misc]
        if "arrival" in d:
            kwargs["arrival"] = _nested("arrival", lambda: _arrival_from_dict(d["arrival"]))
        return cls(**kwargs)

    @classmethod
    def from_toml(cls, path: str | Path) -> WorkloadSpec:
        path = Path(path)
        try:
            with open(path, "rb") as fh:
                d = tomllib.load(fh)
        except FileNotFoundError:
            raise UsageError(f"{path}: workload file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: not valid TOML ({e})") from None
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
        return {k: v for k, v in d.items() if v is not None}

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.arrival}, input {self.input}, output {self.output}, {self.api}/{self.prompt}"
        )


def _arrival_from_dict(d: object) -> ArrivalProcess:
    if not isinstance(d, Mapping):
        raise SpecError("process", d, "[arrival] must be a table")
    for key in d:
        if key not in _ARRIVAL_KEYS:
            raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(_ARRIVAL_KEYS)}")
    return make_arrivals(d.get("process", "poisson"), d.get("rate_rps", 1.0), d.get("cv"))


def list_workloads() -> list[str]:
    """Names of the bundled workloads."""
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.toml"))


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """A bundled workload by name (`chat`), or a spec file by path (anything ending in .toml or containing a /)."""
    s = str(name_or_path)
    path = Path(s)
    if isinstance(name_or_path, Path) or s.endswith(".toml") or "/" in s or "\\" in s:
        return WorkloadSpec.from_toml(path)
    bundled = WORKLOADS_DIR / f"{s}.toml"
    if not bundled.is_file():
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


def _fixed(name: str, value: int) -> FixedLength:
    if not _is_int(value) or value < 1:
        raise SpecError(name, value, "must be an integer >= 1")
    return FixedLength(int(value))


def generate(
    spec: WorkloadSpec,
    *,
    rate_rps: float | None = None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    input_len: int | None = None,
    output_len: int | None = None,
    api: str | None = None,
) -> list[RequestSpec]:
    """The requests of one run. Arguments given here win over the spec; `input_len` / `output_len` force
    fixed lengths. Giving either bound (num_requests, duration_s) replaces both of the spec's.

    Arrivals, input lengths, output lengths and prompts each draw from their own stream spawned from
    `seed`, so a sweep that changes only the rate keeps every request's lengths (common random numbers)
    and scales its arrival times, and the first k requests are the same whatever the total. Prompt
    content also depends on the workload name and rate, so runs of a sweep never share prompt prefixes
    (see `_salted`); replicate runs at one rate should use different seeds for the same reason.
    """
    if not _is_int(seed) or seed < 0:
        raise SpecError("seed", seed, "must be an integer >= 0")
    arrival = spec.arrival if rate_rps is None else spec.arrival.with_rate(rate_rps)
    if num_requests is None and duration_s is None:
        num_requests, duration_s = spec.num_requests, spec.duration_s
    if num_requests is None and duration_s is None:
        raise SpecError(
            "num_requests", None, f"workload {spec.name!r} sets no bound; give num_requests or duration_s"
        )
    in_dist = spec.input if input_len is None else _fixed("input_len", input_len)
    out_dist = spec.output if output_len is None else _fixed("output_len", output_len)
    api = spec.api if api is None else api
    if api not in APIS:
        raise SpecError("api", api, f"must be one of {list(APIS)}")
    kind = "text" if api == "chat" else spec.prompt

    s_arrival, s_input, s_output, s_prompt = np.random.SeedSequence(seed).spawn(4)
    s_prompt = _salted(s_prompt, spec.name, arrival.rate_rps)
    times = arrival.schedule(
        np.random.default_rng(s_arrival), num_requests=num_requests, duration_s=duration_s
    )
    n = len(times)
    ins = in_dist.sample(n, np.random.default_rng(s_input))
    outs = out_dist.sample(n, np.random.default_rng(s_output))
    prompt_rng = np.random.default_rng(s_prompt)
    prompts: Sequence[str | tuple[int, ...]]
    if kind == "tokens":
        prompts = cast(
            Sequence[str | tuple[int, ...]], token_prompts(ins, prompt_rng, id_range=spec.token_ids)
        )
    else:
        prompts = cast(Sequence[str | tuple[int, ...]], text_prompts(ins, prompt_rng))
    pin = spec.min_tokens == "max"
    return [
        RequestSpec(
            request_id=i,
            arrival_s=t,
            prompt=p,
            input_tokens=n_in,
            max_tokens=n_out,
            min_tokens=n_out if pin else None,
            ignore_eos=spec.ignore_eos,
            tag=spec.name,
        )
        for i, (t, p, n_in, n_out) in enumerate(
            zip(times.tolist(), prompts, ins.tolist(), outs.tolist(), strict=True)
        )
    ]
