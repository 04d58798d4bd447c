"""What the user asked of the target, as values: `TargetOptions` and the `Timeouts` inside it.

`slobench.targets.build` chooses and makes the target from them; an `OpenAITarget` takes them beside the
one URL it loads, and client worker processes and Ray actors receive them as they are (they pickle). The
API key never travels in them: only the name of the environment variable that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from slobench.errors import SpecError, UsageError
from slobench.targets.bounds import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_METRICS_BODY_BYTES

DEFAULT_URL = "http://127.0.0.1:8000/v1"
Api = Literal["completions", "chat", "responses"]


def prompt_api(api: Api) -> Api:
    """The API whose prompts a request is made and parsed for: a Responses request's prompt is text, as a
    chat request's, so its workload is generated, and the simulated engine parses it, as chat's."""
    return "chat" if api == "responses" else api

TransportName = Literal["raw", "httpx"]  # raw: slobench.targets.rawhttp; httpx: HTTP/2 where asked
TRANSPORTS: tuple[TransportName, ...] = ("raw", "httpx")
# Body fields slobench sets from its own flags and the workload: an --extra-body that replaced one would send
# requests the title, manifest and summary do not describe (another model, no stream to time), so it is
# refused, naming what sets the field instead.
SET_BY_SLOBENCH = {
    "model": "--model",
    "stream": "--no-stream",
    "stream_options": "slobench (it asks for usage on streams the server supports it on)",
    "prompt": "the workload (--workload, --trace, --input-len)",
    "messages": "the workload (--workload, --trace, --input-len)",
    "max_tokens": "the workload's output lengths (--output-len)",
    "max_completion_tokens": "the workload's output lengths (--output-len, sent as max_tokens)",
    "min_tokens": "the workload's min_tokens",
    "ignore_eos": "the workload's ignore_eos",
}
# Body fields slobench sets to a default that a benchmark may legitimately change: replaced, said before the
# run and recorded in the manifest (`target.extra_body_overrides`).
OVERRIDABLE = {"temperature": 0}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long slobench waits, in seconds: a load request in total (`request_s`), the set-up of a load
    connection (`connect_s`), and each setup request in total (`preflight_s`: model discovery, preflight
    and its probes)."""

    request_s: float = 600.0
    connect_s: float = 10.0
    preflight_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("request_s", "connect_s", "preflight_s"):
            value = getattr(self, name)
            if not value > 0:
                raise SpecError(name, value, "must be > 0 seconds")


@dataclass(frozen=True, slots=True)
class TargetOptions:
    """Which target to load and how to talk to it: the CLI's target flags as one value, checked when made."""

    urls: tuple[str, ...] = (DEFAULT_URL,)
    model: str | None = None  # None: the first model the server lists, found at preflight
    api: Api = "completions"
    stream: bool = True
    api_key_env: str | None = "OPENAI_API_KEY"  # None: no key
    headers: Mapping[str, str] = field(default_factory=dict)
    extra_body: Mapping[str, Any] | None = None
    timeouts: Timeouts = Timeouts()
    transport: TransportName = "raw"
    http2: bool = False
    server_profile: str = "auto"
    tokenizer: str | None = None
    client_workers: int = 1
    ray: str | None = None  # a Ray address ("local": start one here); None: no Ray
    router: str = "least-outstanding"  # several URLs: how requests are spread
    engine_knobs: Mapping[str, Any] | None = None  # the in-process reference engine instead of a URL
    # the half-open range the workload draws prompt token ids from: preflight probes its top id (None: the
    # workloads' default range)
    token_ids: tuple[int, int] | None = None
    # the most a server may send in one body (an error, a whole answer, a /models listing), one SSE line
    # or event, decompressed; and in one /metrics page (slobench.targets.bounds)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_metrics_body_bytes: int = DEFAULT_MAX_METRICS_BODY_BYTES

    def __post_init__(self) -> None:
        if self.engine_knobs is None and not self.urls:
            raise UsageError("--url: no URL given")
        if self.client_workers < 1:
            raise UsageError(f"--client-workers must be >= 1 (got {self.client_workers})")
        if self.api not in ("completions", "chat", "responses"):
            raise SpecError("api", self.api, "must be 'completions', 'chat' or 'responses'")
        if self.transport not in TRANSPORTS:
            raise SpecError("transport", self.transport, "must be 'raw' or 'httpx'")
        if self.http2 and self.transport != "httpx":
            raise SpecError("http2", self.http2, "needs transport='httpx' (raw speaks HTTP/1.1 only)")
        for name in ("max_body_bytes", "max_metrics_body_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise SpecError(name, value, "must be a whole number of bytes >= 1")
        if self.model is not None and not self.model:
            raise SpecError("model", self.model, "must name the served model (or be None: the first one listed)")
        if self.extra_body is not None:
            check_extra_body(self.extra_body)
        if self.token_ids is not None and not 0 <= self.token_ids[0] < self.token_ids[1]:
            raise SpecError("token_ids", self.token_ids, "must be [lo, hi) with 0 <= lo < hi")

    @property
    def extra_body_overrides(self) -> tuple[str, ...]:
        """The defaults slobench sends that --extra-body replaces (e.g. temperature), sorted."""
        return tuple(sorted(k for k in self.extra_body or {} if k in OVERRIDABLE))


def check_extra_body(extra: Mapping[str, Any]) -> None:
    """--extra-body adds fields; it may not replace one that slobench sets (SET_BY_SLOBENCH)."""
    if not isinstance(extra, Mapping):
        raise UsageError(f"--extra-body: expected a JSON object (got {extra!r})")
    for key in extra:
        if key in SET_BY_SLOBENCH:
            raise UsageError(f"--extra-body: {key!r} is set by {SET_BY_SLOBENCH[key]}; an override would send "
                             "requests the run's title, manifest and summary do not describe; drop it from "
                             "--extra-body")
