"""`slobench calibrate --from-runs`: a base profile's host costs (a fixed cost a step, a cost per sequence
sampling a token) fitted by replaying request logs through the simulator. Synthetic logs made by the simulator
itself with known host costs (and 5% noise on every measured time) are fitted back within the stated
uncertainty; the logs are read from the shared run format, CSV through a column mapping, or a run directory;
bad input is exit 2 naming the problem; the written profile loads wherever a profile does."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reference_engine.executor.modeled_executor import CostProfile
from reference_engine.serve_args import served_kv_blocks
from slobench.cli import main
from slobench.errors import SpecError
from slobench.fleet.published import Run, simulated_times_ms, specs_of
from slobench.fleet.simulate import ModeledEngine, SimOptions, simulate_records
from slobench.profiles.calibrate_runs import calibrate_runs
from slobench.profiles.from_runs import colocated_builder
from slobench.profiles.run_logs import ColumnMap, read_log

BASE = CostProfile("base", 0.004, 2e-5, 3e-4, 1e-6)  # a linear profile: ~4.5 ms a decode step at batch 1
TRUE_STEP_S, TRUE_PER_SEQ_S = 0.003, 0.00025
TRUE_OVERHEAD_S = 0.004  # each request's cost outside the steps (HTTP, parsing): every time after the send
ENGINE = ["--max-num-seqs", "32", "--kv-blocks", "1024", "--max-batched-tokens", "1024", "--scheduler", "chunked"]


def _engine(profile: CostProfile) -> ModeledEngine:
    return ModeledEngine(profile, kv_blocks=1024, max_num_seqs=32, max_batched_tokens=1024, scheduler="chunked")


def _synthetic(rate_rps: float, n: int, seed: int) -> Run:
    """A run the simulator makes with the true host costs and request overhead; every measured time then off by
    ~5% (lognormal)."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate_rps, n - 1))])
    run = Run(f"syn-{rate_rps:g}", starts, rng.integers(16, 160, n), rng.integers(8, 80, n), np.zeros(n), np.zeros(n))
    recs = simulate_records(specs_of(run), _engine(BASE.with_host_costs(TRUE_STEP_S, TRUE_PER_SEQ_S)),
                            SimOptions(request_overhead_s=TRUE_OVERHEAD_S))
    ttft, tpot = simulated_times_ms(recs)
    noise = rng.lognormal(0.0, 0.05, (2, n))
    return Run(run.name, starts, run.prompt_len, run.output_len, ttft * noise[0], tpot * noise[1])


def _write_shared(run: Run, path: Path) -> Path:
    path.write_text("".join(json.dumps({"start_s": float(t), "prompt_len": int(p), "output_len": int(o),
                                        "ttft_ms": float(a), "tpot_ms": float(b)}) + "\n"
                            for t, p, o, a, b in zip(run.start_s, run.prompt_len, run.output_len, run.ttft_ms,
                                                     run.tpot_ms, strict=True)))
    return path


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    d = tmp_path_factory.mktemp("logs")
    base = d / "base.json"
    base.write_text(BASE.to_json())
    runs = [_write_shared(_synthetic(rate, 50, seed), d / f"syn-{rate:g}.jsonl")
            for rate, seed in ((25.0, 1), (60.0, 2), (90.0, 3))]
    return base, runs


def test_the_fit_recovers_known_host_costs_within_its_uncertainty(logs: tuple[Path, list[Path]], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base, runs = logs
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--from-runs", *map(str, runs), "--profile", str(base), "-o", str(out),
                 "--bootstrap", "50", *ENGINE]) == 0
    text = capsys.readouterr().out
    assert "held" in text and "host step" in text  # the held-out check is printed (lower-rate half fitted)
    doc = json.loads(out.read_text())
    fit = doc["provenance"]["calibrated_from_runs"]
    assert fit["fit_runs"] == ["syn-25", "syn-60"] and fit["held_out_runs"] == ["syn-90"]
    for key, true in (("host_step_s", TRUE_STEP_S), ("host_per_seq_s", TRUE_PER_SEQ_S),
                      ("request_overhead_s", TRUE_OVERHEAD_S)):
        sd = fit[key.removesuffix("_s") + "_sd_s"]
        assert 0 < sd < true  # an uncertainty that says something
        assert abs(fit[key] - true) <= 3 * sd, (key, fit[key], true, sd)
    # the request overhead where --simulate and plan read a calibrated profile's
    assert doc["provenance"]["request_overhead_s"] == fit["request_overhead_s"]
    assert (doc["host_step_s"], doc["host_per_seq_s"]) == (fit["host_step_s"], fit["host_per_seq_s"])
    assert fit["loss_per_request"]["calibrated"] < fit["loss_per_request"]["base"]
    assert [i["sha256"] for i in fit["inputs"]] == [hashlib.sha256(p.read_bytes()).hexdigest()
                                                     for p in runs]
    assert fit["engine"]["max_num_seqs"] == 32 and fit["engine"]["scheduler"] == "chunked"


