"""The bundled `day` workload and the days the planner cuts into windows: the mix swings as the day's essay
says (prefill-heavy morning, decode-heavy afternoon, the rate rising and falling), lengths have long tails,
prompts share prefixes; windows of a spec and of traces (Azure 2023 code + conversation interleaved, skipped
when the shared traces are absent; a Mooncake-style file written here) hold what their part of the day does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.fleet.plan_day import DayRecipe, build_windows, day_length_s
from slobench.workload import generate, load_workload

AZURE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"


@pytest.fixture(scope="module")
def day_requests() -> list:  # type: ignore[type-arg]
    return generate(load_workload("day"), seed=0)


def _hours(reqs: list, hours: range) -> tuple[float, float, float]:  # type: ignore[type-arg]
    """rate, prefill:decode token ratio and mean output of the requests in those hours (60 s each)."""
    sel = [r for r in reqs if int(r.arrival_s // 60) in hours]
    ins = sum(r.input_tokens for r in sel)
    outs = sum(r.max_tokens for r in sel)
    return len(sel) / (60 * len(hours)), ins / outs, outs / len(sel)


def test_the_day_swings_from_prefill_heavy_mornings_to_decode_heavy_afternoons(day_requests: list) -> None:  # type: ignore[type-arg]
    spec = load_workload("day")
    assert len(spec.phases) == 24 and {p.duration_s for p in spec.phases} == {60}
    assert day_length_s(DayRecipe(workload=spec)) == 24 * 60
    night_rate, _, _ = _hours(day_requests, range(1, 5))
    morning_rate, morning_ratio, _ = _hours(day_requests, range(8, 12))
    afternoon_rate, afternoon_ratio, afternoon_out = _hours(day_requests, range(14, 18))
    assert morning_ratio > 8 * afternoon_ratio  # documents in the morning, long answers after lunch
    assert afternoon_ratio < 2 < morning_ratio
    assert min(morning_rate, afternoon_rate) > 4 * night_rate  # the rate rises and falls
    assert afternoon_out > 200
    tags = {r.tag for r in day_requests}
    assert "h10/doc" in tags and "h15/gen" in tags and "h02/doc" not in tags


def test_lengths_have_long_tails_and_prompts_share_prefixes(day_requests: list) -> None:  # type: ignore[type-arg]
    chat_in = np.array([r.input_tokens for r in day_requests if r.tag.endswith("/chat")])
    chat_out = np.array([r.max_tokens for r in day_requests if r.tag.endswith("/chat")])
    gen_out = np.array([r.max_tokens for r in day_requests if r.tag.endswith("/gen")])
    # p99 / median: a lognormal's long right tail (a prompt's length counts its system prompt, which damps it)
    for x, ratio in ((chat_in, 2.5), (chat_out, 4.0), (gen_out, 2.5)):
        assert np.quantile(x, 0.99) > ratio * np.median(x)
    heads = [tuple(r.prompt[:128]) for r in day_requests[:2000]]
    shared = max(heads.count(h) for h in set(heads)) / len(heads)
    assert shared > 0.2  # the most popular system prompt opens more than a fifth of the prompts


def test_windows_of_the_day_hold_their_hours(tmp_path: Path) -> None:
    recipe = DayRecipe(workload=load_workload("day"), compression=60, window_s=3600, max_requests=50, rate_rps=17.0)
    ws = build_windows(recipe)
    assert len(ws) == 24 and [w.start_s for w in ws[:3]] == [0, 60, 120]
    phases = load_workload("day").phases
    scale = 17.0 / (sum(p.arrival.rate_rps for p in phases) / 24)
    for w, p in zip(ws, phases, strict=True):
        assert w.stats["rate_rps"] == pytest.approx(p.arrival.rate_rps * scale)  # --rate rescales every hour
        assert len(w.counted) <= 50 and w.num_lead > 0 or w.index == 0
        assert all(r.tag.startswith(p.name + "/") for r in w.counted)
        t = [r.arrival_s for r in w.specs]
        assert t == sorted(t) and t[0] >= 0.0
    assert ws[10].stats["prefill_decode_ratio"] > 8 * ws[15].stats["prefill_decode_ratio"]
    q = build_windows(DayRecipe(workload=load_workload("day"), compression=60, window_s=900, max_requests=20))
    assert len(q) == 96 and q[41].counted[0].tag.startswith("h10/")  # 15 min windows: four an hour
    again = build_windows(recipe)
    assert [w.specs for w in again] == [w.specs for w in ws]  # the same day for a seed


def test_the_day_runs_anywhere_a_workload_does(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["workload", "show", "day"]) == 0
    assert "h00" in capsys.readouterr().out
    rc = main(["run", "--simulate", "--workload", "day", "--duration", "4", "--profile", "h100-llama-1b",
               "--max-model-len", "16384", "--out", str(tmp_path / "r"), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    lines = (tmp_path / "r" / "requests.jsonl").read_text().splitlines()
    tags = {json.loads(line).get("tag") for line in lines[1:]}
    assert len(lines) > 5 and tags <= {"h00/chat", "h00/gen", None}, tags


def test_a_trace_day_is_cut_by_its_own_clock(tmp_path: Path) -> None:
    p = tmp_path / "mooncake.jsonl"
    rng = np.random.default_rng(0)
    t_ms = np.sort(rng.uniform(0, 600_000, 400))  # ten minutes
    with open(p, "w") as fh:
        for i, t in enumerate(t_ms):
            fh.write(json.dumps({"timestamp": int(t), "input_length": 1024, "output_length": 20,
                                 "hash_ids": [i % 3, 100 + i]}) + "\n")
    ws = build_windows(DayRecipe(traces=(str(p),), window_s=120, max_requests=30))
    assert len(ws) == 5
    assert sum(w.num_requests for w in ws) == 400
    assert all(len(w.counted) == 30 for w in ws)
    w = ws[2]
    heads = {r.prompt[:512] for r in w.counted}  # type: ignore[index]
    assert len(heads) == 3  # the shared first block of the hash ids: three prefixes


@pytest.mark.skipif(not AZURE.is_dir(), reason="the Azure 2023 traces are not in ../shared/traces")
def test_azure_code_and_conversation_interleave_into_one_day() -> None:
    code, conv = AZURE / "AzureLLMInferenceTrace_code.csv", AZURE / "AzureLLMInferenceTrace_conv.csv"
    ws = build_windows(DayRecipe(traces=(str(code), str(conv)), window_s=600, max_requests=200))
    assert len(ws) == 6  # the hour of the traces in 10 minute windows
    total = sum(w.num_requests for w in ws)
    assert total > 25_000
    classes: dict[str, int] = {}
    for w in ws:
        for k, n in w.stats["classes"].items():
            classes[k] = classes.get(k, 0) + n
    assert set(classes) == {"AzureLLMInferenceTrace_code", "AzureLLMInferenceTrace_conv"}
    assert all(len(w.counted) == 200 for w in ws)
