"""Per-session results where a reader and a gate see them: the summary's flat metrics (session attainment and
session time), the gate's default check of the session SLO's attainment, and the run report's sessions
section with the session attainment and its interval beside the per-request one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slobench.analysis.slo import SLO
from slobench.analysis.summary import summarize
from slobench.cli import main
from slobench.fleet.simulate import simulate_run
from slobench.gate import Samples, default_thresholds, gate, load_samples
from slobench.report.html import build_report
from slobench.workload import WorkloadSpec, generate

SESSIONS = {"turns": {"dist": "fixed", "value": 4}, "think": {"dist": "fixed", "value_s": 0.05},
            "response_s_per_token": 0.0}
BASE = {"name": "conv", "api": "completions", "prompt": "tokens", "duration_s": 20.0,
        "arrival": {"process": "poisson", "rate_rps": 4.0},
        "input": {"dist": "fixed", "value": 200}, "output": {"dist": "fixed", "value": 50}}
SLO_TEXT = "ttft=150ms"


def write_workload(tmp_path: Path, sessions: dict[str, object] | None) -> Path:
    """BASE (and `sessions`) as a workload TOML file: each table's values written inline, as JSON writes them."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in BASE.items() if not isinstance(v, dict)]
    tables = {k: v for k, v in {**BASE, "sessions": sessions or {}}.items() if isinstance(v, dict) and v}
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_inline(v)}" for k, v in table.items()]
    path = tmp_path / "conv.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _inline(v: object) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_inline(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def run_dir(tmp_path: Path, name: str, sessions: dict[str, object] | None, *extra: str) -> Path:
    out = tmp_path / name
    code = main(["run", "--simulate", "--workload", str(write_workload(tmp_path, sessions)), "--num-requests",
                 "160", "--rate", "4", "--out", str(out), "--no-progress", "--slo", SLO_TEXT, *extra])
    assert code in (0, 1)  # 1: the SLO not met (a run past capacity)
    return out


def test_the_summary_hands_the_gate_the_session_metrics() -> None:
    specs = generate(WorkloadSpec.from_dict({**BASE, "sessions": SESSIONS}), seed=1, num_requests=200)
    _, summary = simulate_run(specs, {"max_num_seqs": 2}, seed=1, intervals=False,
                              slo=SLO.parse(SLO_TEXT))
    flat = summary.flat_metrics()
    s = summary.sessions
    assert s is not None
    assert flat["session_attainment"] == s["attainment"]["value"]
    assert flat["session_attainment"] <= flat["attainment"]  # a session misses where any of its turns does
    assert flat["session_time.p99"] == s["duration_s"]["p99"] > flat["session_time.p50"]
    assert flat["session_failed"] == 0.0
    plain = generate(WorkloadSpec.from_dict(BASE), seed=1, num_requests=50)
    _, no_sessions = simulate_run(plain, {}, seed=1, intervals=False, slo=SLO.parse(SLO_TEXT))
    assert not any(k.startswith("session") for k in no_sessions.flat_metrics())


def test_the_gate_checks_the_session_attainment_by_default() -> None:
    workload = {"name": "conv", "hash": "abc", "spec": {}}
    slo = {"ttft_s": 0.15, "target": 0.9, "clock": "scheduled"}

    def side(values: list[float]) -> Samples:
        s = Samples("x", workload, slo, "0")
        for seed, v in enumerate(values, 1):
            s.add("attainment@4", seed, 0.99, "x")
            s.add("session_attainment@4", seed, v, "x")
        return s

    base = side([0.95, 0.96, 0.95, 0.94, 0.95])
    cand = side([0.80, 0.81, 0.79, 0.80, 0.82])  # 15 points worse, the per-request attainment unchanged
    assert "session_attainment=2pt" in [t.text for t in default_thresholds(base, cand)]
    res = gate(base, cand)
    check = next(c for c in res.checks if c.key == "session_attainment@4")
    assert check.verdict == "regression" and "pt worse" in check.message
    assert res.exit_code == 1


