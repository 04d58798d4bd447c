"""The client-health section's per-actor table, for runs sent from Ray load actors (`--ray`).

Each such run directory says how every actor did: summary.json's `client.ray` (records, send lateness,
CPU, clock offset, its uncertainty and drift, whether it died) and manifest.json's `clock_sync` (the
clocks alone, kept even if the summary is lost). The run is flagged when the worst clock uncertainty
exceeds `CLOCK_LIMIT_OF_TTFT` of the TTFT SLO the report judges by (which may be a `--slo` given to the
report rather than the run's); with no TTFT SLO, the run's own verdict stands.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from slobench.analysis.slo import SLO
from slobench.report.load import RunData
from slobench.run.clocksync import CLOCK_LIMIT_OF_TTFT


@dataclass(frozen=True, slots=True)
class ActorRow:
    index: int
    host: str
    num_records: int | None
    lateness_p50_s: float | None
    lateness_p99_s: float | None
    loop_cpu_s: float | None  # its event loop's thread: the load itself
    cpu_s: float | None  # its whole process, Ray's threads included
    offset_s: float | None  # its clock minus the driver's (the latest estimate)
    uncertainty_s: float | None
    drift_ppm: float | None
    died: str | None


@dataclass(frozen=True, slots=True)
class RayHealth:
    actors: tuple[ActorRow, ...]
    uncertainty_s: float | None  # the worst actor's
    limit_s: float | None  # CLOCK_LIMIT_OF_TTFT of the TTFT SLO; None without one
    is_flagged: bool


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _row(x: dict[str, Any]) -> ActorRow:
    clock = _dict(x.get("clock"))
    latest = _dict(clock.get("end")) or _dict(clock.get("start"))
    late = _dict(x.get("lateness_s"))
    records = x.get("num_records")
    died = x.get("died")
    return ActorRow(
        index=int(_num(x.get("index")) or 0),
        host=str(x.get("hostname") or x.get("node_id") or "?"),
        num_records=records if isinstance(records, int) and not isinstance(records, bool) else None,
        lateness_p50_s=_num(late.get("p50")),
        lateness_p99_s=_num(late.get("p99")),
        loop_cpu_s=_num(x.get("loop_cpu_s")),
        cpu_s=_num(x.get("cpu_s")),
        offset_s=_num(latest.get("offset_s")),
        uncertainty_s=_num(clock.get("uncertainty_s")),
        drift_ppm=_num(clock.get("drift_ppm")),
        died=str(died) if died else None,
    )


def _summary_ray(run: RunData) -> dict[str, Any]:
    return _dict(run.saved.client.ray) if run.saved is not None else {}


def ray_health(run: RunData, slo: SLO | None) -> RayHealth | None:
    """The run's per-actor health, or None when it was not sent from Ray load actors."""
    ray = _summary_ray(run)
    actors = ray.get("actors")
    if not isinstance(actors, list) or not actors:  # no summary: the manifest's clocks alone
        actors = _dict(run.manifest.get("clock_sync")).get("actors")
    if not isinstance(actors, list) or not actors:
        return None
    rows = tuple(sorted((_row(x) for x in actors if isinstance(x, dict)), key=lambda r: r.index))
    known = [r.uncertainty_s for r in rows if r.uncertainty_s is not None]
    worst = max(known) if known else None
    ttft_s = slo.ttft_s if slo is not None else None
    if ttft_s:
        limit: float | None = CLOCK_LIMIT_OF_TTFT * ttft_s
        flagged = worst is not None and limit is not None and worst > limit
    else:  # the report has no TTFT SLO: the run's own verdict (against the SLO it ran with)
        limit = _num(ray.get("clock_uncertainty_limit_s"))
        flagged = ray.get("is_clock_flagged") is True
    return RayHealth(rows, worst, limit, flagged)


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.2f}"


def _s(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def flag_text(h: RayHealth) -> str:
    assert h.uncertainty_s is not None and h.limit_s is not None, "only a run with both is flagged"
    return (f"CLIENT CLOCKS UNCERTAIN: the load actors' clocks are known to ±{h.uncertainty_s * 1e3:.2f} ms, more "
            f"than {CLOCK_LIMIT_OF_TTFT:.0%} of the TTFT SLO ({h.limit_s * 1e3:.2f} ms); send times and the order "
            "of different actors' requests are that uncertain")


def actor_table(label: str, h: RayHealth) -> str:
    """One run's actors as an HTML table (every string escaped), its clock flag above it."""
    esc = html.escape
    died = sum(1 for r in h.actors if r.died)
    caption = (f"{label}: {len(h.actors)} Ray load actors ({died} died); clock uncertainty ±{_ms(h.uncertainty_s)} ms"
               + (f", limit {_ms(h.limit_s)} ms ({CLOCK_LIMIT_OF_TTFT:.0%} of the TTFT SLO)" if h.limit_s else ""))
    flag = f'<p class="warning clock-flag"><strong>{esc(label)}:</strong> {esc(flag_text(h))}</p>' if h.is_flagged else ""
    head = ("<tr><th>actor</th><th>host</th><th>records</th><th>lateness p50 ms</th><th>lateness p99 ms</th>"
            "<th>CPU s (event loop / process)</th><th>clock offset s</th><th>± ms</th><th>drift ppm</th>"
            "<th>status</th></tr>")
    rows = []
    for r in h.actors:
        over = h.limit_s is not None and r.uncertainty_s is not None and r.uncertainty_s > h.limit_s
        cls = ' class="miss"' if r.died or over else ""
        rows.append(
            f"<tr{cls}><td>{r.index}</td><td>{esc(r.host)}</td><td>{_s(r.num_records, 'd')}</td>"
            f"<td>{_ms(r.lateness_p50_s)}</td><td>{_ms(r.lateness_p99_s)}</td>"
            f"<td>{_s(r.loop_cpu_s)} / {_s(r.cpu_s)}</td><td>{_s(r.offset_s, '+.6f')}</td>"
            f"<td>{_ms(r.uncertainty_s)}</td><td>{_s(r.drift_ppm, '+.1f')}</td>"
            f"<td>{esc('died: ' + r.died) if r.died else 'ok'}</td></tr>"
        )
    return (f'{flag}<table class="data ray-actors"><caption>{esc(caption)}</caption><thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def ray_section(runs: list[tuple[str, RunData, SLO | None]]) -> tuple[str, bool]:
    """The tables of every run sent from Ray load actors, and whether any run's clocks are flagged."""
    parts = []
    flagged = False
    for label, run, slo in runs:
        h = ray_health(run, slo)
        if h is not None:
            parts.append(actor_table(label, h))
            flagged |= h.is_flagged
    return "".join(parts), flagged
