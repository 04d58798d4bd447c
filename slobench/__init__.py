"""slobench: SLO-aware open-loop load testing for LLM inference servers.

The Python API (see `slobench.api` and docs/guide/python-api.md): `run_load`, `simulate_load`, `load_run`,
`summarize`, `compare`, `render_report`, with the types they take and return. `import slobench` stays
cheap: each name is imported from `slobench.api` on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slobench.version import __version__

_API = ("SLO", "Run", "RequestRecord", "RunSummary", "WorkloadSpec", "compare", "load_run", "load_workload", "render_report",
        "run_load", "simulate_load", "summarize")
__all__ = ["__version__", *_API]

if TYPE_CHECKING:
    from slobench.api import (  # noqa: F401
        SLO,
        RequestRecord,
        Run,
        RunSummary,
        WorkloadSpec,
        compare,
        load_run,
        load_workload,
        render_report,
        run_load,
        simulate_load,
        summarize,
    )


def __getattr__(name: str) -> Any:
    if name in _API:
        from slobench import api

        return getattr(api, name)
    raise AttributeError(f"module 'slobench' has no attribute {name!r}")
