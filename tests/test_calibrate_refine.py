"""Calibrate's refinement on served load (`slobench.profiles.refine`): from open-loop runs it must find the
costs a probe fit got wrong.

Two truths. Virtual: the "measured" runs are simulations of a known profile with 5% step-time noise and a
known request overhead on every time after the send. Served: the reference engine with the modeled executor
on 127.0.0.1, whose steps take a known profile's time plus the engine's own (scheduling, emitting tokens,
~0.3-2 ms on a busy 2-core machine: only adds), and whose HTTP and SSE work comes on top. Both start from
the view an idle server gives of a busy one: every cost too low, the request's fixed cost a sixteenth.

What runs at a few loads can pin down, and what is checked: the held-out rate's percentiles, the unloaded
TTFT, and the cost of a step at the batch those loads hold. How a step's cost splits between a and c at
batches they never hold is the probes' to measure: with 24 requests a rate and noise, a factor on c ends
anywhere from 0.7 to 1.05 of the truth's over seeds (the step at batch 4 within 18%).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.cli.profile import live_setup
from slobench.errors import SpecError, UsageError
from slobench.fleet.simulate import calibrated_extras, simulate_records
from slobench.profiles.refine import (
    MIN_SPLIT_REQUESTS,
    SPLIT_METRICS,
    EngineLimits,
    RatePoint,
    Refinement,
    RefinePlan,
    drift_notes,
    noise_notes,
    overfit_notes,
    percentiles,
    print_refinement,
    refine,
    refine_live,
    scaled,
    with_refinement,
)
from slobench.run.records import RequestRecord, RequestSpec
from slobench.testing.process import EngineServerProcess
from slobench.workload import WorkloadSpec
from slobench.workload.base import RunShape

TRUE = CostProfile("truth", step_overhead_s=0.004, per_prefill_token_s=8e-5, per_decode_seq_s=6e-4,
                   per_context_token_s=2e-6)
O_TRUE_S = 0.008
FAST = scaled(TRUE, {"a": 0.5, "b": 0.6, "c": 0.4})  # an idle server's view of a busy one: every cost too low
O_FAST_S = 0.0005
# the test server's; 256 KV blocks hold what these runs keep in flight and keep each simulation's set-up cheap
LIMITS = EngineLimits(kv_blocks=256, max_num_seqs=64, max_batched_tokens=2048)
SMALL = """\
name = "refine-test"
api = "completions"
prompt = "tokens"
num_requests = 30
token_ids = [32, 256]

[arrival]
process = "poisson"
rate_rps = 10.0

[input]
dist = "uniform"
min = 16
max = 192

[output]
dist = "uniform"
min = 4
max = 24
"""


def decode_s(p: CostProfile, batch: int, context_per_seq: int = 100) -> float:
    return p.step_s(0, batch, batch * context_per_seq)


def unloaded_ttft_s(p: CostProfile, overhead_s: float, n: int = 128) -> float:
    return overhead_s + p.step_s(n, 0, n, n * (n + 1) // 2)


def shifted(records: list[RequestRecord], shift_s: float) -> list[RequestRecord]:
    for r in records:
        r.first_token_s = None if r.first_token_s is None else r.first_token_s + shift_s
        r.done_s = None if r.done_s is None else r.done_s + shift_s
        r.chunk_times_s = [t + shift_s for t in r.chunk_times_s]
    return records


def refine_virtual(tmp_path: Path, num_requests: int, jitter_sd: float, jitter_seed: int, **plan: Any) -> Refinement:
    """`refine` from FAST against "measured" runs that simulate TRUE with this step-time noise, plus O_TRUE_S;
    `plan`: RefinePlan's options."""
    (tmp_path / "w.toml").write_text(SMALL)
    wl = WorkloadSpec.from_toml(tmp_path / "w.toml")

    def specs_for(rate: float) -> list[RequestSpec]:
        return list(wl.specs(RunShape(rate_rps=rate, num_requests=num_requests, seed=0)))

    async def measure(rate: float) -> Sequence[RequestRecord]:
        recs = simulate_records(specs_for(rate), LIMITS.engine(TRUE), jitter_sd=jitter_sd, seed=jitter_seed)
        return shifted(recs, O_TRUE_S)

    return asyncio.run(refine(FAST, O_FAST_S, RefinePlan(num_requests=num_requests, limits=LIMITS, **plan), measure,
                              specs_for, api="completions", workload=wl.name))


