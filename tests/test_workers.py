"""Client worker processes (slobench.targets.workers): the same records as one process, cancellation,
a dying worker, and the CLI flag. Against the scheduled-token server (TTFT 50 ms, ITL 5 ms)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from slobench.analysis.metrics import RecordArrays
from slobench.cli import main
from slobench.errors import SpecError
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.rundir import load_run
from slobench.run.runner import RunOptions, run
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts
from slobench.targets.workers import WorkerPool
from slobench.testing import TokenServerProcess

pytestmark = pytest.mark.integration
QUIET = RunOptions(progress=False)
PROMPT = tuple(range(1000, 1016))


def specs(n: int, spacing_s: float = 0.01, max_tokens: int = 20, start_s: float = 0.0, first_id: int = 0,
          **body: object) -> list[RequestSpec]:
    extra = tuple(body.items())
    return [RequestSpec(first_id + i, start_s + i * spacing_s, PROMPT, len(PROMPT), max_tokens, extra_body=extra)
            for i in range(n)]


def options(srv: TokenServerProcess) -> TargetOptions:
    return TargetOptions(model=srv.model)


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped by close(): no such child any more


async def test_workers_measure_what_one_process_measures(token_server: TokenServerProcess) -> None:
    async with WorkerPool(3, token_server.base_url, options(token_server)) as pool:
        assert "test-model" in await pool.preflight()
        assert pool.describe()["client_workers"] == 3 and len(set(pool.worker_pids)) == 3
        pooled = await run(specs(60), pool, opts=QUIET, handle_sigint=False)
        pids = pool.worker_pids
    assert_gone(pids)
    async with OpenAITarget(token_server.base_url, options(token_server)) as single:
        alone = await run(specs(60), single, opts=QUIET, handle_sigint=False)
    for res in (pooled, alone):
        a = RecordArrays.from_records(res.records)
        assert res.summary.num_ok == 60 and (a.output_tokens == 20).all()
        assert abs(np.median(a.ttft_s) - 0.050) < 0.003  # the server's schedule (+1 ms: a loaded CI machine)
        assert abs(np.median(a.tpot_s) - 0.005) < 0.0005
        assert (a.lateness_s >= 0).all()
        for r in res.records:  # the worker's stamps landed on the run's clock, in order
            assert r.scheduled_s <= r.sent_s < r.first_token_s == r.chunk_times_s[0] <= r.chunk_times_s[-1] <= r.done_s
            assert r.sent_s - r.scheduled_s < 0.05
    p = RecordArrays.from_records(pooled.records)
    s = RecordArrays.from_records(alone.records)
    assert abs(np.median(p.ttft_s) - np.median(s.ttft_s)) < 0.002


async def test_cancelling_the_run_cancels_in_flight_requests_and_the_pool_still_works(
    token_server: TokenServerProcess, tmp_path: Path
) -> None:
    async with WorkerPool(2, token_server.base_url, options(token_server)) as pool:
        # 10 requests sent within 0.1 s, each streaming for ~1 s; the run is cancelled at 0.5 s.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run(specs(10, max_tokens=200), pool, opts=QUIET, run_dir=tmp_path / "r",
                                       handle_sigint=False), timeout=0.5)
        records = load_run(tmp_path / "r").records
        assert len(records) == 10 and {r.status for r in records} == {"cancelled"}
        assert all(r.sent_s is not None for r in records)  # the parent's provisional stamp survives
        again = await run(specs(4), pool, opts=QUIET, handle_sigint=False)
        assert again.summary.num_ok == 4
        pids = pool.worker_pids
    assert_gone(pids)


async def test_a_dying_worker_fails_only_its_requests(token_server: TokenServerProcess) -> None:
    async with WorkerPool(2, token_server.base_url, options(token_server)) as pool:
        victim = pool.worker_pids[0]

        async def kill_at(t_s: float) -> Callable[[Clock], Awaitable[None]]:
            async def monitor(clock: Clock) -> None:
                await asyncio.sleep(max(0.0, t_s - clock.now_s()))  # an injected fault at a set time
                os.kill(victim, signal.SIGKILL)

            return monitor

        # 10 long streams sent by 0.1 s, spread over both workers; worker 0 is killed at 0.4 s; 4 short
        # requests at 0.6 s go to the survivor.
        wave = specs(10, max_tokens=200) + specs(4, start_s=0.6, first_id=10)
        res = await run(wave, pool, opts=QUIET, handle_sigint=False, monitors=[await kill_at(0.4)])
    by_id = {r.request_id: r for r in res.records}
    failed = [r for r in res.records if r.status != "ok"]
    assert 1 <= len(failed) <= 9
    assert all("client worker 0" in (r.error or "") and "exited" in (r.error or "") for r in failed)
    assert all(by_id[i].status == "ok" for i in range(10, 14))


def test_bad_worker_counts_and_options_are_refused(token_server: TokenServerProcess) -> None:
    for n in (0, -1, 65, True, 2.5):
        with pytest.raises(SpecError, match="client_workers"):
            WorkerPool(n, token_server.base_url, options(token_server))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):  # what travels to a worker holds no clock
        TargetOptions(model=token_server.model, clock=Clock())  # type: ignore[call-arg]
    with pytest.raises(SpecError, match="request_s"):
        WorkerPool(2, token_server.base_url, TargetOptions(model=token_server.model, timeouts=Timeouts(request_s=-1)))


def test_cli_client_workers(token_server: TokenServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                            ) -> None:
    out = tmp_path / "run"
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--rate", "40", "--num-requests", "30",
               "--client-workers", "2", "--slo", "ttft=5s", "--out", str(out), "--no-progress"])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0 and summary["num_ok"] == 30
    assert json.loads((out / "manifest.json").read_text())["target"]["client_workers"] == 2
    rc = main(["run", "--engine", "modeled", "--workload", "tiny", "--num-requests", "3", "--client-workers", "2",
               "--out", str(tmp_path / "e"), "--no-progress"])
    assert rc == 2 and "--client-workers needs --url" in capsys.readouterr().err


async def test_a_worker_that_cannot_start_is_a_clear_error(token_server: TokenServerProcess,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import sys

    monkeypatch.setattr(sys, "executable", shutil.which("false") or "/bin/false")  # exits at once, says nothing
    pool = WorkerPool(2, token_server.base_url, options(token_server))
    with pytest.raises(RuntimeError, match=r"client worker \d did not start"):
        await pool.start()
    assert pool.worker_pids == []
