"""The CLI end to end against the scheduled-token server: exit codes mean one thing each."""

import json
import socket

import pytest

from slobench.cli import main

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_writes_run_dir_and_exits_0(token_server, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--rate", "50", "--num-requests", "30",
               "--slo", "ttft=5s,tpot=1s", "--out", str(out), "--no-progress", "--scrape-interval", "0.2"])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0, (summary["attainment"], summary["error_counts"], summary["ttft_from_scheduled_s"])
    assert summary["num_requests"] == 30 and summary["attainment"]["value"] == 1.0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["model"] == token_server.model  # discovered from /v1/models
    # the workload identity hashes these options: a number must stay a number (committed baselines)
    assert manifest["options"]["warmup"] == 0 and isinstance(manifest["options"]["warmup"], int)
    assert (out / "server_metrics.jsonl").exists()  # the token server exposes /metrics
    assert "attainment 100.0%" in capsys.readouterr().out
    assert main(["summarize", str(out), "--slo", "ttft=1ms"]) == 0


def test_run_exits_1_when_slo_missed(token_server, tmp_path):
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--rate", "50", "--num-requests", "10",
               "--slo", "ttft=10ms", "--out", str(tmp_path / "r"), "--no-progress", "--scrape-interval", "0"])
    assert rc == 1  # the server's TTFT is 50 ms


def test_sweep_table_and_headline(token_server, tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["sweep", "--url", token_server.base_url, "--workload", "tiny", "--rates", "20,40", "--num-requests",
               "15", "--slo", "ttft=1s", "--out", str(out), "--no-progress", "--scrape-interval", "0"])
    assert rc == 0
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["rate_rps"] for r in doc["runs"]] == [20.0, 40.0]
    assert (out / "rate-20" / "requests.jsonl").exists()
    text = capsys.readouterr().out
    assert "headline" in text and "lower bound" in text


