"""The fleet plan's page (plan.html): one self-contained file made by the run report's page shell.

From top to bottom: the strategies' GPU-hours, attainment and goodput per GPU (a table and bars); the
planner's instances of each role over the day beside every strategy's total; attainment per window of
each strategy against the target; the traffic that drove it (rate and prefill:decode token ratio).
Every string that came from a file (workload and trace names) is escaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from slobench.report.html import esc, page, write_page
from slobench.report.plot import Fig, log_ticks
from slobench.report.style import PLOTLY_CONFIG, TARGET, base_layout, series_color
from slobench.report.style import esc as plot_esc

ROLE_COLORS = {"colocated": "#4c78a8", "prefill": "#f58518", "decode": "#54a24b"}


def write_plan_page(result: dict[str, Any], out: str | Path) -> Path:
    return write_page(Path(out), render_plan(result), "--out")


def plan_figures(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The page's figures (plotly dicts): instances, attainment, traffic, totals."""
    return [_instances(result), _attainment(result), _traffic(result), _totals(result)]


def render_plan(result: dict[str, Any]) -> str:
    import plotly.io as pio  # plotly: imported when the page is drawn

    figs = plan_figures(result)
    divs = [pio.to_html(f, config=PLOTLY_CONFIG, include_plotlyjs=False, full_html=False, div_id=f"fig-{i + 1}",
                        default_height=f"{f['layout'].get('height', 420)}px", validate=False)
            for i, f in enumerate(figs)]
    day = result["day"]
    title = f"Fleet plan: {day['name']}"
    body = [f"<h1>{esc(title)}</h1>", _header(result), _table(result), divs[3], divs[0], divs[1], divs[2]]
    return page(title, "\n".join(body), len(divs), footer="")


def _hours(result: dict[str, Any]) -> list[float]:
    return [w["start_h"] + w["hours"] / 2 for w in result["windows"]]


def _header(result: dict[str, Any]) -> str:
    d, e, o = result["day"], result["engine"], result["options"]
    slo = ", ".join(f"{k[:-2]} &le; {v * 1e3:g} ms" for k, v in result["slo"].items() if k.endswith("_s") and v)
    dyn = result.get("dynamo_profile") or {}
    dyn_line = (f"<li>interpolation baseline profiled at {dyn['mean_input_tokens']} input / "
                f"{dyn['mean_output_tokens']} output tokens: {dyn['prefill_tokens_per_s']:,.0f} prefill and "
                f"{dyn['decode_tokens_per_s']:,.0f} decode tokens/s an instance</li>") if dyn else ""
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.get("notes", []))
    return (
        "<ul>"
        f"<li>day: {esc(d['name'])}, {d['num_windows']} windows of {d['window_s'] / 3600:g} h "
        f"(one workload second = {d['compression']:g} s of the day; at most {d['max_requests_per_window']} "
        "requests simulated a window)</li>"
        f"<li>SLO: {slo} for {result['slo'].get('target', 0.9) * 100:g}% of requests "
        f"{'over the whole day' if o.get('target_scope') == 'day' else 'in every window'}</li>"
        f"<li>instance: profile {esc(e['profile'])}, {e['kv_blocks']} KV blocks, router {esc(e['router'])}, "
        f"KV link {esc(e['kv_link'])} ({e['kv_bytes_per_token']:,} bytes a token); "
        f"{o['gpus_per_instance']} GPU(s) an instance</li>"
        f"<li>planner: fleets {esc(', '.join(o['fleets']))}; switching {o['switch_s']:g} s; scale down after "
        f"{o['hold']} window(s) saving &ge; {o['min_saving']} instance(s)</li>{dyn_line}{notes}</ul>"
    )


def _table(result: dict[str, Any]) -> str:
    rows = []
    for name, s in result["strategies"].items():
        rows.append(
            f"<tr><td>{esc(name)}</td><td>{s['gpu_hours']:.1f}</td><td>{s['attainment']:.2%}</td>"
            f"<td>{s['goodput_per_gpu_rps']:.2f}</td><td>{s['windows_met']}/{s['num_windows']}</td>"
            f"<td>{s['max_instances']}</td><td>{s['instances_switched']}</td></tr>"
        )
    return ("<table><thead><tr><th>strategy</th><th>GPU-hours</th><th>attainment</th><th>goodput / GPU (req/s)"
            "</th><th>windows meeting the target</th><th>most instances</th><th>instances switched</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>")


