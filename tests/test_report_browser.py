"""Open the HTML report in headless Chromium with the network off: every figure renders, the console stays
silent, and hostile strings show as text without running.

Chromium is driven over its DevTools protocol (a websocket, via aiohttp). For the README picture:
    SLOBENCH_SCREENSHOT=out.png [SLOBENCH_SCREENSHOT_OF=reports/example.html] pytest tests/test_report_browser.py
saves a PNG of the top of that report (default: a clean synthetic sweep), after checking it rendered.
"""

import asyncio
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import aiohttp
import pytest

from slobench.report import build_report
from slobench.report.synthetic import write_synthetic_sweep
from slobench.report.tune_page import build_tune_page
from tests.tune_helpers import synthetic_tune

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = "<script>alert(1)</script><b>b</b>\"'&"
HOSTILE_DIR = "sweep <img src=x onerror=alert(2)> \"q\""
DEADLINE_S = 25.0

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed (apt-get install chromium)"),
]


class CDP:
    """Just enough of the DevTools protocol: commands on one page session, events collected."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.session: str | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            d = json.loads(msg.data)
            if "id" in d and d["id"] in self.pending:
                self.pending.pop(d["id"]).set_result(d)
            elif "method" in d:
                self.events.append(d)

    async def send(self, method: str, params: dict | None = None, *, browser: bool = False) -> dict:
        i = next(self.ids)
        msg: dict = {"id": i, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_str(json.dumps(msg))
        d = await asyncio.wait_for(fut, DEADLINE_S)
        if "error" in d:
            raise RuntimeError(f"{method}: {d['error']}")
        return d["result"]

    async def eval(self, expr: str):
        r = await self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return r["result"].get("value")


async def _devtools_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    while True:
        line = (await proc.stderr.readline()).decode(errors="replace")
        if not line:
            raise RuntimeError("chromium exited before printing its DevTools address")
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            return m.group(1)


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.readline():
        pass  # keep reading so chromium never blocks on a full stderr pipe


async def open_report(path: Path, profile: Path, screenshot: str | None = None, *, full_page: bool = False) -> dict:
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--no-default-browser-check",
        f"--user-data-dir={profile}",
        # the network off: every request would go through a proxy that does not exist, loopback included
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
        "--remote-debugging-port=0", "--window-size=1400,1000", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    drain = None
    try:
        url = await asyncio.wait_for(_devtools_url(proc), DEADLINE_S)
        drain = asyncio.ensure_future(_drain(proc.stderr))
        async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
            cdp = CDP(ws)
            target = await cdp.send("Target.createTarget", {"url": "about:blank"})
            att = await cdp.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
            cdp.session = att["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                await cdp.send(f"{domain}.enable")
            await cdp.send("Page.addScriptToEvaluateOnNewDocument", {"source": (
                "window.__alerts = []; for (const f of ['alert', 'confirm', 'prompt'])"
                " window[f] = (m) => { window.__alerts.push(f + ':' + m); };")})
            await cdp.send("Page.navigate", {"url": path.resolve().as_uri()})
            expected = None
            rendered = -1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while loop.time() < deadline:
                state = await cdp.eval(
                    "document.readyState === 'complete' ? {"
                    " expected: Number(document.querySelector('meta[name=slobench-figures]').content),"
                    " rendered: Array.from(document.querySelectorAll('.js-plotly-plot'))"
                    "   .filter(d => d.querySelector('svg.main-svg')).length} : null")
                if state:
                    expected, rendered = state["expected"], state["rendered"]
                    if rendered == expected:
                        break
                await asyncio.sleep(0.1)  # polling a page, bounded by the deadline above
            facts = await cdp.eval(
                "({scripts: document.querySelectorAll('script').length, alerts: window.__alerts,"
                " body: document.body.innerText, plotlyVersion: window.Plotly && Plotly.version,"
                " legend: Array.from(document.querySelectorAll('.legendtext')).map(e => e.textContent),"
                " svgText: Array.from(document.querySelectorAll('svg text')).map(e => e.textContent).join('\\n'),"
                " injected: document.querySelectorAll('img, iframe, object, embed').length,"
                # per figure: each axis's tick labels as drawn, the rate axes' titles, the text boxes
                " figures: Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => ({"
                "   ticks: Array.from(d.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above'))"
                "     .map(g => Array.from(g.querySelectorAll('text')).map(t => t.textContent)),"
                "   axisTitles: Array.from(d.querySelectorAll('.g-xtitle, .g-x2title, .g-x3title'))"
                "     .map(t => t.textContent),"
                "   boxes: Array.from(d.querySelectorAll('g.annotation')).map(a => {"
                "     const r = a.getBoundingClientRect();"
                "     return {text: a.textContent, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; })}))})")
            if screenshot:
                if full_page:
                    height = await cdp.eval("document.documentElement.scrollHeight")
                    await cdp.send("Emulation.setDeviceMetricsOverride",
                                   {"width": 1400, "height": int(height), "deviceScaleFactor": 1, "mobile": False})
                shot = await cdp.send("Page.captureScreenshot", {"format": "png"})
                import base64

                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            await asyncio.sleep(0.2)  # let late console events (if any) arrive before judging silence
            cdp.reader.cancel()
            return {"expected": expected, "rendered": rendered, "events": cdp.events, **facts}
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if drain is not None:
            drain.cancel()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    a = write_synthetic_sweep(root / HOSTILE_DIR, [2, 5, 8, 11], 300, model=HOSTILE, workload_name=HOSTILE,
                              error_text=HOSTILE, tags=("warm", HOSTILE, "cool"))
    b = write_synthetic_sweep(root / "baseline", [2, 5, 8], 300, capacity_rps=8, seed=5)
    return build_report([b, a], root / "report.html", title="browser test " + HOSTILE)


@pytest.fixture(scope="module")
def opened(report, tmp_path_factory) -> dict:
    """One browser session for the module: chromium takes seconds to start."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    return asyncio.run(open_report(report, profile))


