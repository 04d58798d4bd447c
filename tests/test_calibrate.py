"""`slobench calibrate`: designed probes of a live endpoint recover a known cost profile.

The server is the reference engine with the modeled executor on 127.0.0.1, whose steps take exactly the
time a given profile says (it waits on the real clock), so the fit has a truth to find. Coefficients are
large enough (ms) that the machine's scheduling jitter does not decide the result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import SpecError, UsageError
from slobench.profiles.calibrate import Probe, ProbePlan, calibrate, decode_row, fit, prefill_row
from slobench.testing.process import EngineServerProcess

pytestmark = pytest.mark.integration

TRUE = CostProfile("truth", step_overhead_s=0.004, per_prefill_token_s=8e-5, per_decode_seq_s=6e-4,
                   per_context_token_s=2e-6)
PLAN = ProbePlan(prompt_lens=(16, 64, 128, 192, 256, 320), batches=(1, 6, 12), contexts=(32, 160), output_len=10, repeats=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("cal") / "truth.json"
    path.write_text(TRUE.to_json())
    with EngineServerProcess("--executor", "modeled", "--profile", str(path), "--kv-blocks", "1024") as srv:
        yield srv.base_url


def test_fit_recovers_exact_synthetic_probes() -> None:
    # no server: probes computed from a profile with an attention-pair term and a request overhead
    truth = CostProfile("t", 0.003, 5e-5, 4e-4, 1e-6, attention_per_pair_s=2e-9)
    rows = [(prefill_row(n), "prefill") for n in (16, 64, 128, 256, 512, 1024)]
    rows += [(decode_row(b, b * c), "decode") for b in (1, 4, 16) for c in (50, 300)]
    probes = []
    for i, (row, kind) in enumerate(rows):
        p = Probe(kind, str(i), row, 0.0, held_out=i % 3 == 1)
        p.measured_s = truth.step_s(*(int(x) for x in row[1:5])) + 0.002 * row[5]
        probes.append(p)
    prof, overhead = fit(probes, "fitted")
    assert overhead == pytest.approx(0.002, rel=1e-3)
    for k in ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s",
              "attention_per_pair_s"):
        assert getattr(prof, k) == pytest.approx(getattr(truth, k), rel=1e-3, abs=1e-12), k
    assert max(abs(p.error) for p in probes) < 1e-6


# its bounds are a served engine's milliseconds (the step overhead within 4 ms): run alone, as a busy
# neighbour (another xdist worker on a loaded machine) can stretch that overhead past 9 ms
@pytest.mark.timing
def test_calibrate_recovers_a_served_profile(server: str) -> None:
    # three rounds, as calibrate's default: each prefill probe is one request a round, and the median of three
    # keeps one late wake-up of a busy machine from being the probe's value
    cal = asyncio.run(calibrate(server, "tiny", replace(PLAN, repeats=3)))
    p = cal.profile
    # a served step takes the modeled time plus the engine's own (scheduling, emitting tokens: ~0.3-2 ms on
    # a busy 2-core machine), which only adds: the fixed part is bounded both ways, the slopes are the truth's
    assert TRUE.step_overhead_s * 0.9 < p.step_overhead_s < TRUE.step_overhead_s + 0.004, p
    decode_slope = p.step_s(0, 12, 12 * 200) - p.step_s(0, 1, 200)
    assert decode_slope == pytest.approx(TRUE.step_s(0, 12, 12 * 200) - TRUE.step_s(0, 1, 200), rel=0.25), p

    def prefill(prof: CostProfile, n: int) -> float:
        return prof.step_s(n, 0, n, n * (n + 1) // 2)

    assert prefill(p, 288) - prefill(p, 32) == pytest.approx(prefill(TRUE, 288) - prefill(TRUE, 32), rel=0.25), p
    held = cal.held_out_errors()
    assert len(held) >= 3 and np.median(held) < 0.15, [(q.label, q.error) for q in cal.probes]
    assert 0 <= cal.request_overhead_s < 0.05


def test_cli_writes_a_profile_with_provenance(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal.json"
    rc = main(["calibrate", "--url", server, "-o", str(out), "--prompt-lens", "16,96,192", "--batches", "1,6",
               "--contexts", "32,96", "--output-len", "8", "--repeats", "1", "--no-refine"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "held-out decode" in printed and "held out" in printed
    prof = CostProfile.load(out)
    prov = prof.provenance
    assert prov is not None and prov["url"] == server and prov["model"] == "tiny"
    assert prov["plan"]["batches"] == [1, 6] and len(prov["probes"]) >= 5
    assert set(prov["held_out_error"]) == {"prefill_median", "prefill_max", "decode_median", "decode_max"}
    assert "CALIBRATED" in json.loads(out.read_text())["note"]


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--url", "http://127.0.0.1:9/v1", "-o", str(tmp_path / "x.json"),
                 "--batches", "0,4"]) == 2
    assert "batches" in capsys.readouterr().err
    with pytest.raises(SpecError, match="prompt_lens"):
        ProbePlan(prompt_lens=(16, 64))
    assert main(["calibrate", "--url", "http://127.0.0.1:9/v1", "-o", str(tmp_path / "no" / "x.json")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["calibrate", "--url", "http://127.0.0.1:9/v1", "--model", "tiny", "-o", str(tmp_path / "x.json")]) == 3


# its bound is the served engine's milliseconds too (step 4 within 4 ms of the truth): run alone, like the
# test above
@pytest.mark.timing
def test_a_server_decoding_fewer_than_a_batch_is_named_with_both_readings(tmp_path: Path) -> None:
    # the served engine runs at most 4 sequences a step: the probes' batch 6 can never decode together. That
    # alone cannot tell a server's limit from a proxy relaying streams late (LiteLLM showed "4 of 8 at once"
    # in front of an engine taking all 8), so calibrate stops saying both, and names the batches that fit
    path = tmp_path / "truth.json"
    path.write_text(TRUE.to_json())
    with EngineServerProcess("--executor", "modeled", "--profile", str(path), "--kv-blocks", "1024",
                             "--max-num-seqs", "4") as srv:
        with pytest.raises(UsageError, match="batch 6 never decoded all together.*at most 4.*--batches up to 4"):
            asyncio.run(calibrate(srv.base_url, "tiny", PLAN))
        fits = ProbePlan(prompt_lens=PLAN.prompt_lens, batches=(1, 2, 4), contexts=PLAN.contexts, output_len=10,
                         repeats=1)
        cal = asyncio.run(calibrate(srv.base_url, "tiny", fits))
    assert cal.max_num_seqs is None and not any("at a time" in n for n in cal.notes), cal.notes
    # a step of 4 sequences takes the truth's time plus the served engine's own (as in the test above)
    step4 = cal.profile.step_s(0, 4, 4 * 100)
    assert TRUE.step_s(0, 4, 4 * 100) * 0.9 < step4 < TRUE.step_s(0, 4, 4 * 100) + 0.004, cal.profile


def test_decoding_together_counts_overlapping_decode_windows() -> None:
    from slobench.profiles.calibrate import max_decoding_together, served_batches
    from slobench.run.records import RequestRecord

    def rec(first: float, last: float) -> RequestRecord:
        r = RequestRecord(0, 0.0)
        r.first_token_s, r.chunk_times_s = first, [first, (first + last) / 2, last]
        return r

    serial = [rec(i, i + 1) for i in range(5)]  # one after another; each starts as the last one ends
    assert max_decoding_together(serial) == 1
    batched = [rec(0.1 * i, 3 + 0.1 * i) for i in range(6)] + [rec(4, 5)]
    assert max_decoding_together(batched) == 6
    assert served_batches((1, 4, 8, 16, 32), 1) == (1,)  # one at a time: batch 1 alone
    assert served_batches((1, 4, 8, 16, 32), 12) == (1, 4, 8, 16, 32)  # no limit read from a partial overlap
    assert served_batches((4, 8), 1) == (1,)


def test_probes_no_engine_could_produce_are_said() -> None:
    from slobench.profiles.calibrate import retiming_notes

    def probes(decode_ms: dict[int, float], prefill_ms: dict[int, float]) -> list[Probe]:
        out = [Probe("decode", f"batch {b}", decode_row(b, b * 100.0), ms / 1e3, False) for b, ms in decode_ms.items()]
        return out + [Probe("prefill", f"prompt {n}", prefill_row(n), ms / 1e3, False) for n, ms in prefill_ms.items()]

    engine = probes({1: 1.6, 4: 2.2, 8: 2.9}, {16: 7.5, 256: 21.0})
    assert retiming_notes(engine) == []
    proxied = probes({1: 1.7, 4: 1.5, 8: 0.7}, {16: 77.0, 128: 52.0, 256: 53.0})  # LiteLLM's, 2026-12-02
    notes = retiming_notes(proxied)
    assert len(notes) == 2 and "1.70 ms at batch 1 to 0.70 ms at batch 8" in notes[0] and "77.0 ms" in notes[1]


def test_round_speeds_read_the_rounds_against_their_median() -> None:
    from slobench.profiles.calibrate import round_speeds

    # three probes, the third round 30% slower for every one: the rounds read 1, 1 and 1.3
    assert round_speeds([[1.0, 1.0, 1.3], [2.0, 2.0, 2.6], [5.0, 5.0, 6.5]]) == pytest.approx([1.0, 1.0, 1.3])
    # one probe's noise does not move a round: the median over probes reads the machine
    assert round_speeds([[1.0, 1.0, 1.3], [2.0, 2.0, 2.6], [5.0, 9.0, 6.5]]) == pytest.approx([1.0, 1.0, 1.3])
    assert round_speeds([[1.0], [2.0]]) == [] and round_speeds([]) == []


def test_calibrate_says_when_the_servers_speed_moved_between_rounds(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import slobench.profiles.calibrate as calmod

    plan = ProbePlan(prompt_lens=(16, 64, 128), batches=(1, 6), contexts=(32, 64), output_len=8, repeats=2)
    cal = asyncio.run(calibrate(server, "tiny", plan))
    # the modeled server's steps sleep what its profile says: each round reads near the median (how near is
    # the machine's: a loaded one wakes the sleeps late), and a note comes exactly when they spread past x1.1
    assert len(cal.round_speeds) == 2 and all(0.5 < x < 2.0 for x in cal.round_speeds), cal.round_speeds
    spread = max(cal.round_speeds) / min(cal.round_speeds)
    assert bool([n for n in cal.notes if "speed moved" in n]) == (spread > calmod.SPEED_SPREAD_NOTE), cal.notes
    real = calmod.measure

    async def drifting(*a: object, **kw: object) -> list[Probe]:
        probes = await real(*a, **kw)  # type: ignore[arg-type]
        kw["info"]["round_speeds"] = [0.95, 1.3]  # type: ignore[index]  (as a machine that slowed down would read)
        return probes

    monkeypatch.setattr(calmod, "measure", drifting)
    cal = asyncio.run(calibrate(server, "tiny", plan))
    said = [n for n in cal.notes if "speed moved" in n]
    assert said and "x0.95, x1.30" in said[0] and "by x1.37" in said[0], cal.notes
    assert calmod.with_provenance(cal, server, "tiny", plan).provenance["round_speeds"] == [0.95, 1.3]  # type: ignore[index]
