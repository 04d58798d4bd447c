"""The GitHub Action's script (`python -m slobench.ci_action`), run without `act` against the bundled
engine: the start command, the outputs, the step summary, the baseline recorded then followed, the history;
and the pull request comment under GitHub's size limit."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import slobench.ci_action as action
from slobench.ci_action import COMMENT_LIMIT, COMMENT_MARKER, comment_body
from slobench.gate import Samples, Threshold, gate, load_samples
from slobench.history import read_history

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_action(tmp_path, name, **inputs):
    out_file, summary = tmp_path / f"{name}.output", tmp_path / f"{name}.summary"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env |= {"GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_SHA": f"sha-{name}",
            "GITHUB_SERVER_URL": "https://github.example", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7"}
    env |= {f"INPUT_{k.upper()}": str(v) for k, v in inputs.items()}
    proc = subprocess.run([sys.executable, "-m", "slobench.ci_action"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    outputs = dict(line.split("=", 1) for line in out_file.read_text().splitlines()) if out_file.exists() else {}
    return proc, outputs, summary.read_text() if summary.exists() else ""


@pytest.mark.integration
def test_action_starts_the_engine_records_then_gates_a_baseline(tmp_path):
    port = free_port()
    common = {
        "START_COMMAND": f"{sys.executable} -m reference_engine.server --executor modeled --model tiny "
                         f"--profile {ROOT / 'baselines/ci-profile.json'} --kv-blocks 60 --host 127.0.0.1 "
                         f"--port {port}",
        "URL": f"http://127.0.0.1:{port}/v1", "MODEL": "tiny", "WORKLOAD": "tiny", "RATES": "10",
        "SLO": "ttft=300ms,tpot=70ms,target=0.9", "REPLICATES": "3", "BASELINE": "baselines/main.json",
        "CAPACITY_ARGS": "--input-len 32 --output-len 16 --num-requests 30 --scrape-interval 0",
        "MAX_RISE": "ttft.p50=300%\ntpot.p50=300%", "MAX_DROP": "attainment=50pt", "UPDATE_BASELINE": "true",
        "HISTORY": "perf/history.jsonl", "STARTUP_TIMEOUT": "60",
    }
    # first run on main: no baseline yet, so it records one
    proc, out, summary = run_action(tmp_path, "first", **common, OUT_DIR="ci1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["verdict"] == "no-baseline" and out["baseline-updated"] == "true"
    assert json.loads((tmp_path / "baselines/main.json").read_text())["kind"] == "baseline"
    # second run: gated against it, generous thresholds on an identical server: a pass
    proc, out, summary = run_action(tmp_path, "second", **common, OUT_DIR="ci2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out["verdict"] == "pass" and out["exit-code"] == "0" and out["baseline-updated"] == "true"
    for key in ("junit", "markdown", "html", "comment", "history-html", "result"):
        assert (tmp_path / out[key]).exists(), key
    assert "<testsuites" in (tmp_path / out["junit"]).read_text()
    comment = (tmp_path / out["comment"]).read_text()
    assert comment.startswith(COMMENT_MARKER) and "✅ pass" in comment and "ttft.p50@10" in comment
    assert "https://github.example/o/r/actions/runs/7" in comment and " [" in comment  # intervals shown
    assert "slobench gate" in summary and "ttft.p50@10" in summary
    assert [e["commit"] for e in read_history(tmp_path / "perf/history.jsonl")] == ["sha-first", "sha-second"]
    assert [e["verdict"] for e in read_history(tmp_path / "perf/history.jsonl")] == [None, "pass"]
    assert "slobench-figures" in (tmp_path / out["html"]).read_text()
    assert not (tmp_path / "ci2/server.log").read_text().count("Traceback")


def test_a_start_command_that_dies_is_exit_3_with_its_log(tmp_path):
    proc, out, _ = run_action(tmp_path, "dead", START_COMMAND="echo cannot load model >&2; exit 7",
                              URL=f"http://127.0.0.1:{free_port()}/v1", SLO="ttft=1s", STARTUP_TIMEOUT="20")
    assert proc.returncode == 3
    assert "exited (7)" in proc.stderr and "cannot load model" in proc.stderr


def test_bad_inputs_are_exit_2(tmp_path):
    proc, _, _ = run_action(tmp_path, "noslo", URL="http://127.0.0.1:9/v1")
    assert proc.returncode == 2 and "input slo is required" in proc.stderr
    proc, _, _ = run_action(tmp_path, "flag", SLO="ttft=1s", UPDATE_BASELINE="yes")
    assert proc.returncode == 2 and "expected true or false" in proc.stderr


def _samples(keys, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    s = Samples(f"side{seed}", {"name": "w", "hash": "h", "spec": {}}, None, "0")
    for k in keys:
        for rep in range(1, 6):
            s.add(k, rep, scale * (1 + rng.normal(0, 0.01)) * (0.1 if "@" in k else 20), "x")
    return s


def test_the_comment_fits_githubs_limit_and_keeps_the_worst_rows():
    keys = [f"ttft.p99@{r}" for r in range(1, 1201)]  # an absurd number of rates: ~150,000 characters of rows
    base, cand = _samples(keys, 1), _samples(keys, 2, scale=1.0)
    cand.metrics["ttft.p99@1199"] = {s: v * 1.5 for s, v in base.metrics["ttft.p99@1199"].items()}
    res = gate(base, cand, [Threshold.parse("ttft.p99=10%", "rise")])
    body = comment_body(res, base, cand, artifact_url="https://x/run/1")
    assert len(body) <= COMMENT_LIMIT
    assert "more rows left out to fit a comment" in body
    assert body.index("`ttft.p99@1199`") < body.index("`ttft.p99@1`")  # the regression first
    assert "❌ regression" in body and "https://x/run/1" in body
    small = comment_body(gate(base, base, [Threshold.parse("ttft.p99@1=10%", "rise")]), base, base)
    assert "left out" not in small and small.count("\n| `") == 1


def test_action_yml_maps_every_input_and_output_the_script_uses():
    yaml = pytest.importorskip("yaml")
    import re

    import slobench.ci_action as action

    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    step = next(s for s in spec["runs"]["steps"] if s.get("id") == "gate")
    for name in spec["inputs"]:
        if name in ("python", "install"):
            continue
        var = f"INPUT_{name.upper().replace('-', '_')}"
        assert step["env"].get(var) == f"${{{{ inputs.{name} }}}}", name
    source = Path(action.__file__).read_text()
    read = set(re.findall(r'get\("([a-z-]+)"', source)) | set(re.findall(r'flag\("([a-z-]+)"', source))
    assert read == set(spec["inputs"]) - {"python", "install"}
    for name, out in spec["outputs"].items():
        assert out["value"] == f"${{{{ steps.gate.outputs.{name} }}}}"
        assert f'"{name}"' in source, f"the script never writes output {name}"


def docs_workflow_steps() -> list[dict]:
    """Every step of the YAML blocks in docs/guide/ci.md that uses the action (`uses: ./.slobench`)."""
    yaml = pytest.importorskip("yaml")
    import re

    text = (ROOT / "docs/guide/ci.md").read_text()
    steps = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        doc = yaml.safe_load(block)
        jobs = doc.get("jobs", doc)
        for job in jobs.values():
            steps += [s for s in job["steps"] if s.get("uses") == "./.slobench"]
    return steps


def test_the_docs_workflows_use_only_inputs_the_action_has():
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = docs_workflow_steps()
    assert len(steps) == 2  # the llama.cpp CPU example and the vLLM GPU snippet
    for step in steps:
        assert set(step["with"]) <= set(spec["inputs"]), set(step["with"]) - set(spec["inputs"])
        assert "slo" in step["with"] and "start-command" in step["with"]


def test_comment_intervals_stay_inside_what_a_metric_can_be():
    base = Samples("b", {"name": "w", "hash": "h", "spec": {}}, None, "0")
    cand = Samples("c", {"name": "w", "hash": "h", "spec": {}}, None, "0")
    for seed, (a, b, t) in enumerate([(0.7, 0.2, 0.1), (1.0, 1.0, 3.0)], 1):  # two wild replicates
        base.add("attainment@1", seed, a, "b")
        cand.add("attainment@1", seed, b, "c")
        base.add("ttft.p50@1", seed, t, "b")
        cand.add("ttft.p50@1", seed, t, "c")
    res = gate(base, cand, [Threshold.parse("attainment=5pt", "drop"), Threshold.parse("ttft.p50=10%", "rise")])
    body = comment_body(res, base, cand)
    assert "[0.0%, 100.0%]" in body and "[0 ms," in body and "[-" not in body


# the golden capacity search (tests/golden/regen.py) with two probes a seed: five seeds' crossings lie
# outside the search's bracket and are censored
SIM_INCONCLUSIVE = ["--simulate", "--profile", "h100-llama-1b", "--num-requests", "150", "--seed", "3",
                    "--seed-probes", "2"]


def run_simulated_action(tmp_path, monkeypatch, name, **inputs):
    """The action in process, its capacity search on the simulator in place of a server at INPUT_URL."""
    real_argv = getattr(action._capacity_argv, "real", action._capacity_argv)

    def simulated(inp, out):
        argv = real_argv(inp, out)
        at = argv.index("--url")
        return argv[:at] + argv[at + 2:] + SIM_INCONCLUSIVE

    simulated.real = real_argv
    monkeypatch.setattr(action, "_capacity_argv", simulated)
    out_file, summary = tmp_path / f"{name}.output", tmp_path / f"{name}.summary"
    env = {"GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary), "INPUT_WORKLOAD": "chat",
           "INPUT_SLO": "ttft=300ms,tpot=30ms", "INPUT_OUT_DIR": str(tmp_path / name)}
    env |= {f"INPUT_{k.upper()}": str(v) for k, v in inputs.items()}
    code = action.run_action(env)
    return code, dict(line.split("=", 1) for line in out_file.read_text().splitlines()), summary.read_text()


def test_an_inconclusive_capacity_is_a_verdict_with_its_reason_not_an_error(tmp_path, monkeypatch, capsys):
    baseline = tmp_path / "baselines/main.json"
    code, out, summary = run_simulated_action(tmp_path, monkeypatch, "first", BASELINE=baseline,
                                              UPDATE_BASELINE="true", HISTORY=tmp_path / "history.jsonl")
    assert code == 0 and out["verdict"] == "inconclusive" and out["exit-code"] == "0"
    assert out["inconclusive-reason"].startswith("5 of 6 seeds not bracketed within 2 probes each")
    md = Path(out["markdown"]).read_text()
    assert md.startswith("### slobench gate: ⚠️ inconclusive") and "not bracketed within 2 probes" in md
    assert "not bracketed within 2 probes" in summary
    assert "not bracketed within 2 probes" in Path(out["comment"]).read_text()
    # nothing is recorded from it: no baseline, no history line; the report is still made
    assert out["baseline-updated"] == "false" and not baseline.exists()
    assert not (tmp_path / "history.jsonl").exists() and "history-html" not in out
    assert Path(out["html"]).is_file()
    assert "the capacity search was inconclusive" in capsys.readouterr().out


def test_an_inconclusive_capacity_against_a_baseline_fails_only_when_asked(tmp_path, monkeypatch):
    # a baseline of the same workload and SLO with a capacity located at 30 req/s (seeds 4..8)
    run_simulated_action(tmp_path, monkeypatch, "measured")
    base = load_samples([tmp_path / "measured/capacity"])
    for seed, value in zip(range(4, 9), (29.0, 30.0, 31.0, 30.5, 29.5), strict=True):
        base.add("capacity", seed, value, "baseline")
    (tmp_path / "base.json").write_text(json.dumps(base.to_baseline()))
    code, out, summary = run_simulated_action(tmp_path, monkeypatch, "gated", BASELINE=tmp_path / "base.json",
                                              FAIL_ON_INCONCLUSIVE="true")
    assert code == 4 and out["verdict"] == "inconclusive" and out["exit-code"] == "4"
    comment = Path(out["comment"]).read_text()
    assert "⚠️ inconclusive" in comment and "not bracketed within 2 probes" in comment
    row = next(line for line in comment.splitlines() if line.startswith("| `capacity`"))
    assert "| 30 req/s [29 req/s, 31 req/s] | – |" in row  # the baseline's interval; the candidate has none
    assert "<skipped" in Path(out["junit"]).read_text()


def test_a_capacity_that_fails_is_an_error_not_a_verdict(tmp_path):
    proc, out, summary = run_action(tmp_path, "down", URL=f"http://127.0.0.1:{free_port()}/v1", SLO="ttft=1s",
                                    CAPACITY_ARGS="--num-requests 5")
    assert proc.returncode == 3 and out["verdict"] == "error" and out["exit-code"] == "3"
    assert "inconclusive-reason" not in out and "exited 3" in summary
