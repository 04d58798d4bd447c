"""`build(options, clock)`: the one place a `Target` is chosen and made from what the user asked for.

An in-process engine (`engine_knobs`), else one OpenAI-compatible URL, several (a client-routed fleet),
and for each URL one client in this process, `client_workers` worker processes, or Ray actors (`ray`).
A model not named is found by the target itself in `preflight()` (the first one the server lists).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slobench.errors import UsageError
from slobench.run.clock import Clock

DEFAULT_URL = "http://127.0.0.1:8000/v1"


@dataclass(frozen=True, slots=True)
class TargetOptions:
    urls: tuple[str, ...] = (DEFAULT_URL,)
    model: str | None = None  # None: the first model the server lists, found at preflight
    api: str = "completions"
    stream: bool = True
    api_key_env: str = "OPENAI_API_KEY"
    headers: Mapping[str, str] = field(default_factory=dict)
    extra_body: Mapping[str, Any] | None = None
    timeout_s: float = 600.0
    transport: str = "raw"
    http2: bool = False
    server_profile: str = "auto"
    tokenizer: str | None = None
    client_workers: int = 1
    ray: str | None = None  # a Ray address ("local": start one here); None: no Ray
    router: str = "least-outstanding"  # several URLs: how requests are spread
    engine_knobs: Mapping[str, Any] | None = None  # the in-process reference engine instead of a URL

    def __post_init__(self) -> None:
        if self.engine_knobs is None and not self.urls:
            raise UsageError("--url: no URL given")
        if self.client_workers < 1:
            raise UsageError(f"--client-workers must be >= 1 (got {self.client_workers})")


def build(options: TargetOptions, clock: Clock) -> Any:
    """The target `options` describe, not started (`await target.start()`, then `preflight()`)."""
    if options.engine_knobs is not None:
        from slobench.targets.engine import EngineTarget

        if options.client_workers != 1:
            raise UsageError("--client-workers needs --url: the in-process engine has no HTTP client to spread")
        knobs = dict(options.engine_knobs)
        return EngineTarget(knobs, clock, model_name=knobs["model"], api=options.api)  # type: ignore[arg-type]
    if len(options.urls) > 1:
        from slobench.fleet.client_routed import FleetTarget

        return FleetTarget([_url_target(options, url, clock) for url in options.urls], options.router)
    return _url_target(options, options.urls[0], clock)


def _url_target(o: TargetOptions, url: str, clock: Clock) -> Any:
    from slobench.targets.openai import OpenAITarget

    kwargs: dict[str, Any] = dict(
        base_url=url, model=o.model, api=o.api, stream=o.stream, api_key_env=o.api_key_env, headers=dict(o.headers),
        extra_body=o.extra_body, timeout_s=o.timeout_s, transport=o.transport, http2=o.http2,
        server_profile=o.server_profile, tokenizer=o.tokenizer,
    )
    if o.ray is not None:
        from slobench.targets.ray_pool import RayPool

        return RayPool(o.client_workers, kwargs, clock=clock, address=o.ray)
    if o.client_workers != 1:
        from slobench.targets.workers import WorkerPool

        return WorkerPool(o.client_workers, kwargs, clock=clock)
    return OpenAITarget(**kwargs, clock=clock)
