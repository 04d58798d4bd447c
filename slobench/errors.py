"""The library's one exception tree. A failed *request* is data on its record, never one of these."""

from __future__ import annotations


class SlobenchError(Exception):
    """Base of every error slobench raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(SlobenchError):
    """Bad command-line usage or a bad input file (workload spec, SLO string, trace, baseline)."""

    exit_code = 2


class SpecError(UsageError):
    """A workload/SLO/config value is invalid. The message names the field and the bad value."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        self.why = why
        super().__init__(f"{field}: {why} (got {value!r})")


class TargetUnreachable(SlobenchError):
    """The preflight request failed: wrong URL, server down, wrong model name."""

    exit_code = 3
