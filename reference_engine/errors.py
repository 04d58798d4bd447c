"""The engine's own errors: `reference_engine` imports nothing from `slobench`.

A bad engine setting raises `ConfigError` (a `ValueError` naming the field, the value and why), a bad
checkpoint `CheckpointError`. slobench's `SpecError` is a `ConfigError` too, so one `except ConfigError`
catches a bad setting from either side; slobench's command line exits 2 on any `EngineError`.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose (a failed *request* is an event, never this)."""


class ConfigError(EngineError, ValueError):
    """An engine setting, model config or cost profile value is invalid."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        self.why = why
        super().__init__(f"{field}: {why} (got {value!r})")


class CheckpointError(EngineError):
    """A model checkpoint folder cannot be used (missing files, wrong shapes, unknown layout)."""