def test_a_run_directory_gives_the_gate_its_session_attainment(tmp_path: Path) -> None:
    samples = load_samples([run_dir(tmp_path, "run", SESSIONS)])
    assert set(samples.metrics["session_attainment@4"]) == {0}
    assert "session_time.p50@4" in samples.metrics


def test_the_report_shows_sessions_beside_the_per_request_attainment(tmp_path: Path) -> None:
    out = run_dir(tmp_path, "run", SESSIONS, "--max-num-seqs", "2")
    saved = json.loads((out / "summary.json").read_text())
    page = build_report([out], tmp_path / "report.html").read_text()
    assert re.findall(r'<section id="([a-z]+)"', page)[:3] == ["header", "cliff", "sessions"]
    section = page[page.index('<section id="sessions">'):]
    section = section[:section.index("</section>")]
    cells = re.findall(r"<td>([^<]*)</td>", section)
    s, att = saved["sessions"], saved["attainment"]
    assert cells[1] == str(s["num_sessions"]) and cells[2] == str(s["num_failed"])
    session_att = s["attainment"]
    assert cells[5] == f"{session_att['value']:.1%} [{session_att['ci_low']:.1%}, {session_att['ci_high']:.1%}]"
    # (the report draws the per-request interval again, as its other tables do: the value is the saved one's)
    assert re.fullmatch(re.escape(f"{att['value']:.1%}") + r" \[\d+\.\d%, \d+\.\d%\]", cells[6])
    assert cells[4].split(" / ")[0] == f"{s['duration_s']['p50']:.3f}"
    assert session_att["value"] < att["value"] < 1.0  # past capacity: a session misses where any turn does
    plain = build_report([run_dir(tmp_path, "plain", None)], tmp_path / "plain.html").read_text()
    assert 'id="sessions"' not in plain


@pytest.mark.parametrize("mode", ["scheduled"])
def test_the_scheduled_mode_reports_no_lateness_against_the_estimate(tmp_path: Path, mode: str) -> None:
    out = run_dir(tmp_path, mode, {**SESSIONS, "mode": mode})
    page = build_report([out], tmp_path / "report.html").read_text()
    section = page[page.index('<section id="sessions">'):]
    assert re.findall(r"<td>([^<]*)</td>", section)[7] == "-"


def test_a_session_slo_can_bound_the_session_time() -> None:
    specs = generate(WorkloadSpec.from_dict({**BASE, "sessions": SESSIONS}), seed=1, num_requests=200)
    records, turns_only = simulate_run(specs, {"max_num_seqs": 2}, seed=1, intervals=False, slo=SLO.parse(SLO_TEXT))
    s = turns_only.sessions
    assert s is not None
    bound_s = s["duration_s"]["p50"]
    slo = SLO.parse(f"{SLO_TEXT},session={bound_s * 1e3:.6f}ms")
    assert slo.session_s == pytest.approx(bound_s) and SLO.from_dict(slo.to_dict()) == slo
    assert "session_s" not in SLO.parse(SLO_TEXT).to_dict()  # an SLO without it is written as before
    bounded = summarize(records, slo, intervals="none").sessions
    assert bounded is not None and "ended within" in bounded["attainment"]["rule"]
    # a session meets it only when every turn met the turn SLO and it ended within the bound: about half of
    # those that met the turns' limits, never more
    assert 0 < bounded["attainment"]["num_met"] < s["attainment"]["num_met"]
    assert summarize(records, slo, intervals="none").attainment == summarize(
        records, SLO.parse(SLO_TEXT), intervals="none").attainment  # no request's own limit
    only = SLO.parse("session=90s")  # a session bound alone is an SLO
    assert only.session_s == 90.0 and str(only).startswith("session<=") and SLO.parse(only.as_flag()) == only
