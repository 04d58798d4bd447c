"""The public Python API (issue 12, item 6): what `slobench.__all__` promises, used as a notebook would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import slobench
from slobench.errors import UsageError
from slobench.testing import TokenServerProcess

PUBLIC = {"__version__", "SLO", "Run", "RequestRecord", "RunSummary", "WorkloadSpec", "compare", "load_run", "load_workload",
          "render_report", "run_load", "simulate_load", "summarize"}


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert set(slobench.__all__) == PUBLIC  # adding or removing a public name is a decision: change this test
    for name in slobench.__all__:
        assert getattr(slobench, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_thing"):
        slobench.no_such_thing  # noqa: B018


def test_import_slobench_is_cheap() -> None:
    code = "import slobench, sys; print(sorted(m for m in ('numpy', 'aiohttp', 'plotly', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_simulate_load_summarize_compare_report(tmp_path: Path) -> None:
    sim = slobench.simulate_load(workload="tiny", rate=4, num_requests=40, slo="ttft=250ms,tpot=30ms", out=tmp_path / "a")
    assert len(sim.records) == 40 and sim.summary is not None and sim.summary.num_ok == 40
    again = slobench.load_run(tmp_path / "a")
    assert [r.request_id for r in again.records] == [r.request_id for r in sim.records]
    redo = slobench.summarize(again.records, "ttft=250ms,tpot=30ms")
    assert isinstance(redo, slobench.RunSummary)
    assert redo.attainment.value == sim.summary.attainment.value
    assert redo.attainment.value != slobench.summarize(again.records, "ttft=1ms").attainment.value
    # the same run against itself: never a regression; against a slower engine at a higher rate: a verdict
    same = slobench.compare(tmp_path / "a", tmp_path / "a")
    assert same.verdict != "regression" and same.exit_code != 1
    from slobench.fleet.simulate import ModeledEngine

    # replicates (seeds) on each side: a 3x slower engine is a regression the gate can call
    base = [slobench.simulate_load(workload="tiny", rate=4, num_requests=40, slo="ttft=250ms,tpot=30ms", seed=s,
                                   out=tmp_path / f"base{s}").run_dir for s in range(3)]
    slow = [slobench.simulate_load(workload="tiny", rate=4, num_requests=40, slo="ttft=250ms,tpot=30ms", seed=s,
                                   engine=ModeledEngine(step_scale=3.0), out=tmp_path / f"slow{s}").run_dir
            for s in range(3)]
    worse = slobench.compare(base, slow)
    assert worse.verdict == "regression" and worse.exit_code == 1, worse.to_dict()
    assert slobench.compare(base, base).verdict == "pass"
    html = slobench.render_report([tmp_path / "a", tmp_path / "slow0"], tmp_path / "r.html", title="api")
    text = html.read_text()
    assert html == tmp_path / "r.html" and "<html" in text and "api" in text


def test_run_load_against_a_server(token_server: TokenServerProcess, tmp_path: Path) -> None:
    run = slobench.run_load(token_server.base_url, workload="tiny", rate=20, num_requests=15,
                            slo="ttft=1s", out=tmp_path / "live", extra_body={"x_ttft_ms": 5, "x_itl_ms": 1})
    assert len(run.records) == 15 and run.summary is not None and run.summary.num_ok == 15
    assert run.manifest["target"]["model"] == token_server.model  # discovered from /models
    assert (tmp_path / "live" / "requests.jsonl").is_file()
    assert run.summary.attainment.value == 1.0


def test_bad_input_names_the_problem() -> None:
    from slobench.errors import UsageError

    with pytest.raises(UsageError, match="ttft"):
        slobench.simulate_load(workload="tiny", rate=4, num_requests=5, slo="ttft=-3ms")
    with pytest.raises(UsageError, match="no_such_workload"):
        slobench.simulate_load(workload="no_such_workload", rate=4, num_requests=5)
    with pytest.raises(UsageError, match="no capacity.json, sweep.json, baseline.json or run summary"):
        slobench.compare(Path(__file__).parent, Path(__file__).parent)


def test_reading_and_summarising_keep_numpys_arrays_off_huge_pages_then_restore_the_callers_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a notebook imported numpy long before slobench: the switch is turned for the call, and back after
    import numpy as np

    from slobench import api

    madvise = np._core.multiarray
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    sim = slobench.simulate_load(workload="tiny", rate=4, num_requests=20, out=tmp_path / "a")
    seen: list[bool] = []
    real = api._summarize  # noqa: SLF001

    def spy(*args: object, **kw: object) -> object:
        seen.append(madvise._get_madvise_hugepage())
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_summarize", spy)
    before = madvise._set_madvise_hugepage(True)
    try:
        assert slobench.summarize(sim.records).num_requests == 20
        assert seen == [False] and madvise._get_madvise_hugepage() is True
        madvise._set_madvise_hugepage(False)
        slobench.summarize(tmp_path / "a")
        assert seen == [False, False] and madvise._get_madvise_hugepage() is False  # the caller's: kept off
        madvise._set_madvise_hugepage(True)
        with pytest.raises(UsageError):
            slobench.load_run(tmp_path / "absent")
        assert madvise._get_madvise_hugepage() is True  # restored when the call fails too
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")  # the caller's own choice: left alone
        slobench.summarize(sim.records)
        assert seen[-1] is True
    finally:
        madvise._set_madvise_hugepage(before)