def test_a_tail_the_simulator_lacks_does_not_bend_the_host_costs() -> None:
    """15% of the requests wait before their second token (TPOT x 1.8), a cost the replay does not model (as
    DistServe's decode admission past 6 req/s): the fit still finds the true host costs within 3 of its sd,
    and the same as on the logs without the tail (each such request counts as one clipped miss)."""
    clean, tailed = [], []
    for rate, seed in ((25.0, 1), (60.0, 2), (90.0, 3)):
        run = _synthetic(rate, 50, seed)
        tail = np.random.default_rng(seed + 10).random(len(run.start_s)) < 0.15
        clean.append(run)
        tailed.append(Run(run.name, run.start_s, run.prompt_len, run.output_len, run.ttft_ms,
                          np.where(tail, run.tpot_ms * 1.8, run.tpot_ms)))
    build = colocated_builder(BASE, _engine(BASE))
    fit = calibrate_runs(tailed, BASE, build, fit_all=True, bootstrap=50).fit
    for got, sd, true in ((fit.step_s, fit.step_sd_s, TRUE_STEP_S), (fit.per_seq_s, fit.per_seq_sd_s, TRUE_PER_SEQ_S)):
        assert 0 < sd < true and abs(got - true) <= 3 * sd, (got, sd, true)
    untailed = calibrate_runs(clean, BASE, build, fit_all=True, bootstrap=10).fit
    assert (fit.step_s, fit.per_seq_s) == pytest.approx((untailed.step_s, untailed.per_seq_s), rel=0.05)


def test_the_profile_file_round_trips_and_prices_every_step(tmp_path: Path) -> None:
    cal = BASE.with_host_costs(0.002, 0.0001)
    path = tmp_path / "p.json"
    path.write_text(cal.to_json())
    loaded = CostProfile.load(path)
    assert (loaded.host_step_s, loaded.host_per_seq_s) == (0.002, 0.0001)
    assert loaded.step_s(0, 8, 800) == pytest.approx(BASE.step_s(0, 8, 800) + 0.002 + 8 * 0.0001)
    assert loaded.step_s(100, 0, 100, None, 1) == pytest.approx(BASE.step_s(100, 0, 100, None, 1) + 0.0021)
    assert "host_step_s" not in BASE.to_json()  # a profile without the terms writes as before
    specs = specs_of(_synthetic(30.0, 12, 5))
    slow = simulated_times_ms(simulate_records(specs, _engine(loaded), SimOptions()))[1]
    fast = simulated_times_ms(simulate_records(specs, _engine(BASE), SimOptions()))[1]
    assert (slow[np.isfinite(slow) & (slow > 0)] > fast[np.isfinite(fast) & (fast > 0)]).all()
    assert main(["run", "--simulate", "--profile", str(path), "--workload", "tiny", "--num-requests", "8",
                 "--rate", "20", "--out", str(tmp_path / "r"), "--no-progress"]) == 0


def test_a_csv_through_a_column_mapping_reads_as_the_shared_format(logs: tuple[Path, list[Path]], tmp_path: Path) -> None:
    shared = read_log(logs[1][0])
    csv = tmp_path / "log.csv"
    rows = ["ts_ms,in_tokens,out_tokens,first_s,e2e_ms"]
    for t, p, o, a, b in zip(shared.start_s, shared.prompt_len, shared.output_len, shared.ttft_ms, shared.tpot_ms,
                             strict=True):
        rows.append(f"{float(t + 7) * 1e3!r},{p},{o},{float(a) / 1e3!r},{float(a + b * (o - 1))!r}")
    csv.write_text("\n".join(rows) + "\n")
    mapped = read_log(csv, ColumnMap.parse("arrival_ms=ts_ms,prompt=in_tokens,output=out_tokens,ttft_s=first_s,"
                                           "latency=e2e_ms"))
    np.testing.assert_allclose(mapped.start_s, shared.start_s, atol=1e-9)
    np.testing.assert_array_equal(mapped.prompt_len, shared.prompt_len)
    np.testing.assert_allclose(mapped.ttft_ms, shared.ttft_ms, rtol=1e-9)
    multi = shared.output_len > 1
    np.testing.assert_allclose(mapped.tpot_ms[multi], shared.tpot_ms[multi], rtol=1e-6)