@pytest.mark.slow  # seconds of simulation: not the unit tier
def test_refinement_recovers_a_known_profile_from_simulated_served_runs(tmp_path: Path) -> None:
    # the start is 48% and 60% under on what is checked here, and 60-70% off on the held-out percentiles
    start = (decode_s(FAST, 4) / decode_s(TRUE, 4), unloaded_ttft_s(FAST, O_FAST_S) / unloaded_ttft_s(TRUE, O_TRUE_S))
    assert start == (pytest.approx(0.52, abs=0.01), pytest.approx(0.40, abs=0.01))
    ref = refine_virtual(tmp_path, 24, 0.05, 1)
    p = ref.profile
    assert ref.knee_rps is not None and [q.rate_rps for q in ref.points] == pytest.approx(
        [ref.knee_rps * f for f in (0.5, 0.8, 1.1)])
    # tolerances that hold over seeds 0-4 (0.94-1.18 and 0.79-1.00): this seed is 0.98 and 0.97
    assert decode_s(p, 4) == pytest.approx(decode_s(TRUE, 4), rel=0.2), ref.factors
    assert unloaded_ttft_s(p, ref.request_overhead_s) == pytest.approx(unloaded_ttft_s(TRUE, O_TRUE_S), rel=0.25)
    assert p.per_context_token_s == TRUE.per_context_token_s  # d stays the probes'
    held = ref.held_out
    assert held.rate_rps == ref.points[1].rate_rps and sum(q.held_out for q in ref.points) == 1
    assert ref.held_out_error("refined") < 0.1 < 0.5 < ref.held_out_error("probe_only"), (held.measured, held.refined)


@pytest.mark.slow  # seconds of simulation: not the unit tier
def test_the_fit_finds_step_time_noise_and_the_profile_carries_it(tmp_path: Path) -> None:
    # A truth whose steps take their modeled time x (1 + N(0, 0.3)): the simulated engine's steps are exact
    # unless the fit gives them noise, and the p90s need it. 100 requests a rate (what validate_sim sends; at
    # 24 the noise is not identified: 0.00-0.16 found over two seeds). Over seeds 0-1 it found 0.16-0.22.
    ref = refine_virtual(tmp_path, 100, 0.3, 7)
    assert 0.1 < ref.jitter_sd < 0.5, ref.jitter_sd
    assert ref.to_dict()["step_jitter_sd"] == ref.jitter_sd
    prof = with_refinement(FAST, ref)
    assert prof.provenance is not None and prof.provenance["step_jitter_sd"] == ref.jitter_sd
    assert f"step-time noise sd {ref.jitter_sd:.2f}" in "\n".join(_lines(ref))
    # the file calibrate writes carries both into every simulation of it (--simulate, plan)
    (tmp_path / "cal.json").write_text(prof.to_json())
    assert calibrated_extras(CostProfile.load(tmp_path / "cal.json")) == (ref.request_overhead_s, ref.jitter_sd)


def _lines(ref: Refinement) -> list[str]:
    out: list[str] = []
    print_refinement(ref, out.append)
    return out


def test_bad_refinement_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["calibrate", "--url", "http://127.0.0.1:9/v1", "--model", "tiny", "-o", str(tmp_path / "x.json")]
    for extra, named in ((["--refine-rates", "0,1,2"], "--refine-rates"), (["--refine-rates", "1,2"], "--refine-rates"),
                         (["--refine-rates", "1,x,2"], "--refine-rates"), (["--refine-requests", "5"], "--refine-requests"),
                         (["--refine-workload", "no-such"], "--refine-workload"), (["--kv-blocks", "0"], "--kv-blocks"),
                         (["--no-refine", "--max-num-seqs", "32"], "--max-num-seqs"),
                         (["--no-refine", "--fit-inside"], "--fit-inside")):
        assert main([*base, *extra]) == 2, extra  # before any request: the URL is never reached
        assert named in capsys.readouterr().err, extra
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(SpecError, match="rates_rps"):
        RefinePlan(rates_rps=(1.0, -1.0, 2.0))

    def specs_for(rate: float) -> list[RequestSpec]:
        return list(WorkloadSpec.from_toml(tmp_path / "w.toml").specs(RunShape(rate_rps=rate, num_requests=10, seed=0)))

    async def failing(rate: float) -> Sequence[RequestRecord]:
        recs = [RequestRecord(s.request_id, s.arrival_s, sent_s=s.arrival_s) for s in specs_for(rate)]
        for r in recs:
            r.fail("error", "HTTP 400: prompt too long", r.sent_s)
        return recs

    (tmp_path / "w.toml").write_text(SMALL)
    plan = RefinePlan(rates_rps=(5, 10, 20), num_requests=10)
    with pytest.raises(UsageError, match="every request .* 5 req/s failed .*prompt too long"):
        asyncio.run(refine(FAST, O_FAST_S, plan, failing, specs_for, api="completions", workload="w"))
    slow = RefinePlan(rates_rps=(0.05, 0.1, 0.2), num_requests=100)  # 3,500 s of arrivals: refused before a send
    with pytest.raises(UsageError, match="--refine-rates"):
        asyncio.run(refine(FAST, O_FAST_S, slow, failing, specs_for, api="completions", workload="w"))


