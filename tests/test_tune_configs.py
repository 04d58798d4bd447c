"""Configurations from templates, --param grids and TOML files; bad templates refused before anything starts."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.tune.configs import bundled_engine, cross, from_template, parse_params, read_config_file
from slobench.tune.result import TuneRow, best_row, ranked
from slobench.tune.table import print_table


def test_grid_is_the_cross_product_and_fills_the_template() -> None:
    sets = cross(parse_params(["max_num_seqs=64,128", "tokens=2048,8192"]))
    configs = from_template("vllm serve M --port {port} --max-num-seqs {max_num_seqs} --max-num-batched-tokens {tokens}",
                            sets, None)
    assert len(configs) == 4
    assert configs[3].command(8001) == ["vllm", "serve", "M", "--port", "8001", "--max-num-seqs", "128",
                                        "--max-num-batched-tokens", "8192"]
    assert {c.gpus for c in configs} == {1}


@pytest.mark.parametrize(("template", "params", "word"), [
    ("srv --port {port} --tp {tp}", ["max_num_seqs=1"], "name no parameter"),
    ("srv --port {port}", ["max_num_seqs=1"], "never used"),
    ("srv --max-num-seqs {max_num_seqs}", ["max_num_seqs=1"], "no {port}"),
    ("srv --port {port} {", [], "--serve-cmd"),
])
def test_bad_template_is_refused(template: str, params: list[str], word: str) -> None:
    with pytest.raises(UsageError, match=word.replace("{", r"\{")):
        from_template(template, cross(parse_params(params)), None)


def test_bad_template_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "slobench", "tune", "--serve-cmd", "srv --port {port} --x {nope}",
                        "--param", "y=1", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "nope" in r.stderr
    assert not out.exists()


def test_toml_links_zip_and_gpus_follow_tp(tmp_path: Path) -> None:
    path = tmp_path / "tune.toml"
    path.write_text('serve_cmd = "srv --port {port} --tp {tp} --seqs {seqs}"\ngpus = "{tp}"\n'
                    "[grid]\nseqs = [8, 16]\n[[link]]\ntp = [1, 2]\n"
                    "[[config]]\ntp = 4\nseqs = 32\n")
    file = read_config_file(path)
    configs = from_template(file.serve_cmd or "", file.param_sets, file.gpus)
    assert [(c.params["tp"], c.params["seqs"], c.gpus) for c in configs] == [
        (1, 8, 1), (2, 8, 2), (1, 16, 1), (2, 16, 2), (4, 32, 4)]


def test_link_lists_of_unequal_length_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tune.toml"
    path.write_text("[[link]]\ntp = [1, 2]\ngpus = [1]\n")
    with pytest.raises(UsageError, match="one length"):
        read_config_file(path)


def test_bundled_engine_knobs_only() -> None:
    with pytest.raises(UsageError, match="not a knob"):
        bundled_engine([{"tp": 2}], None, simulate=False, serve_args=[])
    (cfg,) = bundled_engine([{"max_num_seqs": 8}], None, simulate=False, serve_args=[])
    assert cfg.command(9)[3:] == ["serve", "--executor", "modeled", "--port", "9", "--max-num-seqs", "8"]
    (sim,) = bundled_engine([{"replicas": 4, "max_num_seqs": 8}], None, simulate=True, serve_args=[])
    assert sim.gpus == 4 and list(sim.argv) == ["--replicas", "4", "--max-num-seqs", "8"]


def test_dry_run_prints_every_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "t"
    code = main(["tune", "--serve-cmd", "srv --port {port} --seqs {seqs}", "--param", "seqs=1,16",
                 "--workload", "tiny", "--slo", "ttft=500ms", "--out", str(out), "--dry-run"])
    text = capsys.readouterr().out
    assert code == 0
    assert "srv --port '{port}' --seqs 1" in text and "srv --port '{port}' --seqs 16" in text
    assert "--workload tiny" in text
    assert not out.exists()


def row(name: str, rps: float | None, gpus: int = 1, interval: list[float] | None = None) -> TuneRow:
    cap = {"capacity_rps": rps, "interval_rps": interval}
    return TuneRow(name, {"n": name}, "measured" if rps else "failed", gpus, ["srv"],
                   capacity=cap if rps else None)


def test_ranked_by_capacity_per_gpu() -> None:
    rows = [row("a", 10.0, gpus=2), row("b", 6.0), row("c", None)]
    assert [r.name for r in ranked(rows)] == ["b", "a", "c"]
    best = best_row(rows)
    assert best is not None and best.name == "b"
    assert best_row([row("c", None)]) is None


@pytest.mark.parametrize(("flags", "word"), [
    (["--replicates", "1"], "replicates"),
    (["--capacity-args=--tolerance 7"], "tolerance"),
    (["--capacity-args=--bogus"], "--bogus"),
    (["--slo", "ttft=500ms,tpot=9q"], "slo.tpot"),
    (["--dry-run"], "--slo is required"),
])
def test_a_flag_capacity_refuses_exits_2_before_any_server_starts(tmp_path: Path, flags: list[str], word: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Checked once as `slobench capacity` checks it, not after each configuration's ready wait."""
    started = tmp_path / "started"
    code = main(["tune", "--serve-cmd", f"touch {started} --port {{port}} --x {{x}}", "--param", "x=1,2",
                 "--workload", "tiny", *(["--slo", "ttft=500ms"] if word != "--slo is required" else []), *flags,
                 "--out", str(tmp_path / "t")])
    assert code == 2
    assert word in capsys.readouterr().err
    assert not started.exists() and not (tmp_path / "t").exists()


def test_the_table_repeats_the_searchs_notes_and_counts_the_client_bottleneck() -> None:
    busy = [f"rate {r:g} seed 1: the client was the bottleneck; that probe measured it" for r in (8, 16, 12)]
    measured = row("a", 14.3, interval=[6.6, 22.0])
    measured.capacity["notes"] = [*busy, "probes near capacity are short"]  # type: ignore[index]
    out = io.StringIO()
    print_table([measured, row("b", None)], out)
    text = out.getvalue()
    assert "a: probes near capacity are short" in text
    assert "a: the client was the bottleneck in 3 probe(s): the capacity is a floor" in text
    assert "seed 1" not in text  # counted, not listed