def test_a_run_directory_reads_its_completed_requests(tmp_path: Path) -> None:
    assert main(["run", "--simulate", "--profile", "cpu-tiny", "--workload", "tiny", "--num-requests", "10",
                 "--rate", "20", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    run = read_log(tmp_path / "r")
    assert len(run.start_s) == 10 and (run.ttft_ms > 0).all() and run.start_s[0] == 0.0


@pytest.mark.parametrize(("argv", "message"), [
    (["--columns", "arrival=ts,prompt=in"], "lacks output, ttft"),
    (["--columns", "arrival=ts,prompt=in,output=out,ttft=first,tpot=nope"], "no column 'nope'"),
    (["--columns", "arrival=ts,prompt_s=in,output=out,ttft=first,tpot=t"], "only for times"),
    (["--scheduler", "fifo"], "invalid choice: 'fifo'"),
    (["--kv-blocks", "0"], "kv_blocks"),
    (["--bootstrap", "3"], "--bootstrap"),
    (["--url", "http://127.0.0.1:9/v1"], "one of --url and --from-runs"),
    (["--refine-rates", "1,2,3"], "--refine-rates applies only with --url"),
])
def test_bad_input_is_exit_2_naming_the_problem(argv: list[str], message: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.csv"
    log.write_text("ts,in,out,first,t\n0,10,5,20,3\n1,12,6,25,3\n")
    columns = [] if "--columns" in argv else ["--columns", "arrival=ts,prompt=in,output=out,ttft=first,tpot=t"]
    try:
        rc = main(["calibrate", "--from-runs", str(log), "--profile", "cpu-tiny", *columns, "-o",
                   str(tmp_path / "o.json"), *argv])
    except SystemExit as e:  # argparse's own refusal (a value outside the choices)
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_empty_and_unmapped_logs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["calibrate", "--from-runs", str(empty), "--profile", "cpu-tiny", "-o", str(tmp_path / "o.json")]) == 2
    assert "holds no requests" in capsys.readouterr().err
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n")
    assert main(["calibrate", "--from-runs", str(csv), "--profile", "cpu-tiny", "-o", str(tmp_path / "o.json")]) == 2
    assert "needs --columns" in capsys.readouterr().err
    assert main(["calibrate", "--from-runs", str(csv), "-o", str(tmp_path / "o.json")]) == 2
    assert "needs --profile" in capsys.readouterr().err
    with pytest.raises(SpecError, match="not a number"):
        bad = tmp_path / "bad.csv"
        bad.write_text("ts,in,out,first,t\nsoon,10,5,20,3\n")
        read_log(bad, ColumnMap.parse("arrival=ts,prompt=in,output=out,ttft=first,tpot=t"))


SHARED = Path("/work/shared/validation/distserve-opt13b-a100/runs")


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared validation runs are not on this machine")
def test_the_shared_runs_read_and_split_by_rate() -> None:
    from slobench.profiles.from_runs import split_by_rate
    runs = [read_log(p) for p in sorted(SHARED.glob("vllm-*.jsonl"))]
    fit, held = split_by_rate(runs)
    assert [r.name for r in fit] == ["vllm-100-1", "vllm-100-2", "vllm-200-2"]
    assert [r.name for r in held] == ["vllm-300-3", "vllm-400-4"]


def _benchmark(*argv: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, str(root / "benchmarks" / "validate_published.py"), *argv],
                          capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})


