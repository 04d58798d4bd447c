"""A run's manifest.json, built in one place for every maker of a run: the command line, `--simulate` and
the Python API. The head is the same for all (version, what made it, workload, seed); what follows is the
maker's own (target, SLO, options, ...), in the order it gives, so each manifest keeps its bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slobench.redact import redact_argv
from slobench.version import __version__
from slobench.workload.base import Workload


def build_manifest(workload: Workload, *, seed: int, command: Sequence[str] | None = None,
                   made_by: str | None = None, **sections: Any) -> dict[str, Any]:
    """The manifest of a run of `workload` at `seed`, made by a `command` line (written redacted: it may hold
    a key) or by the API function `made_by` (give exactly one), then `sections` in the order given."""
    if (command is None) == (made_by is None):
        raise TypeError("build_manifest: give exactly one of command and made_by")
    made = {"command": redact_argv(list(command))} if command is not None else {"made_by": made_by}
    return {"slobench_version": __version__, **made, "workload": workload.to_dict(),
            "workload_name": workload.name, "seed": seed, **sections}