def test_a_server_that_got_faster_under_more_load_is_flagged() -> None:
    def point(rate: float, ttft_ms: float, tpot_ms: float) -> RatePoint:
        return RatePoint(rate, False, {"ttft_p50": ttft_ms / 1e3, "tpot_p50": tpot_ms / 1e3}, 100, 100)

    steady = [point(4, 110, 26), point(6, 200, 60), point(8, 480, 87)]
    assert drift_notes(steady) == []
    stalled = [point(4, 220, 36), point(6, 1630, 172), point(8, 217, 37)]  # a run on a machine that stalled
    notes = drift_notes(stalled)
    assert len(notes) == 2 and all("at 6 req/s to" in n and "doubtful" in n for n in notes), notes


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The served truth, and the small workload's TOML."""
    tmp = tmp_path_factory.mktemp("refine")
    (tmp / "truth.json").write_text(TRUE.to_json())
    (tmp / "w.toml").write_text(SMALL)
    with EngineServerProcess("--executor", "modeled", "--profile", str(tmp / "truth.json"), "--kv-blocks", "256") as srv:
        yield srv.base_url, tmp / "w.toml"


@pytest.mark.slow
@pytest.mark.integration  # a server on 127.0.0.1
# its held-out percentiles are a served engine's milliseconds: run alone (a CI rehearsal with it beside another
# xdist worker measured a held-out TTFT p90 50% under the fit's; alone, and beside a CPU hog, it passes)
@pytest.mark.timing
def test_refinement_over_http_corrects_a_wrong_profile(served: tuple[str, Path], tmp_path: Path) -> None:
    url, workload = served
    plan = RefinePlan(str(workload), rates_rps=(20.0, 35.0, 50.0), num_requests=20, limits=LIMITS)
    lines: list[str] = []
    ref = asyncio.run(refine_live(live_setup(url, "tiny", plan), FAST, O_FAST_S, plan, write=lines.append))
    assert len(lines) == 3 and "(held out)" in lines[1]
    p = ref.profile
    # What 20 requests a rate on a busy machine can show: the held-out percentiles, and the level of a step at
    # the batch these runs hold (~4). Served steps take the truth's time plus the engine's own and the server's,
    # so that level is bounded both ways; the start is 48% under it. How a, b and c split it is the virtual
    # test's to check: here a step's prefill and decode both grow with the rate, and short noisy runs leave
    # the split loose.
    assert 0.85 * decode_s(TRUE, 4) < decode_s(p, 4) < decode_s(TRUE, 4) + 0.003, ref.factors
    assert ref.held_out_error("refined") < min(0.2, ref.held_out_error("probe_only") / 3), ref.held_out  # 62-67%: 2-13%

    # the record: the refined coefficients, `o` beside them, the probe fit and the refinement, read back from JSON
    print_refinement(ref, lines.append)
    assert any(line.startswith("held-out rate 35 req/s") for line in lines), lines
    probe_fit = replace(FAST, provenance={"kind": "calibrated", "request_overhead_s": O_FAST_S, "probes": []})
    (tmp_path / "cal.json").write_text(with_refinement(probe_fit, ref).to_json())
    back = CostProfile.load(tmp_path / "cal.json")
    prov = back.provenance
    assert replace(back, note="") == replace(p, note="") and back.note.startswith("REFINED")
    assert prov is not None and prov["probes"] == []
    assert prov["request_overhead_s"] == pytest.approx(ref.request_overhead_s)
    assert prov["probe_fit"]["per_decode_seq_s"] * prov["refinement"]["factors"]["c"] == pytest.approx(p.per_decode_seq_s)
    assert prov["probe_fit"]["request_overhead_s"] == O_FAST_S
    rec = prov["refinement"]
    assert rec["rates_rps"] == [20.0, 35.0, 50.0] and rec["held_out_rate_rps"] == 35.0 and rec["knee_rps"] is None
    assert [q["held_out"] for q in rec["points"]] == [False, True, False]
    assert rec["engine_limits"] == {"kv_blocks": 256, "block_size": 16, "max_num_seqs": 64, "max_batched_tokens": 2048}
    assert rec["held_out_error"]["refined"]["mean_abs"] == pytest.approx(ref.held_out_error("refined"))
    assert rec["points"][1]["measured"] == ref.held_out.measured and rec["workload"] == "refine-test"


