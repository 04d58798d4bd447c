"""The cyclic GC is held off while a load runs (slobench/run/quiet_gc.py): its pauses would land in the
measured latencies. Held only over the load, given back as found, safe when nested, with a valve that
collects a run that does leak cycles, and a send path that makes no cyclic garbage per request."""

from __future__ import annotations

import asyncio
import gc

import pytest

from slobench.run import quiet_gc
from slobench.run.clock import Clock
from slobench.run.records import RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions


class Watching(TargetBase):
    """Answers at once; notes whether the GC was enabled at each send, and can leak one cycle a request."""

    def __init__(self, leak: bool = False) -> None:
        self.clock = Clock()
        self.enabled_at_send: list[bool] = []
        self.leak = leak

    async def send(self, spec, rec):
        self.enabled_at_send.append(gc.isenabled())
        if self.leak:  # a cycle the reference counts cannot free: 50 lists pointing at each other
            ring = [[] for _ in range(50)]
            for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
                a.append(b)
        rec.sent_s = rec.first_token_s = rec.done_s = self.clock.now_s()
        rec.chunk_times_s, rec.chunk_tokens, rec.output_tokens = [rec.done_s], [1], 1


def specs(n: int, gap_s: float = 0.001) -> list[RequestSpec]:
    return [RequestSpec(i, i * gap_s, (1, 2, 3), 3, 1) for i in range(n)]


async def test_held_over_the_load_and_given_back_as_found():
    assert gc.isenabled()
    t = Watching()
    res = await run(specs(20), t, opts=RunOptions(progress=False))
    assert t.enabled_at_send and not any(t.enabled_at_send)
    assert gc.isenabled() and not quiet_gc.is_held() and gc.get_freeze_count() == 0
    assert res.summary.client.gc == {"held": True, "collections": 0, "pause_s_total": 0.0, "pause_s_max": 0.0,
                                     "collected": 0}
    assert res.summary.to_dict()["client"]["gc"]["held"] is True
    # a caller that had turned the GC off finds it off; and the option leaves it alone
    gc.disable()
    try:
        await run(specs(5), Watching(), opts=RunOptions(progress=False))
        assert not gc.isenabled()
    finally:
        gc.enable()
    t = Watching()
    res = await run(specs(5), t, opts=RunOptions(progress=False, hold_gc=False))
    assert all(t.enabled_at_send) and res.summary.client.gc is None


async def test_concurrent_runs_share_one_hold():
    a, b = Watching(), Watching()
    await asyncio.gather(run(specs(30), a, opts=RunOptions(progress=False)),
                         run(specs(5), b, opts=RunOptions(progress=False)))
    assert not any(a.enabled_at_send) and not any(b.enabled_at_send)  # the short run's end did not end a's hold
    assert gc.isenabled() and not quiet_gc.is_held()


async def test_the_valve_collects_a_leaking_run_and_says_so(monkeypatch):
    monkeypatch.setattr(quiet_gc, "DEFAULT_BUDGET", 2_000)
    t = Watching(leak=True)
    stats = quiet_gc.hold()
    try:
        for _ in range(100):
            await t.send(RequestSpec(0, 0.0, (1,), 1, 1), type("R", (), {})())
        assert quiet_gc.check(stats) and stats.collections == 1 and stats.collected >= 4_000
        assert not quiet_gc.check(stats)  # nothing new since
    finally:
        quiet_gc.release()
    with pytest.raises(RuntimeError, match="without hold"):
        quiet_gc.release()


@pytest.mark.parametrize("transport", ["raw"])  # httpx's own request objects form cycles, ~55 objects a request
async def test_the_send_path_makes_no_cyclic_garbage_per_request(token_server, transport):
    """Run 40 then 160 requests with the GC held and count what a collection then finds: if a request left
    a cycle, the second count would be ~120 cycles' worth larger."""
    found = []
    options = TargetOptions(model=token_server.model, transport=transport, extra_body={"x_ttft_ms": 0, "x_itl_ms": 0})
    async with OpenAITarget(token_server.base_url, options) as target:
        for n in (40, 160):
            gc.collect()
            stats = quiet_gc.hold()
            try:
                res = await run(specs(n, 0.0005), target, opts=RunOptions(progress=False, hold_gc=False))
            finally:
                quiet_gc.release()
            assert stats.collections == 0 and len(res.records) == n
            assert all(r.error is None for r in res.records), res.records[0].error
            found.append(gc.collect())
    assert found[1] - found[0] < 100, found


async def test_a_run_the_valve_collected_says_so_in_the_terminal_and_the_report(monkeypatch, tmp_path):
    from rich.console import Console

    from slobench.report import build_report
    from slobench.report.terminal import print_run

    monkeypatch.setattr(quiet_gc, "DEFAULT_BUDGET", 5_000)
    res = await run(specs(1_300), Watching(leak=True), opts=RunOptions(progress=False), run_dir=tmp_path / "r")
    gc_note = res.summary.client.gc
    assert gc_note["collections"] >= 1 and gc_note["collected"] >= 5_000 and gc_note["pause_s_max"] > 0
    console = Console(record=True, width=300)
    print_run(res.summary, console)
    assert f"collected {gc_note['collections']} time(s) during the load" in console.export_text()
    html = build_report([tmp_path / "r"], tmp_path / "r.html").read_text()
    assert "cyclic GC collected" in html
