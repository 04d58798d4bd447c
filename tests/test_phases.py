"""Phases, request classes and rate curves: the schedule a time-varying spec generates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from slobench.errors import SpecError
from slobench.workload import (
    CurveArrivals,
    DiurnalArrivals,
    WorkloadSpec,
    generate,
    load_workload,
    phase_boundaries,
)

TWO_PHASE = """\
name = "shift"
[class.doc]
input = {dist = "fixed", value = 400}
output = {dist = "fixed", value = 5}
[class.gen]
input = {dist = "fixed", value = 10}
output = {dist = "fixed", value = 100}

[[phase]]
name = "morning"
duration_s = 100
rate_rps = 50.0
mix = {doc = 3, gen = 1}

[[phase]]
name = "afternoon"
duration_s = 100
arrival = {process = "gamma", rate_rps = 25.0, cv = 2.0}
mix = {doc = 1, gen = 3}
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ratio(reqs) -> float:
    return sum(r.input_tokens for r in reqs) / sum(r.max_tokens for r in reqs)


def expected_ratio(weights: dict[str, float], lengths: dict[str, tuple[float, float]]) -> float:
    total = sum(weights.values())
    mean_in = sum(w * lengths[c][0] for c, w in weights.items()) / total
    mean_out = sum(w * lengths[c][1] for c, w in weights.items()) / total
    return mean_in / mean_out


def test_two_phase_spec_shifts_the_prefill_decode_ratio_as_specified(tmp_path):
    spec = WorkloadSpec.from_toml(write(tmp_path, TWO_PHASE))
    reqs = generate(spec, seed=7)
    morning = [r for r in reqs if r.tag.startswith("morning/")]
    afternoon = [r for r in reqs if r.tag.startswith("afternoon/")]
    assert len(morning) + len(afternoon) == len(reqs)
    assert {r.tag for r in reqs} == {"morning/doc", "morning/gen", "afternoon/doc", "afternoon/gen"}
    assert max(r.arrival_s for r in morning) < 100 <= min(r.arrival_s for r in afternoon)
    assert max(r.arrival_s for r in afternoon) < 200
    lengths = {"doc": (400, 5), "gen": (10, 100)}
    want_m = expected_ratio({"doc": 3, "gen": 1}, lengths)  # 1210/115 = 10.5: prefill-heavy
    want_a = expected_ratio({"doc": 1, "gen": 3}, lengths)  # 430/305 = 1.41: decode-heavier
    assert ratio(morning) == pytest.approx(want_m, rel=0.10)
    assert ratio(afternoon) == pytest.approx(want_a, rel=0.10)
    assert ratio(morning) / ratio(afternoon) > 6
    # Each phase at its own rate, each class at its weight.
    assert len(morning) == pytest.approx(5000, rel=0.05)
    assert len(afternoon) == pytest.approx(2500, rel=0.15)  # gamma cv 2 counts vary more
    share = Counter(r.tag for r in morning)["morning/doc"] / len(morning)
    assert share == pytest.approx(0.75, abs=0.03)
    # Tagged classes keep their own lengths.
    assert all(r.input_tokens == 400 and r.max_tokens == 5 for r in reqs if r.tag.endswith("/doc"))


def test_phase_boundaries_for_the_manifest(tmp_path):
    spec = WorkloadSpec.from_toml(write(tmp_path, TWO_PHASE))
    assert phase_boundaries(spec) == [{"name": "morning", "start_s": 0.0}, {"name": "afternoon", "start_s": 100.0}]
    assert phase_boundaries(spec, duration_s=100) == [{"name": "morning", "start_s": 0.0}]
    assert phase_boundaries(load_workload("chat")) == []


def test_duration_and_count_cut_a_phased_run(tmp_path):
    spec = WorkloadSpec.from_toml(write(tmp_path, TWO_PHASE))
    cut = generate(spec, seed=1, duration_s=120)
    assert max(r.arrival_s for r in cut) < 120 and any(r.tag.startswith("afternoon/") for r in cut)
    first = generate(spec, seed=1, num_requests=10)
    assert len(first) == 10
    full = generate(spec, seed=1)
    assert [(r.arrival_s, r.tag, r.input_tokens) for r in first] == [(r.arrival_s, r.tag, r.input_tokens) for r in full[:10]]


def test_rate_rescales_every_phase_by_one_factor(tmp_path):
    spec = WorkloadSpec.from_toml(write(tmp_path, TWO_PHASE))
    reqs = generate(spec, seed=3, rate_rps=7.5)  # the mean of 50 and 25 is 37.5: one fifth
    morning = sum(r.tag.startswith("morning/") for r in reqs)
    afternoon = len(reqs) - morning
    assert morning == pytest.approx(1000, rel=0.12)
    assert afternoon == pytest.approx(500, rel=0.3)
    assert generate(spec, seed=3, rate_rps=7.5) == reqs  # deterministic


