"""A disk that fills mid-run: the run stops sending at the first record it cannot write, keeps what reached
requests.jsonl, summarises exactly those in summary.json (or says it could not), and the CLI exits 6 with
one line, no traceback. The full disk is injected: requests.jsonl refuses its (N+1)th line with ENOSPC."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pathlib
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import main
from slobench.errors import ResultsNotWritten
from slobench.run import rundir, scrape
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase

KEEP = 12  # lines requests.jsonl takes before the disk is full


class FullDisk:
    """A file that takes `keep` lines, then refuses every write as a full disk does."""

    def __init__(self, fh: Any, keep: int) -> None:
        self.fh, self.keep, self.lines, self.refused = fh, keep, 0, 0

    def write(self, text: str) -> int:
        if self.lines >= self.keep:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.lines += text.count("\n")
        return int(self.fh.write(text))

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> list[FullDisk]:
    opened: list[FullDisk] = []

    def fake_open(path: Any, *a: Any, **kw: Any) -> Any:
        fh = open(path, *a, **kw)  # noqa: SIM115 (closed by the writer)
        if Path(path).name == "requests.jsonl":
            opened.append(FullDisk(fh, KEEP))
            return opened[-1]
        return fh

    monkeypatch.setattr(rundir, "open", fake_open, raising=False)
    return opened


class QuickTarget(TargetBase):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.sent = 0

    async def send(self, spec: RequestSpec, rec: RequestRecord) -> None:
        self.sent += 1
        rec.sent_s = self.clock.now_s()
        await asyncio.sleep(0.001)
        rec.first_token_s = rec.done_s = self.clock.now_s()
        rec.chunk_times_s, rec.chunk_tokens, rec.output_tokens = [rec.done_s], [2], 2


async def test_the_run_stops_at_the_first_failed_write_and_keeps_what_was_written(
        tmp_path: Path, full_disk: list[FullDisk]) -> None:
    clock = Clock()
    target = QuickTarget(clock)
    specs = [RequestSpec(i, i * 0.005, (1, 2, 3), 3, 2) for i in range(200)]  # 1 s of sends
    with pytest.raises(ResultsNotWritten) as err:
        await run(specs, target, clock=clock, opts=RunOptions(progress=False, grace_s=5.0), run_dir=tmp_path / "r")
    msg = str(err.value)
    assert "requests.jsonl: cannot write (No space left on device): the run stopped sending" in msg
    assert f"the {KEEP} records written before are kept; summary.json summarises them" in msg
    assert full_disk[0].refused == 1  # nothing more was tried after the first refusal
    assert target.sent < 150  # sending stopped (at ~13 of 200; the margin is a stalled machine's)
    lines = (tmp_path / "r" / "requests.jsonl").read_text().splitlines()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert len(lines) == KEEP and summary["num_requests"] == KEEP  # the file and the summary agree
    assert summary["interrupted"] is True and "No space left" in summary["stopped_by"]


async def test_a_summary_the_disk_refuses_too_is_said(tmp_path: Path, full_disk: list[FullDisk],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    write_text = pathlib.Path.write_text

    def refuse_summary(self: Path, *a: Any, **kw: Any) -> int:
        if self.name == "summary.json.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", refuse_summary)
    clock = Clock()
    specs = [RequestSpec(i, i * 0.005, (1, 2, 3), 3, 2) for i in range(100)]
    with pytest.raises(ResultsNotWritten, match="summary.json could not be written either"):
        await run(specs, QuickTarget(clock), clock=clock, opts=RunOptions(progress=False), run_dir=tmp_path / "r")
    assert not (tmp_path / "r" / "summary.json").exists() and not (tmp_path / "r" / "summary.json.tmp").exists()
    assert len((tmp_path / "r" / "requests.jsonl").read_text().splitlines()) == KEEP


def test_cli_exits_6_with_one_line(tmp_path: Path, full_disk: list[FullDisk], token_server_url: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--url", token_server_url, "--workload", "tiny", "--input-len", "8", "--output-len", "2",
                 "--rate", "100", "--num-requests", "300", "--no-progress", "--scrape-interval", "0",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    err = [e for e in err if not e.startswith("slobench: server profile")]  # negotiation notes
    assert code == 6 and len(err) == 1, err
    assert "requests.jsonl: cannot write (No space left on device)" in err[0] and "Traceback" not in err[0]
    assert len((tmp_path / "r" / "requests.jsonl").read_text().splitlines()) == KEEP


def test_a_simulated_run_refused_by_the_disk_is_exit_6(tmp_path: Path, full_disk: list[FullDisk],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--simulate", "--workload", "tiny", "--num-requests", "40", "--rate", "20",
                 "--no-progress", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6 and len(err) == 1 and "No space left on device" in err[0], err


async def test_server_metrics_the_disk_refuses_stop_with_a_reason_and_keep_their_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[FullDisk] = []

    def fake_open(path: Any, *a: Any, **kw: Any) -> Any:
        opened.append(FullDisk(open(path, *a, **kw), 2))  # noqa: SIM115 (closed by the writer)
        return opened[-1]

    class Clock:
        t = 0.0

        def now_s(self) -> float:
            return self.t

    clock = Clock()

    async def sleep(dt: float) -> None:
        if clock.t > 100:
            raise AssertionError("the scraper kept going after the disk refused its lines")
        clock.t += dt

    monkeypatch.setattr(scrape, "open", fake_open, raising=False)
    scraper = scrape.MetricsScraper(lambda: "# TYPE q gauge\nq 1\n", tmp_path, 1.0, sleep=sleep)
    await scraper(clock)  # returns: no exception for the run's monitor gather to swallow
    assert scraper.num_scrapes == 2 and opened[0].refused == 1
    assert scraper.disabled_reason == "server_metrics.jsonl: cannot write (No space left on device)"
    lines = [json.loads(ln) for ln in (tmp_path / "server_metrics.jsonl").read_text().splitlines()]
    assert [ln["t_s"] for ln in lines] == [0.0, 1.0]


def test_a_rewrite_the_disk_refuses_keeps_requests_jsonl_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = rundir.RunWriter(tmp_path, {"kind": "run"})
    recs = [RequestRecord(request_id=i, scheduled_s=float(i)) for i in range(3)]
    for r in recs:
        writer.write(r)
    before = (tmp_path / "requests.jsonl").read_text()

    def refusing(path: Path, records: Any) -> None:
        path.write_text('{"request_id": 0')  # a part written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir, "write_records", refusing)
    with pytest.raises(ResultsNotWritten, match=r"requests\.jsonl: cannot write \(No space left on device\); it is kept"):
        writer.rewrite(recs[1:])
    assert (tmp_path / "requests.jsonl").read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json", "requests.jsonl"]