def test_report_renders_offline_and_silently(opened):
    r = opened
    assert r["expected"] and r["expected"] >= 6
    assert r["rendered"] == r["expected"], f"{r['rendered']} of {r['expected']} figures rendered"
    assert r["plotlyVersion"], "plotly.js did not load from the inline bundle"
    noise = [e for e in r["events"] if e["method"] in ("Runtime.consoleAPICalled", "Runtime.exceptionThrown")
             or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))]
    assert noise == [], f"console not silent: {json.dumps(noise)[:2000]}"
    assert not any(e["method"] == "Page.javascriptDialogOpening" for e in r["events"])


def test_hostile_strings_show_as_text_and_never_run(report, opened):
    r = opened
    html = report.read_text()
    assert r["alerts"] == []
    assert r["injected"] == 0  # no <img onerror=...> became an element
    assert r["scripts"] == html.count("<script") == int(r["expected"]) + 1  # plotly.js + one per figure
    assert HOSTILE in r["body"]  # header, tables, error lists: literal text
    assert any("<img src=x onerror=alert(2)>" in t for t in r["legend"])  # plotly legend: literal text
    assert HOSTILE in r["svgText"]  # a phase name drawn by plotly: its <b> stays text, not bold markup


def _tick_value(label: str) -> float:
    return float(label.replace(",", "").replace("%", "").replace("\u2212", "-"))


def test_every_axis_reads_in_order_with_full_labels(opened):
    """Plotly's log axes label their minor ticks in short ("2" after "10" for 20): each axis's labels, read
    left to right or bottom to top, must be numbers that only grow."""
    drawn = [ticks for fig in opened["figures"] for ticks in fig["ticks"] if ticks]
    assert len(drawn) >= 10
    for labels in drawn:
        values = [_tick_value(t) for t in labels]
        assert values == sorted(values) and len(set(values)) == len(values), labels


def _overlaps(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def test_a_single_rate_run_gets_a_report_of_one_rate(tmp_path):
    """No chart over offered rate (a line through one point), and no two labels drawn over each other."""
    run = write_synthetic_sweep(tmp_path / "one-rate", [6], 300, capacity_rps=5, model="synthetic-model")
    path = build_report([run], tmp_path / "report.html")
    shot = tmp_path / "one-rate.png"
    r = asyncio.run(open_report(path, tmp_path / "profile", str(shot), full_page=True))
    assert r["rendered"] == r["expected"] >= 1
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any("offered rate" in t for fig in r["figures"] for t in fig["axisTitles"])
    for fig in r["figures"]:
        boxes = [b for b in fig["boxes"] if b["x1"] > b["x0"]]
        clashes = [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if _overlaps(a, b)]
        assert clashes == []
    assert "6 req/s" in r["body"]


def test_the_tune_page_renders_silently_with_hostile_strings_as_text(tmp_path):
    """`slobench report TUNE_DIR`: the tune's three figures drawn, the console silent, a failed
    configuration's hostile parameter, reason and log shown as text."""
    tune = synthetic_tune(tmp_path / "tune", failed={"param": HOSTILE, "reason": HOSTILE, "log": HOSTILE_DIR})
    path = build_tune_page(tune, tmp_path / "tune.html")
    r = asyncio.run(open_report(path, tmp_path / "profile"))
    assert r["rendered"] == r["expected"] == 3
    noise = [e for e in r["events"] if e["method"] in ("Runtime.consoleAPICalled", "Runtime.exceptionThrown")
             or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))]
    assert noise == [], f"console not silent: {json.dumps(noise)[:2000]}"
    assert r["alerts"] == [] and r["injected"] == 0
    assert HOSTILE in r["body"]
    assert "Pareto front" in r["legend"] and "output tokens/s per user" in r["svgText"]
    assert r["body"].index("config=seqs-4") < r["body"].index("config=tp-2")  # 13 req/s on 2 GPUs: 6.5 a GPU


@pytest.mark.skipif(not os.environ.get("SLOBENCH_SCREENSHOT"), reason="set SLOBENCH_SCREENSHOT=path.png to take one")
def test_screenshot(tmp_path):
    src = os.environ.get("SLOBENCH_SCREENSHOT_OF")
    if src:
        path = Path(src)
    else:
        sweep = write_synthetic_sweep(tmp_path / "example", [2, 4, 6, 8, 10, 12], 400, model="synthetic-model")
        path = build_report([sweep], tmp_path / "report.html")
    r = asyncio.run(open_report(path, tmp_path / "profile", os.environ["SLOBENCH_SCREENSHOT"]))
    assert r["rendered"] == r["expected"]
    assert Path(os.environ["SLOBENCH_SCREENSHOT"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