def test_top_level_mix_without_phases_tags_name_and_class(tmp_path):
    text = 'num_requests = 400\nmix = {doc = 1, gen = 1}\n' + TWO_PHASE.split("[[phase]]")[0]
    spec = WorkloadSpec.from_toml(write(tmp_path, text))
    reqs = generate(spec, seed=0)
    assert len(reqs) == 400 and {r.tag for r in reqs} == {"shift/doc", "shift/gen"}
    assert phase_boundaries(spec) == []


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("mix = {doc = 3, gen = 1}", "mix = {doc = 3, nope = 1}"), "phase.morning.mix"),
        (("duration_s = 100\nrate_rps = 50.0", "rate_rps = 50.0"), "phase[0].duration_s"),
        (("rate_rps = 50.0", "rate_rps = 50.0\narrival = {process = \"poisson\", rate_rps = 1.0}"), "phase[0].rate_rps"),
        (("mix = {doc = 3, gen = 1}", "mix = {doc = 3, gen = 1}\ncolour = 1"), "phase[0].colour"),
        (("mix = {doc = 3, gen = 1}", "mix = {doc = 0, gen = 0}"), "phase[0].mix"),
        (("[class.gen]\ninput", "[class.gen]\ninptu = 1\ninput"), "class.gen.inptu"),
        (('name = "morning"', 'name = "a/b"'), "phase[0].name"),
    ],
)
def test_bad_phase_specs_name_the_field(tmp_path, edit, field):
    with pytest.raises(SpecError) as info:
        WorkloadSpec.from_toml(write(tmp_path, TWO_PHASE.replace(*edit, 1)))
    assert info.value.field == field


@pytest.mark.parametrize("name", ["day-shift", "diurnal", "sessions", "system-prompts"])
def test_new_bundled_specs_round_trip(name):
    spec = load_workload(name)
    assert spec.description and WorkloadSpec.from_dict(spec.to_dict()) == spec
    assert generate(spec, seed=0, num_requests=20)


def test_bundled_day_shift_is_prefill_heavy_then_decode_heavy():
    spec = load_workload("day-shift")
    reqs = generate(spec, seed=2, rate_rps=10.0)
    rng = np.random.default_rng(0)
    lengths = {c.name: (c.input.sample(200_000, rng).mean(), c.output.sample(200_000, rng).mean()) for c in spec.classes}
    for phase in spec.phases:
        got = ratio([r for r in reqs if r.tag.startswith(phase.name + "/")])
        assert got == pytest.approx(expected_ratio(dict(phase.mix), lengths), rel=0.15), phase.name
    morning = ratio([r for r in reqs if r.tag.startswith("morning/")])
    afternoon = ratio([r for r in reqs if r.tag.startswith("afternoon/")])
    assert morning > 10 and afternoon < 1


# ---- rate curves ----------------------------------------------------------------------------------


def test_diurnal_thinning_follows_the_sinusoid():
    proc = DiurnalArrivals(rate_rps=40.0, peak_to_trough=4.0, period_s=100.0)
    t = proc.schedule(np.random.default_rng(1), duration_s=2000.0)  # 20 periods, ~80k arrivals
    assert len(t) / 2000.0 == pytest.approx(40.0, rel=0.02)
    phase = t % 100.0
    near_peak = np.sum(np.abs(phase - 50.0) < 5.0)  # the default peak is mid-period
    near_trough = np.sum((phase < 5.0) | (phase > 95.0))
    grid = np.linspace(-5, 5, 1001)
    want = proc.rate_at(50.0 + grid).mean() / proc.rate_at(grid).mean()
    assert near_peak / near_trough == pytest.approx(want, rel=0.08)
    assert proc.rate_at(np.array([50.0]))[0] / proc.rate_at(np.array([0.0]))[0] == pytest.approx(4.0)
    assert np.all(np.diff(t) >= 0)
    first = proc.schedule(np.random.default_rng(1), num_requests=100)
    assert len(first) == 100 and np.array_equal(first, t[:100])


def test_curve_rates_interpolate_between_points():
    proc = CurveArrivals(((0.0, 100.0), (10.0, 100.0), (20.0, 300.0)))
    assert proc.rate_rps == pytest.approx(150.0)
    t = proc.schedule(np.random.default_rng(4), duration_s=30.0)
    assert np.sum(t < 10) == pytest.approx(1000, rel=0.08)
    assert np.sum((t >= 10) & (t < 20)) == pytest.approx(2000, rel=0.08)
    assert np.sum(t >= 20) == pytest.approx(3000, rel=0.08)  # flat after the last point
    assert proc.with_rate(75.0).points == ((0.0, 50.0), (10.0, 50.0), (20.0, 150.0))


def test_bundled_diurnal_spec_peaks_mid_run():
    spec = load_workload("diurnal")
    t = np.array([r.arrival_s for r in generate(spec, seed=5)])
    assert len(t) == pytest.approx(2400, rel=0.08)
    peak = np.sum((t > 250) & (t < 350))
    trough = np.sum((t < 50) | (t > 550))
    assert peak > 5 * trough


@pytest.mark.parametrize(
    "table",
    [
        {"process": "diurnal", "rate_rps": 1.0, "peak_to_trough": 0.5, "period_s": 10.0},
        {"process": "diurnal", "rate_rps": 1.0, "period_s": 10.0},
        {"process": "curve", "points": [[0, 1], [0, 2]]},
        {"process": "curve", "points": [[0, 0]]},
        {"process": "curve", "points": 3},
    ],
)
def test_bad_curves_are_spec_errors(table):
    with pytest.raises(SpecError):
        WorkloadSpec.from_dict({"name": "x", "arrival": table, "input": {"dist": "fixed", "value": 1},
                                "output": {"dist": "fixed", "value": 1}, "num_requests": 3})
