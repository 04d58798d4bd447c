"""`build(options, clock)`: the one place a `Target` is chosen and made from what the user asked for.

An in-process engine (`engine_knobs`), else one OpenAI-compatible URL, several (a client-routed fleet),
and for each URL one client in this process, `client_workers` worker processes, or Ray actors (`ray`).
A model not named is found by the target itself in `preflight()` (the first one the server lists).
"""

from __future__ import annotations

from typing import Any

from slobench.errors import UsageError
from slobench.fleet.client_routed import FleetTarget
from slobench.run.clock import Clock
from slobench.targets.engine import EngineTarget
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.ray_pool import RayPool
from slobench.targets.workers import WorkerPool


def build(options: TargetOptions, clock: Clock) -> Any:
    """The target `options` describe, not started (`await target.start()`, then `preflight()`)."""
    if options.engine_knobs is not None:
        if options.client_workers != 1:
            raise UsageError("--client-workers needs --url: the in-process engine has no HTTP client to spread")
        knobs = dict(options.engine_knobs)
        return EngineTarget(knobs, clock, model_name=knobs["model"], api=options.api)
    if len(options.urls) > 1:
        return FleetTarget([_url_target(options, url, clock) for url in options.urls], options.router)
    return _url_target(options, options.urls[0], clock)


def _url_target(o: TargetOptions, url: str, clock: Clock) -> Any:
    if o.ray is not None:
        return RayPool(o.client_workers, url, o, clock=clock, address=o.ray)
    if o.client_workers != 1:
        return WorkerPool(o.client_workers, url, o, clock=clock)
    return OpenAITarget(url, o, clock)
