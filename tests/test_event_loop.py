"""The load's event loop: uvloop where installed, asyncio's own when SLOBENCH_EVENT_LOOP says so."""

from __future__ import annotations

import asyncio
import importlib.util
import warnings

import pytest

from slobench.errors import UsageError
from slobench.run.event_loop import ENV, loop_name, run_async

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _name() -> str:
    return loop_name()


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop not installed")
def test_the_default_loop_is_uvloop_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert run_async(_name()) == "uvloop"
    monkeypatch.setenv(ENV, "uvloop")
    assert run_async(_name()) == "uvloop"


def test_asyncio_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "asyncio")
    assert run_async(_name()) == "asyncio"
    assert asyncio.run(_name()) == "asyncio"  # a loop started elsewhere is named as it is


def test_an_unknown_loop_is_refused_and_the_coroutine_never_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "trio")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would be a RuntimeWarning
        with pytest.raises(UsageError, match="SLOBENCH_EVENT_LOOP: expected one of auto, uvloop, asyncio"):
            run_async(_name())
