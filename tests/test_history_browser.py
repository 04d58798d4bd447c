"""The history page in headless Chromium with the network off (the run report's harness): every figure
renders, the console stays silent, change points are drawn, hostile commit ids show as text."""

import asyncio
import json

import pytest

from slobench.history import append_entry, entry_from_results
from slobench.history.page import build_history_page
from slobench.history.synthetic import drift_levels, replicate_values
from tests.test_history import HOSTILE, baseline_file
from tests.test_report_browser import CHROMIUM, open_report

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def opened(tmp_path_factory) -> tuple[dict, str]:
    import numpy as np

    root = tmp_path_factory.mktemp("history-browser")
    rng = np.random.default_rng(5)
    hist = root / "history.jsonl"
    verdicts = ["pass"] * 8 + ["inconclusive", "fail"]
    for i, per in enumerate(replicate_values(drift_levels(10, per_commit=-0.02), rng)):
        b = baseline_file(root / f"b{i}.json", per)
        commit = f"{HOSTILE}{i}" if i == 3 else f"c{i:02d}"
        append_entry(hist, entry_from_results([b], commit=commit, date=f"2026-11-{i + 1:02d}", verdict=verdicts[i]))
    out, metrics = build_history_page(hist, root / "history.html", title="history " + HOSTILE)
    assert metrics[0].changes, "the synthetic drift should give a change point"
    r = asyncio.run(open_report(out, tmp_path_factory.mktemp("chromium-profile")))
    return r, out.read_text()


def test_history_page_renders_offline_and_silently(opened):
    r, page = opened
    assert r["expected"] == 1 and r["rendered"] == 1, f"{r['rendered']} of {r['expected']} figures rendered"
    assert r["plotlyVersion"]
    noise = [e for e in r["events"] if e["method"] in ("Runtime.consoleAPICalled", "Runtime.exceptionThrown")
             or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))]
    assert noise == [], f"console not silent: {json.dumps(noise)[:2000]}"
    assert r["scripts"] == page.count("<script") == 2  # plotly.js + the one figure


def test_history_page_shows_change_points_verdicts_and_hostile_text(opened):
    r, _ = opened
    assert r["alerts"] == [] and r["injected"] == 0
    assert HOSTILE in r["body"]  # title and commit table: literal text
    assert "change point" in r["body"] and "every commit passed the gate" in r["body"]
    assert {"gate: pass", "gate: inconclusive", "gate: fail"} <= set(r["legend"])
    assert "(p=" in r["svgText"]  # the change point's annotation is drawn