def test_validate_published_calibrates_a_custom_setup_then_replays(logs: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, runs = logs
    out = tmp_path / "o.json"
    done = _benchmark("--setup", "custom", "--profile", str(base), "--max-num-seqs", "32", "--kv-blocks", "1024",
                      "--max-batched-tokens", "1024", "--calibrate-on", str(runs[0]), str(runs[1]), "--json", str(out),
                      str(runs[2]))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())
    assert row["run"] == "syn-90" and row["profile"].endswith("+calibrated")
    step_ms, per_seq_ms = row["host_costs_ms"]
    assert step_ms > 0 and per_seq_ms > 0
    for side in ("measured", "simulated"):
        assert row[side]["ttft_mean_ms"] > 0 and row[side]["tpot_mean_ms"] > 0
    # the held-out run's mean TPOT within 10% once calibrated (the base alone is far off: no host costs)
    assert abs(row["simulated"]["tpot_mean_ms"] / row["measured"]["tpot_mean_ms"] - 1) < 0.10
    bad = _benchmark("--setup", "custom", "--profile", "fitted", "--json", str(out), str(runs[2]))
    assert bad.returncode == 2 and "--setup custom give roofline or a profile" in bad.stderr
    bad = _benchmark("--setup", "vllm", "--profile", "fitted", "--kv-blocks", "5", "--json", str(out), str(runs[2]),
                     "--data", str(tmp_path))
    assert bad.returncode == 2 and "--kv-blocks is for --setup custom" in bad.stderr


# a server whose prompts cost 0.7 of what the base profile says, a token: the prefill price a roofline's
# efficiency or an idle engine's fit gets wrong by a share, which no host cost or request overhead repairs
LONG = CostProfile("long-prompts", 0.004, 6e-5, 3e-4, 1e-6)  # a 1,000-token prompt: 64 ms
TRUE_PREFILL_SCALE = 0.7


def _prefill_run(rate_rps: float, n: int, seed: int) -> Run:
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate_rps, n - 1))])
    run = Run(f"pf-{rate_rps:g}", starts, rng.integers(16, 1200, n), rng.integers(8, 60, n), np.zeros(n), np.zeros(n))
    served = LONG.with_prefill_scale(TRUE_PREFILL_SCALE).with_host_costs(TRUE_STEP_S, TRUE_PER_SEQ_S)
    engine = ModeledEngine(served, kv_blocks=4096, max_num_seqs=32, max_batched_tokens=2048, scheduler="chunked")
    ttft, tpot = simulated_times_ms(simulate_records(specs_of(run), engine, SimOptions(request_overhead_s=TRUE_OVERHEAD_S)))
    noise = rng.lognormal(0.0, 0.05, (2, n))
    return Run(run.name, starts, run.prompt_len, run.output_len, ttft * noise[0], tpot * noise[1])