def _instances(result: dict[str, Any]) -> dict[str, Any]:
    x = _hours(result)
    fig = Fig(1, 1)
    plan = [w["strategies"]["planner"]["fleet"] for w in result["windows"]]
    for role, color in ROLE_COLORS.items():
        fig.add({"type": "bar", "x": x, "y": [f[role] for f in plan], "name": f"planner: {role}",
                 "marker": {"color": color}, "width": [w["hours"] * 0.9 for w in result["windows"]]})
    for i, name in enumerate(n for n in result["strategies"] if n != "planner"):
        fig.add({"x": x, "y": [w["strategies"][name]["fleet"]["instances"] for w in result["windows"]],
                 "name": f"{plot_esc(name)}: instances", "mode": "lines", "line": {"shape": "hvh",
                 "color": series_color(i + 1), "width": 2}})
    fig.x_axis(title={"text": "hour of the day"})
    fig.y_axis(title={"text": "instances"}, rangemode="tozero")
    d = fig.to_dict()
    d["layout"] |= {**base_layout("Instances of each role over the day", height=440), "barmode": "stack"}
    return d


def _attainment(result: dict[str, Any]) -> dict[str, Any]:
    x = _hours(result)
    fig = Fig(1, 1)
    for i, name in enumerate(result["strategies"]):
        fig.add({"x": x, "y": [w["strategies"][name]["attainment"] for w in result["windows"]],
                 "name": plot_esc(name), "mode": "lines+markers", "line": {"color": series_color(i)}})
    target = result["slo"].get("target", 0.9)
    fig.hline(target, color=TARGET, label=f"target {target * 100:g}%")
    fig.x_axis(title={"text": "hour of the day"})
    fig.y_axis(title={"text": "SLO attainment"}, tickformat=".0%")
    d = fig.to_dict()
    d["layout"] |= base_layout("Attainment per window", height=420)
    return d


def _traffic(result: dict[str, Any]) -> dict[str, Any]:
    x = _hours(result)
    fig = Fig(2, 1, shared_x=True, titles=("offered rate (req/s)", "prefill:decode tokens"))
    fig.add({"x": x, "y": [w["traffic"]["rate_rps"] for w in result["windows"]], "name": "rate",
             "mode": "lines+markers", "line": {"color": series_color(0)}}, 1)
    fig.add({"x": x, "y": [w["traffic"]["prefill_decode_ratio"] for w in result["windows"]], "name": "prefill:decode",
             "mode": "lines+markers", "line": {"color": series_color(1)}}, 2)
    ratios = [w["traffic"]["prefill_decode_ratio"] for w in result["windows"]]
    fig.y_axis(2, **log_ticks([np.nan if r is None else r for r in ratios]))
    fig.x_axis(2, title={"text": "hour of the day"})
    d = fig.to_dict()
    d["layout"] |= {**base_layout("The day's traffic", height=480), "showlegend": False}
    return d


def _totals(result: dict[str, Any]) -> dict[str, Any]:
    names = list(result["strategies"])
    fig = Fig(1, 2, titles=("GPU-hours", "goodput per GPU (req/s)"))
    colors = [series_color(i) for i in range(len(names))]
    fig.add({"type": "bar", "x": [plot_esc(n) for n in names],
             "y": [result["strategies"][n]["gpu_hours"] for n in names], "marker": {"color": colors}}, 1)
    fig.add({"type": "bar", "x": [plot_esc(n) for n in names],
             "y": [result["strategies"][n]["goodput_per_gpu_rps"] for n in names], "marker": {"color": colors}}, 2)
    d = fig.to_dict()
    d["layout"] |= {**base_layout("Cost and goodput of each strategy", height=380), "showlegend": False}
    return d
