"""The report's client-health section for a run sent from Ray load actors: a per-actor table (records,
lateness, CPU, clock offset, uncertainty, drift, deaths) and the clock flag when the uncertainty exceeds
CLOCK_LIMIT_OF_TTFT of the TTFT SLO, judged by the SLO the report uses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from slobench.analysis.slo import SLO
from slobench.report import build_report
from slobench.report.synthetic import synthetic_records
from slobench.run.clocksync import CLOCK_LIMIT_OF_TTFT
from slobench.run.rundir import SUMMARY, RunWriter

RUN_SLO = SLO(ttft_s=0.1, tpot_s=0.05)  # limit: 5% of 100 ms = 5 ms


def actor(index: int, host: str, uncertainty_s: float, *, died: str | None = None) -> dict[str, Any]:
    est = {"offset_s": 1234.5 * index, "uncertainty_s": uncertainty_s, "at_s": 0.0, "rtt_s": 2 * uncertainty_s,
           "num_samples": 24}
    return {"index": index, "node_id": f"node{index}", "hostname": host, "pid": 100 + index, "alive": died is None,
            "died": died, "num_records": 60 + index, "lateness_s": {"p50": 0.0002, "p99": 0.0031 + index * 1e-3},
            "cpu_s": 1.5, "loop_cpu_s": 0.9,
            "clock": {"start": est, "end": est, "drift_ppm": 3.25, "uncertainty_s": uncertainty_s}}


def ray_run(tmp_path: Path, uncertainties: tuple[float, ...], *, with_summary: bool = True) -> Path:
    run_dir = tmp_path / "ray-run"
    actors = [actor(i, f"host-{i}" if i else "<b>evil</b>", u, died="node lost" if i == 2 else None)
              for i, u in enumerate(uncertainties)]
    limit = CLOCK_LIMIT_OF_TTFT * RUN_SLO.ttft_s  # type: ignore[operator]
    worst = max(uncertainties)
    w = RunWriter(run_dir, {"slo": RUN_SLO.to_dict(), "rate_rps": 8.0, "target": {"url": "http://x/v1", "ray": {"address": "local", "actors": len(actors)}},
                            "clock_sync": {"limit_s": limit, "actors": [{k: a[k] for k in ("index", "node_id", "hostname", "pid", "clock")} for a in actors]}})
    for r in synthetic_records(8.0, 150, seed=3):
        w.write(r)
    ray = {"num_actors": len(actors), "num_died": 1, "actors": actors, "clock_uncertainty_s": worst,
           "clock_uncertainty_limit_s": limit, "is_clock_flagged": worst > limit, "warning": None}
    w.finish({"client": {"ray": ray}} if with_summary else {})
    return run_dir


def client_section(page: str) -> str:
    m = re.search(r'<section id="client">.*?</section>', page, re.S)
    assert m, "no client-health section"
    return m.group(0)


def table_rows(section: str) -> list[list[str]]:
    m = re.search(r'<table class="data ray-actors">.*?<tbody>(.*?)</tbody>', section, re.S)
    assert m, "no per-actor table"
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", m.group(1))]


def test_a_ray_run_gets_a_per_actor_table_and_its_uncertain_clocks_are_flagged(tmp_path: Path) -> None:
    run_dir = ray_run(tmp_path, (0.0004, 0.008, 0.001))  # actor 1 is known to ±8 ms: more than 5 ms
    section = client_section(build_report([run_dir], tmp_path / "r.html").read_text())
    rows = table_rows(section)
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert rows[0][1] == "&lt;b&gt;evil&lt;/b&gt;" and "<b>evil" not in section  # hostnames are escaped
    assert rows[1][2] == "61" and rows[1][3:5] == ["0.20", "4.10"]  # records, lateness p50 / p99 ms
    assert rows[1][5] == "0.90 / 1.50" and rows[1][6] == "+1234.500000"  # CPU, the clock offset in s
    assert rows[1][7:9] == ["8.00", "+3.2"] and rows[2][9] == "died: node lost" and rows[0][9] == "ok"
    assert "CLIENT CLOCKS UNCERTAIN" in section and "±8.00 ms" in section and "(5.00 ms)" in section
    assert "The client kept its schedule at every rate" not in section  # not while its clocks are in doubt


def test_the_flag_follows_the_slo_the_report_judges_by(tmp_path: Path) -> None:
    run_dir = ray_run(tmp_path, (0.0004, 0.008, 0.001))
    page = build_report([run_dir], tmp_path / "r.html", slo=SLO(ttft_s=1.0)).read_text()  # limit 50 ms
    section = client_section(page)
    assert len(table_rows(section)) == 3 and "CLIENT CLOCKS UNCERTAIN" not in section
    page = build_report([run_dir], tmp_path / "r.html", slo=SLO(ttft_s=0.01)).read_text()  # limit 0.5 ms
    assert "CLIENT CLOCKS UNCERTAIN" in client_section(page)


def test_clocks_within_the_limit_are_not_flagged(tmp_path: Path) -> None:
    run_dir = ray_run(tmp_path, (0.0004, 0.0049, 0.001))
    section = client_section(build_report([run_dir], tmp_path / "r.html").read_text())
    assert len(table_rows(section)) == 3 and "CLIENT CLOCKS UNCERTAIN" not in section


def test_without_a_summary_the_manifest_clocks_still_make_the_table(tmp_path: Path) -> None:
    run_dir = ray_run(tmp_path, (0.0004, 0.008, 0.001), with_summary=False)
    (run_dir / SUMMARY).unlink()
    section = client_section(build_report([run_dir], tmp_path / "r.html").read_text())
    rows = table_rows(section)
    assert [r[7] for r in rows] == ["0.40", "8.00", "1.00"] and rows[0][2] == "–"  # clocks, no records count
    assert "CLIENT CLOCKS UNCERTAIN" in section


def test_a_run_from_one_machine_has_no_actor_table(tmp_path: Path) -> None:
    run_dir = tmp_path / "plain"
    w = RunWriter(run_dir, {"slo": RUN_SLO.to_dict(), "rate_rps": 8.0})
    for r in synthetic_records(8.0, 100, seed=3):
        w.write(r)
    w.finish({})
    section = client_section(build_report([run_dir], tmp_path / "r.html").read_text())
    assert "ray-actors" not in section and "CLIENT CLOCKS" not in section
