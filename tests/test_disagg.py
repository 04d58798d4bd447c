"""Disaggregated prefill/decode fleets on the virtual clock (slobench.fleet.disagg): the link's arithmetic, KV
capacity on both sides, and what moving prefills off the decode instance buys."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reference_engine.executor.modeled_executor import CostProfile
from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import SLO
from slobench.cli import main
from slobench.errors import EngineConfigError
from slobench.fleet.disagg import DisaggFleet, KVLink, kv_bytes_per_token
from slobench.fleet.simulate import ModeledEngine, simulate_records, simulate_run
from slobench.run.records import RequestSpec

PROFILE = CostProfile("exact", step_overhead_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.002,
                      per_context_token_s=0.0001)
ENGINE = ModeledEngine(PROFILE, kv_blocks=256)
BPT = kv_bytes_per_token("llama-3.2-1b")


def spec(rid: int, arrival_s: float, n_in: int = 100, n_out: int = 20) -> RequestSpec:
    ids = tuple(40 + (97 * rid + 31 * k) % 200 for k in range(n_in))  # no shared prefix between requests
    return RequestSpec(rid, arrival_s, ids, n_in, n_out)


def pd(link: str, **kw: int) -> DisaggFleet:
    return DisaggFleet(kw.get("prefill", 1), kw.get("decode", 1), kw.get("colocated", 0), KVLink.parse(link), BPT)


def test_link_and_bytes_per_token_parse() -> None:
    assert KVLink.parse("50GB/s,20us") == KVLink(50e9, 20e-6)
    assert KVLink.parse("400Gbit/s,1.5ms") == KVLink(50e9, 1.5e-3)
    assert KVLink.parse("1GiB/s,0") == KVLink(2**30, 0.0)
    assert math.isinf(KVLink.parse("inf,0").bandwidth_Bps)
    for bad in ("fast", "50GB/s", "50GB,20us", "0GB/s,1us", "50GB/s,-1us", "50GB/s,20"):
        with pytest.raises(EngineConfigError, match="kv_link"):
            KVLink.parse(bad)
    assert BPT == 2 * 16 * 8 * 64 * 2  # Llama-3.2-1B: 16 layers, 8 KV heads of 64, bf16: 32 KiB a token
    assert kv_bytes_per_token("tiny") == 2 * 4 * 2 * 32 * 2
    with pytest.raises(EngineConfigError, match="model config"):
        kv_bytes_per_token("gpt-9")
    with pytest.raises(EngineConfigError, match="prefill and one decode"):
        DisaggFleet(1, 0)


def test_slow_link_adds_exactly_bytes_over_bandwidth_plus_latency_to_ttft() -> None:
    specs = [spec(i, 1.0 * i, n_in=100 + 37 * i) for i in range(6)]  # one at a time: nothing queues
    free = simulate_records(specs, ENGINE, disagg=pd("inf,0"))
    slow = simulate_records(specs, ENGINE, disagg=pd("1GB/s,250us"))
    for f, s in zip(free, slow, strict=True):
        transfer = f.prompt_tokens * BPT / 1e9 + 250e-6
        assert f.status == s.status == "ok" and s.output_tokens == f.output_tokens == 20
        assert s.first_token_s - f.first_token_s == pytest.approx(transfer, abs=1e-12)
        assert s.done_s - f.done_s == pytest.approx(transfer, abs=1e-12)  # decode itself is unchanged
    # and the free link's TTFT is the prefill alone: one step of the whole prompt, as a lone engine's
    (alone,) = simulate_records([specs[0]], ENGINE)
    assert free[0].first_token_s == alone.first_token_s


def test_ttft_waits_for_room_on_the_decode_side() -> None:
    # each request needs ceil(120/16) = 8 blocks on the decode instance, which has 10: one at a time
    small = ModeledEngine(PROFILE, kv_blocks=10)
    specs = [spec(i, 0.001 * i, n_in=100, n_out=20) for i in range(4)]
    recs = simulate_records(specs, small, disagg=pd("inf,0"))
    assert all(r.status == "ok" and r.output_tokens == 20 for r in recs)
    spans = sorted((r.first_token_s, r.done_s) for r in recs)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))  # no overlap


def test_prefill_side_keeps_the_prompts_kv_until_the_bytes_have_left() -> None:
    # 100-token prompts (7 blocks; a 0.12 s prefill step) over a link that takes exactly 1 s per prompt.
    # With room for one prompt only, the second prefill waits for the first one's bytes to leave (1.12 s);
    # with room to spare it runs at once (0.12 s) and only its transfer queues behind the first on the link.
    specs = [spec(0, 0.0, n_out=2), spec(1, 0.05, n_out=2)]
    link = f"{100 * BPT / 1e6:g}MB/s,0"
    roomy = simulate_records(specs, ModeledEngine(PROFILE, kv_blocks=256), disagg=pd(link))
    tight = simulate_records(specs, ModeledEngine(PROFILE, kv_blocks=10), disagg=pd(link))
    for recs in (roomy, tight):
        assert recs[0].first_token_s == pytest.approx(1.12)
    assert roomy[1].first_token_s == pytest.approx(2.12)  # prefilled 0.12-0.24, sent 1.12-2.12
    assert tight[1].first_token_s == pytest.approx(2.24)  # prefilled 1.12-1.24, sent 1.24-2.24


def test_free_link_pd_does_not_lose_tpot_to_a_colocated_pair_on_decode_heavy_work() -> None:
    # Expected sign: on a co-located engine every prefill joins a step that also decodes, stretching that
    # step for every running request (a 1,500-token prompt adds ~10 ms to a ~2.5 ms decode step with the
    # h100-llama-1b profile); the decode instance of 1P+1D never computes a prompt, so its steps are decode
    # steps only, and with a free link the handoff costs nothing. The one decode instance carries both
    # halves' batches, which is cheap only while (a) its KV holds them all (8,192 blocks here: no
    # preemption, whose recompute would be a prefill again) and (b) a decode step costs mostly its fixed
    # overhead (20 us a request, 10 ns a context token). Under those, TPOT p99 of 1P+1D <= the pair's.
    # With longer contexts or a smaller cache the sign can flip (at 20 req/s of 1-3k-token prompts on
    # 4,096 blocks it does). It cannot beat the pair by more than the interference: no TPOT is below a
    # decode step of one request.
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 30.0, 300))
    specs = [spec(i, float(t), n_in=int(rng.integers(1000, 2000)), n_out=int(rng.integers(100, 200)))
             for i, t in enumerate(arrivals)]
    engine = ModeledEngine("h100-llama-1b", kv_blocks=8192)
    pair = RecordArrays.from_records(simulate_records(specs, engine, replicas=2))
    split = RecordArrays.from_records(simulate_records(specs, engine, disagg=pd("inf,0")))
    assert np.all(split.is_ok) and np.all(pair.is_ok)
    p99 = {name: float(np.nanquantile(a.tpot_s, 0.99)) for name, a in (("pair", pair), ("split", split))}
    assert p99["split"] <= p99["pair"], p99
    profile = engine.cost_profile()
    lone_decode_s = profile.step_overhead_s + profile.per_decode_seq_s
    assert np.nanmin(split.tpot_s) >= lone_decode_s


def test_mixed_fleet_records_are_ordinary_and_summarised() -> None:
    knobs = {"profile": "h100-llama-1b", "kv_blocks": 512, "model": "llama-3.2-1b", "prefill_replicas": 1,
             "decode_replicas": 2, "colocated_replicas": 1, "kv_link": "50GB/s,20us"}
    specs = [spec(i, 0.02 * i, n_in=200 + 13 * i, n_out=30) for i in range(80)]
    records, summary = simulate_run(specs, knobs, slo=SLO.parse("ttft=300ms,tpot=40ms"), intervals=False)
    fleet = summary.fleet
    assert fleet["prefill"] == 1 and fleet["decode"] == 2 and fleet["colocated"] == 1 and fleet["replicas"] == 4
    assert sum(fleet["requests_per_replica"][:2]) == 80  # the front pool: co-located and prefill
    assert fleet["kv_handoffs"] == sum(fleet["requests_per_replica"][2:]) == fleet["requests_per_replica"][1]
    assert {r.replica for r in records} == {0, 1}
    assert all(r.status == "ok" and r.output_tokens == 30 == len(r.chunk_times_s) for r in records)
    assert all(r.first_token_s == r.chunk_times_s[0] and r.done_s == r.chunk_times_s[-1] for r in records)
    assert summary.attainment.value > 0 and summary.tpot.p50 is not None


def test_cli_runs_a_disaggregated_fleet_and_refuses_bad_ones(tmp_path, capsys) -> None:  # noqa: ANN001
    base = ["run", "--simulate", "--workload", "tiny", "--num-requests", "20", "--rate", "10", "--no-progress"]
    rc = main([*base, "--out", str(tmp_path / "ok"), "--prefill-replicas", "1", "--decode-replicas", "1",
               "--kv-link", "50GB/s,20us"])
    assert rc == 0
    for flags, words in (
        (["--prefill-replicas", "1"], "at least one prefill and one decode"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "fast"], "kv_link"),
        (["--prefill-replicas", "1", "--decode-replicas", "-2"], "decode_replicas"),
        (["--kv-link", "1GB/s,1us"], "need --prefill-replicas"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"], "--colocated-replicas"),
    ):
        capsys.readouterr()
        rc = main([*base, "--out", str(tmp_path / "bad"), *flags])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, (flags, err)


def test_deterministic_for_a_seed_with_jitter() -> None:
    specs = [spec(i, 0.03 * i, n_in=150 + 7 * i, n_out=25) for i in range(60)]
    fleet = pd("20GB/s,30us", prefill=2, decode=2, colocated=1)
    runs = [simulate_records(specs, ENGINE, disagg=fleet, jitter_sd=0.05, seed=s) for s in (1, 1, 2)]
    assert [r.to_json() for r in runs[0]] == [r.to_json() for r in runs[1]]
    assert [r.done_s for r in runs[0]] != [r.done_s for r in runs[2]]
    with pytest.raises(EngineConfigError, match="colocated_replicas"):
        simulate_records(specs, ENGINE, disagg=fleet, replicas=2)


def test_the_decode_pool_runs_its_own_engine() -> None:
    slow_decode = ModeledEngine(PROFILE.scaled(2.0), kv_blocks=256)
    specs = [spec(i, 1.0 * i) for i in range(4)]  # one at a time
    same = simulate_records(specs, ENGINE, disagg=pd("inf,0"))
    fleet = DisaggFleet(1, 1, 0, KVLink.parse("inf,0"), BPT, decode_engine=slow_decode)
    own = simulate_records(specs, ENGINE, disagg=fleet)
    for a, b in zip(same, own, strict=True):
        assert b.first_token_s == a.first_token_s  # the prefill pool is unchanged
        assert b.done_s - b.first_token_s == pytest.approx(2 * (a.done_s - a.first_token_s), rel=1e-12)


def test_first_token_from_the_prefill_instance_moves_the_transfer_into_tpot() -> None:
    specs = [spec(i, 1.0 * i, n_in=100 + 37 * i) for i in range(4)]
    link = KVLink.parse("1GB/s,250us")
    landed = simulate_records(specs, ENGINE, disagg=DisaggFleet(1, 1, 0, link, BPT))
    early = simulate_records(specs, ENGINE, disagg=DisaggFleet(1, 1, 0, link, BPT, first_token_from="prefill"))
    for a, b in zip(landed, early, strict=True):
        transfer = a.prompt_tokens * BPT / 1e9 + 250e-6
        assert a.first_token_s - b.first_token_s == pytest.approx(transfer, abs=1e-12)
        assert b.done_s == a.done_s and b.output_tokens == a.output_tokens == 20
        assert len(b.chunk_times_s) == 20
    with pytest.raises(Exception, match="first_token_from"):
        DisaggFleet(1, 1, first_token_from="client")


def test_decode_pool_knobs_replace_the_fleets_profile_and_blocks(tmp_path) -> None:  # noqa: ANN001
    fast, slow = tmp_path / "fast.json", tmp_path / "slow.json"
    fast.write_text(PROFILE.to_json())
    slow.write_text(PROFILE.scaled(2.0).to_json())
    knobs = {"profile": str(fast), "kv_blocks": 256, "model": "llama-3.2-1b", "prefill_replicas": 1,
             "decode_replicas": 1}
    specs = [spec(i, 1.0 * i) for i in range(4)]  # one at a time
    same = simulate_records(specs, knobs)
    own = simulate_records(specs, {**knobs, "decode_profile": str(slow), "decode_kv_blocks": 64})
    for a, b in zip(same, own, strict=True):
        assert b.first_token_s == a.first_token_s
        assert b.done_s - b.first_token_s == pytest.approx(2 * (a.done_s - a.first_token_s), rel=1e-9)
    with pytest.raises(Exception, match="decode_kv_blocks"):
        simulate_records(specs, {**knobs, "decode_kv_blocks": 0})


def ds(link: str, engine: ModeledEngine | None = None, frac: float = 0.05) -> DisaggFleet:
    """DistServe's fleet: the first token from the prefill instance, the decode instance admitting as its
    decoding-stage scheduler does."""
    return DisaggFleet(1, 1, 0, KVLink.parse(link), BPT, decode_engine=engine, first_token_from="prefill",
                       decode_admission="distserve", admit_block_frac=frac)


def test_distserve_admission_pulls_between_steps_while_the_decode_loop_waits() -> None:
    # A decodes alone; B's prefill ends while A's decode step is under way. B is accepted when that step
    # ends (not when its KV is ready), its KV pulled while the loop waits: the step after it (A's and B's
    # first together) starts T later than on an instant link, so A's gap and B's second token move by T.
    specs = [spec(0, 0.0, n_out=200), spec(1, 0.5, n_out=20)]
    t_pull = 100 * BPT / 1e9
    slow = simulate_records(specs, ENGINE, disagg=ds("1GB/s,0"))
    fast = simulate_records(specs, ENGINE, disagg=ds("inf,0"))
    for recs in (slow, fast):
        a, b = recs
        k = next(i for i, t in enumerate(a.chunk_times_s) if t >= b.first_token_s)  # the step under way ends
        assert a.chunk_times_s[k] > b.first_token_s  # (B's KV was ready mid-step)
        assert b.chunk_times_s[1] == a.chunk_times_s[k + 1]  # B decodes from the next step on, beside A
    k = next(i for i, t in enumerate(slow[0].chunk_times_s) if t >= slow[1].first_token_s)
    gap = lambda recs: recs[0].chunk_times_s[k + 1] - recs[0].chunk_times_s[k]  # noqa: E731
    assert gap(slow) - gap(fast) == pytest.approx(t_pull, abs=1e-12)
    assert slow[1].first_token_s == fast[1].first_token_s  # the prefill side is untouched


def test_distserve_admission_accepts_while_the_waiting_blocks_stay_under_their_share() -> None:
    # Three 100-token prompts (7 blocks each) prefilled in one step reach a decode instance of 200 blocks.
    # With 5% (10 blocks) for requests accepted and not yet decoding, it accepts two (7 < 10, then 14 >= 10
    # stops it) and the third a step later; with the whole cache, all three join at once.
    specs = [spec(i, 0.0, n_out=20) for i in range(3)]
    decode = ModeledEngine(PROFILE, kv_blocks=200)
    capped = simulate_records(specs, ENGINE, disagg=ds("inf,0", decode))
    whole = simulate_records(specs, ENGINE, disagg=ds("inf,0", decode, frac=1.0))
    assert len({r.first_token_s for r in capped}) == 1  # (one prefill step)
    second = [r.chunk_times_s[1] for r in capped]
    assert second[0] == second[1] < second[2]
    assert len({r.chunk_times_s[1] for r in whole}) == 1
    with pytest.raises(Exception, match="admit_block_frac"):
        ds("inf,0", frac=0.0)
    with pytest.raises(Exception, match="decode_admission"):
        DisaggFleet(1, 1, decode_admission="eager")


def test_distserve_admission_starts_a_request_only_with_its_blocks_free_once_more() -> None:
    # 20 decode blocks. A (100-token prompt, 20-token answer) holds 8 once decoding. B's 100-token prompt
    # (7 blocks) fits the 12 free and is accepted; to join the batch DistServe's scheduler counts B's blocks
    # twice (its waiting blocks and its whole length), so B needs 7 more free: it waits until A has finished.
    # On-room admission starts it at once.
    specs = [spec(0, 0.0, n_out=20), spec(1, 0.2, n_out=20)]
    decode = ModeledEngine(PROFILE, kv_blocks=20)
    a, b = simulate_records(specs, ENGINE, disagg=ds("inf,0", decode))
    assert b.first_token_s < a.done_s <= b.chunk_times_s[1]
    a2, b2 = simulate_records(specs, ENGINE, disagg=DisaggFleet(1, 1, 0, KVLink.parse("inf,0"), BPT,
                                                                decode_engine=decode, first_token_from="prefill"))
    assert b2.chunk_times_s[1] < a2.done_s
    assert (a.output_tokens, b.output_tokens) == (20, 20)