@pytest.mark.slow
@pytest.mark.integration
def test_cli_keeps_the_probe_fit_when_the_refinement_fails(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # every refinement request fails: a server whose context (4,096 tokens) is larger than its KV cache (64
    # blocks of 16) answers 400 to the refinement's 1,500-token prompts, which it could never complete, while
    # the probes fit. Exit 2, the probe fit written
    (tmp_path / "truth.json").write_text(TRUE.to_json())
    out = tmp_path / "cal.json"
    long_prompts = tmp_path / "long.toml"
    long_prompts.write_text(SMALL.replace("min = 16\nmax = 192", "min = 1500\nmax = 1501"))
    with EngineServerProcess("--executor", "modeled", "--profile", str(tmp_path / "truth.json"), "--kv-blocks", "64",
                             "--max-model-len", "4096") as srv:
        url = srv.base_url
        rc = main(["calibrate", "--url", url, "-o", str(out), "--prompt-lens", "16,96,192", "--batches", "1,6",
                   "--contexts", "32,96", "--output-len", "8", "--repeats", "1", "--kv-blocks", "256",
                   "--refine-workload", str(long_prompts), "--refine-rates", "20,30,40", "--refine-requests", "10"])
    captured = capsys.readouterr()
    assert rc == 2 and "every request" in captured.err and "holds the probe-fitted profile" in captured.err, captured
    assert "written:" in captured.out
    kept = CostProfile.load(out).provenance
    assert kept is not None and kept["kind"] == "calibrated" and kept["probes"] and "refinement" not in kept


def test_ttft_by_prompt_length_splits_at_the_given_length() -> None:
    # 30 requests: prompts of 10..300 tokens, TTFT 1 ms a prompt token: the halves' percentiles are those of
    # their own requests, shifted by the overhead like the whole run's
    recs = []
    for i in range(30):
        r = RequestRecord(i, 0.0, sent_s=0.0, input_tokens=10 * (i + 1))
        r.first_token_s = r.input_tokens * 1e-3
        r.done_s = r.first_token_s + 0.01
        r.chunk_times_s, r.chunk_tokens, r.output_tokens = [r.first_token_s, r.done_s], [1, 1], 2
        recs.append(r)
    p = percentiles(recs, 0.005, split_tokens=150)
    assert set(p) >= set(SPLIT_METRICS)
    assert p["ttft_short_p50"] == pytest.approx(0.005 + 0.080)  # prompts 10..150: median 80
    assert p["ttft_long_p50"] == pytest.approx(0.005 + 0.230)  # 160..300: median 230
    assert p["ttft_short_p90"] < p["ttft_p90"] < p["ttft_long_p90"]
    assert not set(percentiles(recs, 0.0)) & set(SPLIT_METRICS)  # asked for only
    # a half of fewer than MIN_SPLIT_REQUESTS gives nothing to fit: left out, the other half kept
    few = percentiles(recs, 0.0, split_tokens=10 * (30 - MIN_SPLIT_REQUESTS + 1))
    assert "ttft_short_p50" in few and "ttft_long_p50" not in few


@pytest.mark.slow
def test_the_fit_can_leave_o_to_the_probes_and_fit_ttft_by_prompt_length(tmp_path: Path) -> None:
    # The plan's two options, as benchmarks/refit_offline.py compares them: o held at the probes' value (the
    # factors on a, b, c then carry what o did) and the TTFT of each half of the prompts fitted too. Both still
    # correct the wrong start on the held-out rate, and the provenance says which fit it was.
    ref = refine_virtual(tmp_path, 24, 0.05, 1, fit_overhead=False, by_prompt_length=True)
    assert ref.factors["o"] == 1.0 and ref.request_overhead_s == O_FAST_S
    assert ref.held_out_error("refined") < 0.5 * ref.held_out_error("probe_only"), ref.factors
    assert ref.to_dict()["fit_overhead"] is False and ref.to_dict()["by_prompt_length"] is True


def test_a_refinement_worse_than_the_probe_fit_on_the_held_out_rate_is_said() -> None:
    measured = {"ttft_p50": 0.100, "ttft_p90": 0.200, "tpot_p50": 0.010, "tpot_p90": 0.020}
    close = {k: v * 1.05 for k, v in measured.items()}
    far = {k: v * 1.20 for k, v in measured.items()}
    fitted = RatePoint(4.0, False, measured, 100, 100, far, close)

    def held(probe_only: dict[str, float], refined: dict[str, float]) -> RatePoint:
        return RatePoint(6.0, True, measured, 100, 100, probe_only, refined)

    assert overfit_notes([fitted, held(far, close)]) == []  # refined closer: nothing to say
    notes = overfit_notes([fitted, held(close, far)])
    assert len(notes) == 1 and "6 req/s" in notes[0] and "20.0%" in notes[0] and "5.0%" in notes[0], notes
    assert "--refine-requests" in notes[0] and "--no-refine" in notes[0]
    assert overfit_notes([fitted]) == []  # no held-out rate (an interrupted refinement): nothing


@pytest.mark.slow  # seconds of simulation: not the unit tier
def test_a_request_cost_inside_a_serial_server_is_told_from_one_outside_it(tmp_path: Path) -> None:
    # A server that serves one request at a time and spends 6 ms of each request's time inside itself (llama.cpp:
    # tokenizing, setting up) besides 2 ms outside (HTTP). An idle server's probes see 8 ms either way; under
    # load only the inside part queues the others. fit_inside finds it; without it, the fit cannot.
    from dataclasses import replace

    serial = EngineLimits(kv_blocks=256, max_num_seqs=1, max_batched_tokens=2048)
    truth = replace(TRUE, per_request_s=0.006)
    (tmp_path / "w.toml").write_text(SMALL)
    wl = WorkloadSpec.from_toml(tmp_path / "w.toml")

    def specs_for(rate: float) -> list[RequestSpec]:
        return list(wl.specs(RunShape(rate_rps=rate, num_requests=80, seed=0)))

    async def measure(rate: float) -> Sequence[RequestRecord]:
        return shifted(simulate_records(specs_for(rate), serial.engine(truth), jitter_sd=0.02, seed=3), 0.002)

    def run(inside: bool) -> Refinement:
        return asyncio.run(refine(TRUE, 0.008, RefinePlan(num_requests=80, limits=serial, fit_inside=inside), measure,
                                  specs_for, api="completions", workload=wl.name))

    with_r, without = run(True), run(False)
    assert with_r.profile.per_request_s == pytest.approx(0.006, rel=0.5), (with_r.factors, with_r.profile)
    assert without.profile.per_request_s == 0.0
    assert with_r.held_out_error("refined") < without.held_out_error("refined"), (
        with_r.held_out_error("refined"), without.held_out_error("refined"))
    assert any("inside the server" in line for line in _lines(with_r))
    prof = with_refinement(TRUE, with_r)
    assert CostProfile.load(_write(tmp_path, prof)).per_request_s == with_r.profile.per_request_s


def _write(tmp_path: Path, prof: CostProfile) -> Path:
    path = tmp_path / "inside.json"
    path.write_text(prof.to_json())
    return path


def test_noise_at_its_bound_is_said() -> None:
    from slobench.profiles.refine import MAX_JITTER

    assert noise_notes(0.3) == [] and noise_notes(MAX_JITTER * 0.98) == []
    (note,) = noise_notes(MAX_JITTER)
    assert "reached its bound" in note and "p90s" in note
