"""A sweep's headline says how well the grid pins the SLO's crossing, and `--refine-knee` narrows it.

The demo's grid (4, 8, 16 req/s) put its crossing between 8 and 16 while the headline's interval, drawn on
the straight line between those two rates, read 8.46 to 8.91: a precision the grid never had. Across a
cliff the curve between two rates is anything falling, so the interval now spans at least the two rates
that bracket the crossing, and the sweep can measure more rates inside that bracket.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slobench.analysis.headline import headline, knee_bracket
from slobench.analysis.slo import SLO
from slobench.analysis.summary import RunSummary
from slobench.cli import main
from slobench.experiments.probe import ProbeResult
from slobench.experiments.sweep import next_knee_rate, run_sweep
from slobench.report.terminal import headline_text

SLO90 = SLO.parse("ttft=1s,target=0.9")


def summary(rate: float, value: float, half_width: float = 0.04) -> RunSummary:
    s = RunSummary.from_dict({"num_requests": 100, "num_ok": 100, "attainment": {
        "value": value, "ci_low": max(0.0, value - half_width), "ci_high": min(1.0, value + half_width)}})
    return replace(s, rate_rps=rate)


def cliff(rate: float) -> float:
    """Attainment of a server whose cliff is at 11 req/s: flat, then a drop no straight line follows."""
    return 1.0 if rate <= 11 else 0.05


def test_the_interval_spans_the_rates_that_bracket_a_cliff() -> None:
    points = [summary(r, cliff(r)) for r in (4, 8, 16)]
    h = headline(points, SLO90)
    assert h is not None
    est = h["max_rate_meeting_rps"]
    assert 8 < est < 16
    # the straight line's band is within 8.2..9; the truth (11) is outside it, inside the bracket
    assert h["bracket_rps"] == [8, 16]
    assert h["interval_rps"] == [8, 16]
    assert h["undecided_rps"] == []
    assert "--refine-knee" in headline_text(h)


def test_rates_within_noise_of_the_target_ask_for_more_requests() -> None:
    # 80 requests a rate: 9.51 and 11.3 req/s measured 90% and 82%, each interval straddling the target
    points = [summary(8, 1.0), summary(9.51, 0.9, 0.12), summary(11.3, 0.825, 0.2), summary(16, 0.5, 0.25)]
    h = headline(points, SLO90)
    assert h is not None
    assert h["bracket_rps"] == [8, 16] and h["undecided_rps"] == [9.51, 11.3]
    text = headline_text(h)
    assert "9.51 and 11.3 req/s" in text and "--num-requests" in text and "--refine-knee" not in text


def test_a_dense_grid_narrows_the_interval_and_drops_the_hint() -> None:
    rates, values = [8.0, 8.5, 9.0, 9.5], [0.99, 0.97, 0.85, 0.8]
    h = headline([summary(r, v, half_width=0.03) for r, v in zip(rates, values, strict=True)], SLO90)
    assert h is not None
    assert h["bracket_rps"] == [8.5, 9.0] and h["interval_rps"] == [8.5, 9.0]
    assert "--refine-knee" not in headline_text(h)  # a bracket 6% wide needs no more rates


def test_a_noisy_dip_keeps_the_wider_interpolated_edge() -> None:
    # 9 req/s dipped below the target by chance, 10 met it again: the lower CI edge crosses first near 8.5,
    # below the bracket's lower rate (10), and the interval keeps that wider edge
    rates, values = [8.0, 9.0, 10.0, 11.0], [0.99, 0.88, 0.96, 0.5]
    h = headline([summary(r, v) for r, v in zip(rates, values, strict=True)], SLO90)
    assert h is not None
    assert h["bracket_rps"] == [10.0, 11.0]
    lo, hi = h["interval_rps"]
    assert 8 < lo < 9 and hi == 11.0


def test_knee_bracket_reads_the_intervals_not_the_points() -> None:
    # 12 req/s measured 85% but its interval reaches 92%: it is not surely failing
    assert knee_bracket([8, 12, 16], [0.95, 0.78, 0.1], [1.0, 0.92, 0.2], 0.9) == (8, 16)
    assert knee_bracket([8, 12], [0.5, 0.1], [0.7, 0.3], 0.9) == (None, 8)
    assert knee_bracket([8, 12], [0.95, 0.93], [1.0, 1.0], 0.9) == (12, None)


def test_next_knee_rate_halves_the_bracket_geometrically() -> None:
    assert next_knee_rate([(4, 1.0), (8, 1.0), (16, 0.05)], 0.9) == pytest.approx(11.3)
    assert next_knee_rate([(4, 1.0), (8, 1.0)], 0.9) is None  # nothing missed: no bracket
    assert next_knee_rate([(4, 0.5), (8, 0.2)], 0.9) is None  # nothing met
    assert next_knee_rate([(10.0, 1.0), (10.01, 0.0)], 0.9) is None  # no 3-digit rate between them


async def test_run_sweep_measures_inside_the_bracket_and_keeps_rate_order(tmp_path: Path) -> None:
    measured: list[float] = []

    async def probe(rate: float, seed: int, run_dir: Path | None, manifest: dict[str, Any]) -> ProbeResult:
        measured.append(rate)
        return ProbeResult(summary(rate, cliff(rate)))

    doc = await run_sweep([4, 8, 16], probe, out_dir=tmp_path, slo=SLO90, manifest={}, refine_knee=3)
    # 8 meets and 16 misses: 11.3 (misses), then 9.51 and 10.4 (both meet), each between the last bracket's
    assert measured == [4, 8, 16, 11.3, 9.51, 10.4]
    rates = [r["rate_rps"] for r in doc["runs"]]
    assert rates == sorted(rates)
    lo, hi = doc["headline"]["bracket_rps"]
    assert lo is not None and hi is not None and lo <= 11 < hi and hi / lo < 16 / 8
    on_disk = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["rate_rps"] for r in on_disk["runs"]] == rates


def test_refine_knee_is_checked_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s"
    rc = main(["sweep", "--simulate", "--workload", "tiny", "--rates", "4,8", "--num-requests", "20",
               "--refine-knee", "2", "--out", str(out), "--no-progress"])
    assert rc == 2 and "--slo" in capsys.readouterr().err and not out.exists()
    rc = main(["sweep", "--simulate", "--workload", "tiny", "--rates", "4,8", "--num-requests", "20",
               "--slo", "ttft=1s", "--refine-knee", "-1", "--out", str(out), "--no-progress"])
    assert rc == 2 and "--refine-knee -1" in capsys.readouterr().err and not out.exists()
