"""Setup and monitoring HTTP through the transport seam (issue 12): the target finds its model at
preflight, a server that lists none is exit 3 with the fix, and a control request that finds no server
is a TransportError like a load request's."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.run.clock import Clock
from slobench.targets.build import build
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.transport import ControlClient, TransportError
from slobench.testing import TokenServerProcess


def test_preflight_finds_the_model_when_none_is_given(token_server: TokenServerProcess) -> None:
    async def go() -> tuple[str | None, str, str | None]:
        target = build(TargetOptions(urls=(token_server.base_url,)), Clock())
        assert isinstance(target, OpenAITarget) and target.model == ""  # "": found at preflight
        async with target:
            served = await target.preflight()
        return target.model, served, target.describe()["model"]

    model, served, described = asyncio.run(go())
    assert model == described == token_server.model
    assert served.startswith(f"{token_server.model} served at")


def test_a_server_listing_no_model_is_exit_3_naming_the_flag(
    start_token_server: Callable[..., TokenServerProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = start_token_server(ttft_ms=2, itl_ms=1, quirks=("models-empty",))
    code = main(["run", "--url", srv.base_url, "--workload", "tiny", "--num-requests", "3", "--no-progress",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 3 and "no model listed; pass --model NAME" in err, err


@pytest.mark.integration  # a socket on 127.0.0.1
def test_a_control_request_to_no_server_is_a_transport_error() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        async with ControlClient(timeout_s=2.0) as client:
            await client.get(f"http://127.0.0.1:{port}/metrics")

    with pytest.raises(TransportError) as e:
        asyncio.run(go())
    assert e.value.status == "error" and "connect" in e.value.reason


def test_build_refuses_client_workers_for_the_in_process_engine() -> None:
    from slobench.errors import UsageError

    with pytest.raises(UsageError, match="--client-workers needs --url"):
        build(TargetOptions(engine_knobs={"executor": "modeled", "model": "tiny"}, client_workers=2), Clock())