def test_unreachable_url_exits_3_with_one_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    rc = main(["run", "--url", url, "--model", "m", "--workload", "tiny", "--num-requests", "5",
               "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and url.split("/v1")[0] in err[0]
    assert not (tmp_path / "r").exists()  # nothing half-written for a run that never started


def test_wrong_model_exits_3(token_server, tmp_path, capsys):
    rc = main(["run", "--url", token_server.base_url, "--model", "no-such-model", "--workload", "tiny",
               "--num-requests", "5", "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 3
    assert token_server.model in capsys.readouterr().err  # says what is served


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--slo", "ttft=fast"], "slo.ttft"),
        (["--slo", "ttfb=1s"], "unknown key"),
        (["--workload", "no-such-workload"], "no-such-workload"),
        (["--rate", "-1"], "--rate"),
        (["--num-requests", "0"], "--num-requests"),
        (["--extra-body", "[1]"], "--extra-body"),
        (["--header", "nocolon"], "--header"),
        (["--warmup", "some"], "--warmup"),
        (["--client-workers", "0"], "--client-workers"),
        (["--client-workers", "65"], "--client-workers"),
        (["--replicas", "2"], "--replicas needs --simulate"),
        (["--url", ","], "--url"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(token_server, tmp_path, capsys, argv, needle):
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--num-requests", "3",
               "--out", str(tmp_path / "r"), "--no-progress", *argv])
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_malformed_workload_file_exits_2_naming_field(token_server, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[arrival]\nprocess = "poisson"\nrate_rps = -3\n'
                   '[input]\ndist = "fixed"\nvalue = 8\n[output]\ndist = "fixed"\nvalue = 4\n')
    rc = main(["run", "--url", token_server.base_url, "--workload", str(bad), "--no-progress",
               "--out", str(tmp_path / "r")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "rate_rps" in err and "-3" in err


def test_summarize_missing_dir_exits_2(tmp_path, capsys):
    assert main(["summarize", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_run_against_in_process_engine(tmp_path):
    out = tmp_path / "eng"
    rc = main(["run", "--engine", "modeled", "--workload", "tiny", "--rate", "20", "--num-requests", "40",
               "--slo", "ttft=2s", "--out", str(out), "--no-progress"])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["kind"] == "engine" or "engine" in json.dumps(manifest["target"])
    assert json.loads((out / "summary.json").read_text())["num_ok"] == 40


def test_capacity_simulated_writes_result(tmp_path):
    out = tmp_path / "cap"
    # 300 requests a probe: at 100 the probes last 2 s, the replicates extrapolate past their edges and the
    # capacity's interval spans more than every rate probed, which is an inconclusive search (exit 4)
    rc = main(["capacity", "--simulate", "--workload", "tiny", "--num-requests", "300", "--slo",
               "ttft=200ms,tpot=50ms", "--start-rate", "8", "--replicates", "3", "--out", str(out), "--no-progress",
               "--gpus", "2", "--slo-scale"])
    assert rc == 0
    doc = json.loads((out / "capacity.json").read_text())
    lo, hi = doc["interval_rps"]
    assert lo <= doc["capacity_rps"] <= hi and doc["capacity_rps"] > 8
    assert doc["goodput_per_gpu_rps"] == pytest.approx(doc["capacity_rps"] / 2)
    assert doc["slo_scale"] and all(row["scale"] > 0 for row in doc["slo_scale"])
    assert doc["target"]["kind"] == "simulated"
    # the search's probes make a report (one point per probed rate); --report is not ignored
    html = tmp_path / "cap.html"
    assert main(["report", str(out), "-o", str(html)]) == 0
    text = html.read_text()
    seed0 = sorted({p["run_dir"] for p in doc["probes"] if p["seed"] == 0})
    assert "The cliff" in text and seed0 and all(d in text for d in seed0)  # each search probe is drawn


def test_http2_option_runs(token_server, tmp_path):
    # h2 is a dependency; over cleartext http the server speaks HTTP/1.1 and httpx falls back to it.
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--rate", "20", "--num-requests", "5",
               "--http2", "--slo", "ttft=5s", "--out", str(tmp_path / "r"), "--no-progress", "--scrape-interval", "0"])
    assert rc == 0


def test_simulated_sweep_accepts_realistic_token_ids(tmp_path):
    # The modeled engine stands for a GPU model: token ids of a Llama-3-sized vocabulary are served.
    out = tmp_path / "s"
    rc = main(["sweep", "--simulate", "--profile", "h100-llama-1b", "--workload", "chat", "--rates", "2,400",
               "--num-requests", "150", "--max-model-len", "8192", "--slo", "ttft=500ms,tpot=50ms", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "sweep.json").read_text())
    first, last = (r["summary"] for r in doc["runs"])
    assert first["num_ok"] == 150 and first["attainment"]["value"] == 1.0
    assert last["attainment"]["value"] < first["attainment"]["value"]  # past the modeled engine's cliff
    assert (out / "rate-2" / "requests.jsonl").exists()


def test_simulate_refuses_flags_it_cannot_honour(tmp_path, capsys):
    rc = main(["run", "--simulate", "--workload", "tiny", "--concurrency", "4", "--out", str(tmp_path / "r")])
    assert rc == 2 and "--concurrency" in capsys.readouterr().err


def test_warmup_auto_through_the_cli(token_server, tmp_path):
    out = tmp_path / "w"
    rc = main(["run", "--url", token_server.base_url, "--workload", "tiny", "--rate", "50", "--num-requests", "40",
               "--warmup", "auto", "--slo", "ttft=5s", "--out", str(out), "--no-progress", "--scrape-interval", "0"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["warmup"]["rule"] == "MSER-5" and s["num_warmup"] == s["warmup"]["num_requests"]
    assert s["num_requests"] + s["num_warmup"] == 40


def test_simulated_fleet_capacity_and_bad_fleet_flags(tmp_path, capsys):
    out = tmp_path / "fleet"
    # 300 requests a probe: at 100 the probes last 2 s, the replicates extrapolate past their edges and the
    # capacity's interval spans more than every rate probed, which is an inconclusive search (exit 4)
    rc = main(["capacity", "--simulate", "--workload", "tiny", "--num-requests", "300", "--slo",
               "ttft=200ms,tpot=50ms", "--start-rate", "8", "--replicates", "3", "--out", str(out), "--no-progress",
               "--replicas", "3", "--router", "round-robin"])
    assert rc == 0
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["target"]["fleet"] == {"replicas": 3, "router": "round-robin"}
    assert doc["gpus"] == 3 and doc["goodput_per_gpu_rps"] == pytest.approx(doc["capacity_rps"] / 3)
    probe = json.loads((out / doc["probes"][0]["run_dir"] / "summary.json").read_text())
    assert probe["fleet"]["replicas"] == 3 and sum(probe["fleet"]["requests_per_replica"]) == probe["num_requests"]
    single = tmp_path / "one"
    assert main(["run", "--simulate", "--workload", "tiny", "--num-requests", "20", "--out", str(single),
                 "--no-progress"]) == 0
    assert "fleet" not in json.loads((single / "manifest.json").read_text())["target"]  # identity unchanged
    capsys.readouterr()
    rc = main(["run", "--engine", "modeled", "--workload", "tiny", "--num-requests", "3", "--replicas", "2",
               "--out", str(tmp_path / "x"), "--no-progress"])
    assert rc == 2 and "--replicas needs --simulate" in capsys.readouterr().err


def test_capacity_probes_last_a_minute_unless_told(tmp_path):
    out = tmp_path / "cap"
    rc = main(["capacity", "--simulate", "--workload", "tiny", "--slo", "ttft=200ms,tpot=50ms", "--start-rate", "8",
               "--replicates", "2", "--max-probes", "3", "--out", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "capacity.json").read_text())
    durations = [p["duration_s"] for p in doc["probes"]]
    assert durations and min(durations) > 55  # the tiny workload's 64 requests would have lasted ~3-8 s
    assert not any("lasted only" in n for n in doc["notes"])
    told = tmp_path / "told"
    assert main(["capacity", "--simulate", "--workload", "tiny", "--slo", "ttft=200ms,tpot=50ms", "--start-rate", "8",
                 "--replicates", "2", "--max-probes", "3", "--num-requests", "64", "--out", str(told),
                 "--no-progress"]) == 0
    doc = json.loads((told / "capacity.json").read_text())
    assert max(p["duration_s"] for p in doc["probes"]) < 20


def test_sweep_points_last_a_minute_unless_told(tmp_path):
    out = tmp_path / "s"
    assert main(["sweep", "--simulate", "--workload", "tiny", "--rates", "20,80", "--out", str(out),
                 "--no-progress"]) in (0, 1)
    doc = json.loads((out / "sweep.json").read_text())
    assert all(r["summary"]["duration_s"] > 55 for r in doc["runs"])  # 64 requests at 80 req/s: under 1 s
    short = tmp_path / "short"
    main(["sweep", "--simulate", "--workload", "tiny", "--rates", "80", "--num-requests", "64", "--out", str(short),
          "--no-progress"])
    assert json.loads((short / "sweep.json").read_text())["runs"][0]["summary"]["duration_s"] < 5
