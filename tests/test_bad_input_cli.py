"""Issue 13 item 10: bad input is exit 2 with one line that names it, never a traceback, never a wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main

URL = ["--url", "http://127.0.0.1:9/v1", "--model", "m"]  # nothing listens there: input is checked first


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "list.toml").write_text("[slo]\nttft = [1]\n")
    (tmp_path / "bool.toml").write_text("ttft = true\n")
    (tmp_path / "scalar.toml").write_text("slo = 3\n")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workload", "{d}/bin.toml"], "not UTF-8"),
        (["--workload", "{d}/dir.toml"], "is a directory"),
        (["--slo", "{d}/bin.toml"], "not UTF-8"),
        (["--slo", "{d}/dir.toml"], "cannot read SLO file"),
        (["--slo", "{d}/list.toml"], "slo.ttft"),
        (["--slo", "{d}/bool.toml"], "slo.ttft"),
        (["--slo", "{d}/scalar.toml"], "must be a table"),
        (["--slo", "ttft=1s,ttft=2s"], "given twice"),
        (["--scrape-interval", "nan"], "--scrape-interval"),
        (["--scrape-interval", "-1"], "--scrape-interval"),
        (["--rate", "1e-300"], "--rate"),
        (["--concurrency", "2", "--max-in-flight", "3"], "exclude each other"),
    ],
)
def test_bad_run_input_is_exit_2_with_one_line(files: Path, argv: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", *URL, *(a.format(d=files) for a in argv), "--out", str(files / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and needle in err[0], err
    assert not (files / "r").exists()


@pytest.mark.parametrize("flag", [["--simulate"], ["--engine", "modeled"]])
def test_an_in_process_engine_with_a_url_is_exit_2(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *flag, "--url", "http://127.0.0.1:9/v1", "--workload", "tiny"]) == 2
    assert "--url would be ignored" in capsys.readouterr().err


def test_summarize_names_the_bad_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    assert main(["run", "--simulate", "--workload", "tiny", "--num-requests", "5", "--rate", "5", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    lines = (run / "requests.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["scheduled_s"] = "x"
    (run / "requests.jsonl").write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    assert main(["summarize", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "requests.parquet: written beside a requests.jsonl of" in err[0]  # the edit made it stale: not read
    assert len(err) == 2 and "record 3: scheduled_s must be a finite number" in err[1]


@pytest.mark.parametrize("where", ["dir", "unwritable"])
def test_report_into_a_directory_or_nowhere_is_exit_2(tmp_path: Path, where: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    assert main(["run", "--simulate", "--workload", "tiny", "--num-requests", "5", "--rate", "5", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    (tmp_path / "f").write_text("a file")
    out = tmp_path if where == "dir" else tmp_path / "f" / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report -o" in err[0]


# --- every verb: a bad flag or file is exit 2 with one line naming it, before anything starts ------------------

@pytest.fixture
def bad(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of bad inputs, and the working directory (a default run folder would land here)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "bad.toml").write_text("[[[x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("a file")
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "trunc.json").write_text('{"kind": "sweep", ')
    (tmp_path / "garbage.csv").write_bytes(b"garbage\n\x00\x01\xff")
    base = {"kind": "baseline", "schema_version": 1, "workload": {}, "metrics": {}}
    good = {**base, "workload": {"name": "t", "hash": "h", "spec": {}}, "slo": None,
            "metrics": {"capacity": {"replicates": [{"seed": 1, "value": 1.0}, {"seed": 2, "value": 1.1}]}}}
    (tmp_path / "good.json").write_text(json.dumps(good))
    for name, doc in {"v99.json": {**base, "schema_version": 99}, "v_none.json": {k: v for k, v in base.items()
                                                                               if k != "schema_version"},
                      "v_str.json": {**base, "schema_version": "1"},
                      "inf_seed.json": {**base, "metrics": {"x": {"replicates": [{"seed": 1e400, "value": 1}]}}},
                      "nan_value.json": {**base, "metrics": {"x": {"replicates": [{"seed": 1, "value": "NaN"}]}}},
                      "metrics_list.json": {**base, "metrics": []}}.items():
        (tmp_path / name).write_text(json.dumps(doc).replace("Infinity", "1e400"))
    return tmp_path


RUN = ["run", *URL]
SIM = ["run", "--simulate", "--workload", "tiny", "--num-requests", "5"]
SWEEP = ["sweep", *URL]
CAP = ["capacity", *URL, "--slo", "ttft=1s"]
HIST_ADD = ["history", "add", "{d}/good.json", "--history", "{d}/h.jsonl", "--commit", "a"]
CASES: list[tuple[list[str], str]] = [
    # numbers: too big, negative, zero, not finite, not a number
    ([*RUN, "--num-requests", "1e20"], "--num-requests"),
    ([*RUN, "--num-requests", "99999999999999999999"], "--num-requests"),
    ([*RUN, "--num-requests", "0"], "--num-requests"),
    ([*RUN, "--num-requests", "-1"], "--num-requests"),
    ([*RUN, "--input-len", "1e12"], "--input-len"),
    ([*RUN, "--input-len", "10000000000000"], "--input-len"),
    ([*RUN, "--input-len", "0"], "--input-len"),
    ([*RUN, "--output-len", "10000000000000"], "--output-len"),
    ([*RUN, "--output-len", "-1"], "--output-len"),
    ([*RUN, "--duration", "nan"], "--duration"),
    ([*RUN, "--duration", "inf"], "--duration"),
    ([*RUN, "--duration", "-1"], "--duration"),
    ([*RUN, "--duration", "1e300"], "--duration"),
    ([*RUN, "--rate", "1e6", "--duration", "1e5"], "more than"),
    ([*RUN, "--rate", "nan"], "--rate"),
    ([*RUN, "--rate", "inf"], "--rate"),
    ([*SIM, "--jitter", "1e300"], "--jitter"),
    ([*SIM, "--request-overhead", "1e300s"], "--request-overhead"),
    (["run", "--url", "", "--model", "m"], "--url"),
    (["run", "--url", " , ", "--model", "m"], "--url"),
    ([*RUN, "--rate", "-1"], "--rate"),
    ([*RUN, "--timeout", "nan"], "--timeout"),
    ([*RUN, "--timeout", "-1"], "--timeout"),
    ([*RUN, "--concurrency", "0"], "--concurrency"),
    ([*RUN, "--concurrency", "99999999999"], "--concurrency"),
    ([*RUN, "--max-in-flight", "0"], "--max-in-flight"),
    ([*RUN, "--max-in-flight", "-1"], "--max-in-flight"),
    ([*RUN, "--seed", "1e3"], "--seed"),
    ([*RUN, "--warmup", "x"], "--warmup"),
    ([*RUN, "--warmup", "-1"], "--warmup"),
    ([*RUN, "--rate-limit", "0/s"], "--rate-limit"),
    ([*RUN, "--rate-limit", "10/fortnight"], "--rate-limit"),
    ([*RUN, "--max-error-rate", "2"], "--max-error-rate"),
    ([*RUN, "--max-error-rate", "nan"], "--max-error-rate"),
    ([*RUN, "--client-workers", "0"], "--client-workers"),
    ([*RUN, "--client-workers", "100000"], "--client-workers"),
    ([*RUN, "--scrape-interval", "inf"], "--scrape-interval"),
    # headers, bodies, URLs
    ([*RUN, "--header", "X-A: é"], "printable ASCII"),
    ([*RUN, "--header", "X-A: \x1b[2J"], "printable ASCII"),
    ([*RUN, "--header", "Host: a\r\nB: c"], "printable ASCII"),
    ([*RUN, "--header", "X\nY: 1"], "--header"),
    ([*RUN, "--header", ": v"], "--header"),
    ([*RUN, "--header", "Bad Name: v"], "--header"),
    ([*RUN, "--header", "noColon"], "--header"),
    ([*RUN, "--extra-body", "{"], "--extra-body"),
    ([*RUN, "--extra-body", "[1]"], "--extra-body"),
    ([*RUN, "--extra-body", '{"a": NaN}'], "--extra-body"),
    (["run", "--url", "http://127.0.0.1:99999/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://user:pw@127.0.0.1:99999/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://127.0.0.1:-1/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://127.0.0.1:abc/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://127.0.0.1:0/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://[::1/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://a b/v1", "--model", "m"], "--url"),
    (["run", "--url", "ftp://host/v1", "--model", "m"], "--url"),
    (["run", "--url", "http://", "--model", "m"], "--url"),
    (["run", "--url", "http://127.0.0.1:9/v1,http://x:70000/v1", "--model", "m"], "--url"),
    # files: missing, a directory, not UTF-8, not TOML, garbage
    ([*RUN, "--workload", "{d}/bad.toml"], "bad.toml"),
    ([*RUN, "--workload", "{d}/nope.toml"], "nope"),
    ([*RUN, "--slo", "{d}/bad.toml"], "bad.toml"),
    ([*RUN, "--slo", "ttft=5parsecs"], "ttft"),
    ([*RUN, "--slo", "ttft=-1s"], "ttft"),
    ([*RUN, "--slo", "ttft=nan"], "ttft"),
    ([*RUN, "--slo", "ttft=1s,target=2"], "target"),
    ([*RUN, "--trace", "{d}/nope.csv"], "nope.csv"),
    ([*RUN, "--trace", "{d}/dir"], "dir"),
    ([*RUN, "--trace", "{d}/garbage.csv"], "garbage.csv"),
    ([*RUN, "--trace", "{d}/bin.json"], "bin.json"),
    ([*RUN, "--tokenizer", "{d}/nope"], "nope"),
    ([*RUN, "--tokenizer", "{d}/bin.json"], "bin.json"),
    ([*RUN, "--report", "{d}/dir"], "--report"),
    ([*RUN, "--report", "{d}/file/r.html"], "--report"),
    ([*RUN, "--out", "{d}/file"], "--out"),
    ([*RUN, "--time-scale", "0.5"], "--time-scale"),
    # the simulator's flags
    ([*SIM, "--kv-blocks", "0"], "kv"),
    ([*SIM, "--kv-blocks", "1e20"], "--kv-blocks"),
    ([*SIM, "--block-size", "0"], "block"),
    ([*SIM, "--replicas", "0"], "--replicas"),
    ([*SIM, "--profile", "{d}/bin.json"], "profile"),
    ([*SIM, "--profile", "{d}/list.json"], "profile"),
    ([*SIM, "--profile", "{d}/nope.json"], "profile"),
    ([*SIM, "--jitter", "nan"], "--jitter"),
    ([*SIM, "--jitter", "-1"], "--jitter"),
    ([*SIM, "--request-overhead", "x"], "--request-overhead"),
    ([*SIM, "--kv-link", "x"], "kv-link"),
    # sweep, capacity
    ([*SWEEP], "--rates"),
    ([*SWEEP, "--rates", "x"], "rates"),
    ([*SWEEP, "--rates", "0"], "rate"),
    ([*SWEEP, "--rates", "nan"], "rate"),
    ([*SWEEP, "--rates", "16:1:5"], "rate"),
    ([*SWEEP, "--rates", "1:16:0"], "rate"),
    ([*SWEEP, "--rates", "1", "--refine-knee", "-1"], "--refine-knee"),
    (["capacity", *URL], "--slo"),
    ([*CAP, "--replicates", "1"], "replicates"),
    ([*CAP, "--max-probes", "1"], "max_probes"),
    ([*CAP, "--level", "2"], "level"),
    ([*CAP, "--factor", "1"], "factor"),
    ([*CAP, "--start-rate", "nan"], "start_rate"),
    # gate, history, report, summarize: flags and result files
    (["gate", "--baseline", "{d}/v99.json"], "--candidate"),
    (["gate", "--candidate", "{d}/v99.json", "--baseline", "{d}/v99.json"], "schema_version 99"),
    (["gate", "--candidate", "{d}/v_none.json", "--baseline", "{d}/v_none.json"], "no schema_version"),
    (["gate", "--candidate", "{d}/v_str.json", "--baseline", "{d}/v_str.json"], "schema_version '1'"),
    (["gate", "--candidate", "{d}/inf_seed.json", "--baseline", "{d}/inf_seed.json"], "inf_seed.json"),
    (["gate", "--candidate", "{d}/nan_value.json", "--baseline", "{d}/nan_value.json"], "nan_value.json"),
    (["gate", "--candidate", "{d}/metrics_list.json", "--baseline", "{d}/metrics_list.json"], "metrics_list.json"),
    (["gate", "--candidate", "{d}/empty.json", "--baseline", "{d}/empty.json"], "empty.json"),
    (["gate", "--candidate", "{d}/trunc.json", "--baseline", "{d}/trunc.json"], "trunc.json"),
    (["gate", "--candidate", "{d}/bin.json", "--baseline", "{d}/bin.json"], "bin.json"),
    (["gate", "--candidate", "{d}/list.json", "--baseline", "{d}/list.json"], "list.json"),
    (["gate", "--candidate", "{d}/dir", "--baseline", "{d}/dir"], "dir"),
    (["gate", "--candidate", "{d}/nope.json", "--baseline", "{d}/nope.json"], "nope.json"),
    (["gate", "--candidate", "{d}/good.json", "--baseline", "{d}/good.json", "--alpha", "nan"], "alpha"),
    (["gate", "--candidate", "{d}/good.json", "--baseline", "{d}/good.json", "--max-drop", "capacity=5parsec"],
     "5parsec"),
    (["gate", "--candidate", "{d}/good.json", "--baseline", "{d}/good.json", "--markdown", "{d}/dir"], "--markdown"),
    (["gate", "--candidate", "{d}/good.json", "--junit", "{d}/file/j.xml"], "--junit"),
    (["history", "add", "{d}/v99.json", "--history", "{d}/h.jsonl", "--commit", "a"], "schema_version 99"),
    ([*HIST_ADD, "--commit", ""], "--commit"),
    (["history", "add", "{d}/good.json", "--history", "{d}/file/h.jsonl", "--commit", "a"], "file"),
    (["history", "add", "{d}/inf_seed.json", "--history", "{d}/h.jsonl", "--commit", "a"], "inf_seed.json"),
    (["history", "add", "{d}/dir", "--history", "{d}/h.jsonl", "--commit", "a"], "dir"),
    ([*HIST_ADD, "--rates", "nan,x"], "--rates"),
    ([*HIST_ADD, "--date", "yesterday"], "--date"),
    ([*HIST_ADD, "--verdict", "maybe"], "--verdict"),
    (["history", "add", "{d}/v99.json", "--history", "{d}/h.jsonl"], "--commit"),
    (["history", "report", "{d}/nope.jsonl"], "nope.jsonl"),
    (["history", "report", "{d}/bin.json"], "bin.json"),
    (["history", "report", "{d}/dir"], "dir"),
    (["history", "report", "{d}/v99.json", "--alpha", "nan"], "--alpha"),
    (["report", "{d}/nope", "-o", "{d}/r.html"], "nope"),
    (["report", "{d}/file", "-o", "{d}/r.html"], "file"),
    (["summarize", "{d}/nope"], "nope"),
    (["summarize", "{d}/file"], "file"),
    (["summarize", "{d}/dir"], "manifest.json"),
    (["workload", "show", "{d}/nope.toml"], "nope"),
    (["workload", "show", "{d}/bad.toml"], "bad.toml"),
    (["workload", "convert", "{d}/garbage.csv", "-o", "{d}/o.jsonl"], "garbage.csv"),
    (["plan", "--slo", "ttft=1s"], "--workload"),
    (["plan", "--workload", "{d}/bad.toml", "--slo", "ttft=1s"], "bad.toml"),
    (["bogus"], "invalid choice"),
]


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_every_bad_input_is_exit_2_with_one_line(bad: Path, argv: list[str], needle: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([a.replace("{d}", str(bad)) for a in argv])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert needle in err[0] and "Traceback" not in err[0], err
    assert "\x1b" not in err[0]
    assert not (bad / "runs").exists() or not any((bad / "runs").iterdir())  # no run folder left behind
