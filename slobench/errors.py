"""The library's one exception tree. A failed *request* is data on its record, never one of these."""

from __future__ import annotations

import errno

from reference_engine.errors import ConfigError as EngineConfigError
from reference_engine.errors import EngineError

__all__ = ["WRITE_FAILURES", "EngineConfigError", "EngineError", "ResultsNotWritten", "SlobenchError", "SpecError",
           "TargetUnreachable", "UsageError"]

# A write refused by the disk, not by the path (ResultsNotWritten): full, over quota, failing, read-only
WRITE_FAILURES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS})


class SlobenchError(Exception):
    """Base of every error slobench raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(SlobenchError):
    """Bad command-line usage or a bad input file (workload spec, SLO string, trace, baseline)."""

    exit_code = 2


class SpecError(UsageError, EngineConfigError):
    """A workload/SLO/config value is invalid. The message names the field and the bad value.

    It is also the engine's `ConfigError` (the engine imports nothing from slobench): `except
    EngineConfigError` catches a bad setting from either package."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        self.why = why
        Exception.__init__(self, f"{field}: {why} (got {value!r})")  # one message, whichever base is asked


class TargetUnreachable(SlobenchError):
    """The preflight request failed: wrong URL, server down, wrong model name."""

    exit_code = 3


class ResultsNotWritten(SlobenchError):
    """A run's or a command's file could not be written (disk full, quota, I/O error). A run stops sending
    at the first failed write and keeps what reached the disk; the message names the file and what is kept."""

    exit_code = 6