def test_the_prefill_price_is_fitted_beside_the_host_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fitted with `--fit-prefill`, the scale comes back within 3 of its sd (the TTFT deciles are matched within
    each third of the prompts by length, so a constant and a share of the prompt are told apart), and the
    written profile prices a prompt at that scale."""
    base = tmp_path / "long.json"
    base.write_text(LONG.to_json())
    paths = [_write_shared(_prefill_run(rate, 100, seed), tmp_path / f"pf-{rate:g}.jsonl")
             for rate, seed in ((6.0, 1), (12.0, 2))]
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--from-runs", *map(str, paths), "--profile", str(base), "-o", str(out), "--fit-all",
                 "--fit-prefill", "--bootstrap", "30", "--kv-blocks", "4096", "--max-num-seqs", "32",
                 "--max-batched-tokens", "2048", "--scheduler", "chunked"]) == 0
    assert "prefill price" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    fit = doc["provenance"]["calibrated_from_runs"]
    assert 0 < fit["prefill_scale_sd"] < 0.1
    assert abs(fit["prefill_scale"] - TRUE_PREFILL_SCALE) <= max(3 * fit["prefill_scale_sd"], 0.05), fit
    assert doc["per_prefill_token_s"] == pytest.approx(LONG.per_prefill_token_s * fit["prefill_scale"])
    assert abs(fit["request_overhead_s"] - TRUE_OVERHEAD_S) < 0.004


def test_a_prefill_scale_moves_prompts_only() -> None:
    fit = CostProfile.load("distserve:" + str(SHARED.parent / "profiler-a100-80g.vllm.json") + "@facebook/opt-13b/tp1") \
        if SHARED.is_dir() else None
    for prof in (LONG, *(() if fit is None else (fit,))):
        half = prof.with_prefill_scale(0.5)
        assert half.step_s(0, 8, 8000) == prof.step_s(0, 8, 8000)  # a decode step is as it was
        fixed = prof.step_s(1, 0, 1, 1)
        # a prompt's cost over the fixed one halves (bar the KV reads of its context a linear profile adds)
        ratio = (half.step_s(1000, 0, 1000, 500500) - fixed) / (prof.step_s(1000, 0, 1000, 500500) - fixed)
        assert 0.49 < ratio < 0.53
        assert prof.with_prefill_scale(1.0) is prof
    with pytest.raises(Exception, match="prefill scale"):
        LONG.with_prefill_scale(0.0)


def test_validate_published_fits_the_prefill_price_and_checks_the_runs_first(tmp_path: Path) -> None:
    base = tmp_path / "long.json"
    base.write_text(LONG.to_json())
    fit = [str(_write_shared(_prefill_run(rate, 100, seed), tmp_path / f"pf-{rate:g}.jsonl"))
           for rate, seed in ((6.0, 1), (12.0, 2))]
    held = str(_write_shared(_prefill_run(9.0, 100, 3), tmp_path / "pf-9.jsonl"))
    out = tmp_path / "o.json"
    done = _benchmark("--setup", "custom", "--profile", str(base), "--max-num-seqs", "32", "--kv-blocks", "4096",
                      "--max-batched-tokens", "2048", "--fit-prefill", "--calibrate-on", *fit, "--json", str(out), held)
    assert done.returncode == 0, done.stderr
    assert "runs against each other" in done.stdout and "<- differs" not in done.stdout  # one server: they agree
    (row,) = json.loads(out.read_text())
    assert abs(row["prefill_scale"] - TRUE_PREFILL_SCALE) <= 0.05
    assert abs(row["decode_speed_vs_other_runs"]["offset_pct"]) < 5
    for stat in ("ttft_mean_ms", "tpot_mean_ms"):  # the held-out run, replayed at the fitted price
        assert abs(row["simulated"][stat] / row["measured"][stat] - 1) < 0.10, stat


TRUE_KV_BLOCKS, FLAG_KV_BLOCKS = 280, 400  # the cache the server had, and what its flags say


def _kv_run(rate_rps: float, n: int, seed: int) -> Run:
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate_rps, n - 1))])
    run = Run(f"kv-{rate_rps:g}", starts, rng.integers(16, 400, n), rng.integers(20, 160, n), np.zeros(n), np.zeros(n))
    engine = ModeledEngine(BASE.with_host_costs(TRUE_STEP_S, TRUE_PER_SEQ_S), kv_blocks=TRUE_KV_BLOCKS, max_num_seqs=32,
                           max_batched_tokens=1024, scheduler="chunked")
    ttft, tpot = simulated_times_ms(simulate_records(specs_of(run), engine, SimOptions()))
    noise = rng.lognormal(0.0, 0.05, (2, n))
    return Run(run.name, starts, run.prompt_len, run.output_len, ttft * noise[0], tpot * noise[1])


def test_the_kv_cache_the_runs_show_is_fitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs that reach the cache's limit show its size: fitted with `--fit-kv` on an engine whose flags say
    400 blocks, the scale comes back near 280 / 400 and the served blocks are printed and recorded."""
    base = tmp_path / "base.json"
    base.write_text(BASE.to_json())
    paths = [str(_write_shared(_kv_run(rate, 100, seed), tmp_path / f"kv-{rate:g}.jsonl"))
             for rate, seed in ((15.0, 1), (30.0, 2))]
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--from-runs", *paths, "--profile", str(base), "-o", str(out), "--fit-all", "--fit-kv",
                 "--bootstrap", "20", "--kv-blocks", str(FLAG_KV_BLOCKS), "--max-num-seqs", "32",
                 "--max-batched-tokens", "1024", "--scheduler", "chunked"]) == 0
    text = capsys.readouterr().out
    fit = json.loads(out.read_text())["provenance"]["calibrated_from_runs"]
    true = TRUE_KV_BLOCKS / FLAG_KV_BLOCKS
    assert abs(fit["kv_blocks_scale"] - true) <= max(3 * fit["kv_blocks_scale_sd"], 0.06), fit
    assert fit["served_kv_blocks"] == round(FLAG_KV_BLOCKS * fit["kv_blocks_scale"])
    assert f"--kv-blocks {fit['served_kv_blocks']}" in text and "KV blocks" in text
    # a simulation of that server takes the cache its runs showed, unless told otherwise
    assert main(["run", "--simulate", "--profile", str(out), "--workload", "tiny", "--num-requests", "4", "--rate", "10",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    knobs = json.loads((tmp_path / "r" / "manifest.json").read_text())["target"]["knobs"]
    assert knobs["kv_blocks"] == fit["served_kv_blocks"]
    assert served_kv_blocks(str(out), 32) == fit["served_kv_blocks"] // 2  # counted in blocks of the size asked
    assert served_kv_blocks(str(base), None) is None  # a profile not fitted on runs carries none
