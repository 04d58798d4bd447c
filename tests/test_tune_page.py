"""The tune's HTML page (`slobench report TUNE_DIR`) and the Pareto front it draws, on a tune directory made
in process (tests/tune_helpers.py): no server, no child process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.run.rundir import read_summary
from slobench.tune.pareto import OperatingPoint, operating_point, pareto_front
from slobench.tune.result import read_tune
from tests.tune_helpers import synthetic_tune

HOSTILE = "<script>alert(1)</script>&"


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_tune(tmp_path_factory.mktemp("tune"), failed={"param": "p" + HOSTILE, "reason": "r" + HOSTILE,
                                                                   "log": "l" + HOSTILE})


def point(name: str, per_gpu: float, per_user: float) -> OperatingPoint:
    return OperatingPoint(name, 1.0, per_gpu, per_user, name)


def test_the_front_keeps_the_points_no_other_beats_on_both_axes() -> None:
    pts = [point("a", 100, 50), point("b", 200, 40), point("c", 150, 30), point("d", 300, 10), point("e", 200, 40)]
    assert [p.name for p in pareto_front(pts)] == ["a", "b", "e", "d"]  # c: b beats it on both; b, e tie
    assert pareto_front([]) == []
    with pytest.raises(ValueError, match="above 0"):
        point("z", 1.0, 0.0)


def test_a_configurations_point_is_its_highest_rate_within_the_slo_per_gpu(tune_dir: Path) -> None:
    rows = {r.name: r for r in read_tune(tune_dir)}
    tp = operating_point(tune_dir, rows["tp-2"])
    assert tp is not None
    summary = read_summary(tune_dir / tp.probe_dir)
    assert summary is not None and summary.attainment_value is not None and summary.attainment_value >= 0.9
    assert tp.output_tps_per_gpu == pytest.approx(summary.output_token_throughput_tps / 2)  # two GPUs
    assert tp.output_tps_per_user == pytest.approx(1 / summary.tpot.mean)
    higher = [r for r in (8.0, 10.0, 12.0, 14.0) if r > tp.rate_rps]
    for rate in higher:  # every rate above it missed the target
        above = next(p for p in (tune_dir / "tp-2" / "capacity").iterdir()
                     if p.is_dir() and (s := read_summary(p)) is not None and s.rate_rps == rate)
        assert (read_summary(above).attainment_value or 0.0) < 0.9  # type: ignore[union-attr]
    assert operating_point(tune_dir, rows["broken"]) is None  # failed: no search, no point


def test_report_of_a_tune_dir_is_the_tune_page(tune_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune.html"
    assert main(["report", str(tune_dir), "-o", str(out)]) == 0
    page = out.read_text()
    assert '<meta name="slobench-figures" content="3">' in page
    table = page[page.index('<table class="data">'):page.index("</table>", page.index('<table class="data">'))]
    order = re.findall(r"<td>config=([^<]+)</td>", table)
    assert order == ["seqs-8", "seqs-4", "tp-2", "seqs-1", "p&lt;script&gt;alert(1)&lt;/script&gt;&amp;"]
    assert "<td>12</td><td>1.09</td>" in table  # simulated beside measured, and their ratio
    assert "Best: config=seqs-8, 11 req/s per GPU" in page
    assert "the simulator&#x27;s ranking did not hold" in page
    assert "r&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in page and "<script>alert(1)" not in page
    assert "Without a point" in page and "config=seqs-1" in page.split("Without a point")[1][:300]
    without = page.split('<section id="failed">')[1]
    assert "config=p&lt;script&gt;" in without and "config=seqs" not in without


def test_a_tune_dir_mixed_with_other_inputs_is_refused(tune_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(tune_dir), str(tune_dir / "seqs-8" / "capacity"), "-o", str(out)]) == 2
    assert "is a tune directory: its page is drawn alone" in capsys.readouterr().err
    assert not out.exists()
