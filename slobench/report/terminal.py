"""The terminal summary (rich): one run, or a sweep's table with the headline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from slobench.analysis.sessions import sessions_text
from slobench.analysis.summary import Breakdown, Dist, RunSummary, as_run_summary
from slobench.printable import printable
from slobench.run.early_stop import bound_text


def make_console() -> Console:
    """A console wide enough for the sweep table even when output goes to a pipe or a CI log."""
    c = Console()
    return c if c.is_terminal else Console(width=160)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


OVERLOAD_MARK = " ▲"
OVERLOAD_NOTE = (f"{OVERLOAD_MARK.strip()} past capacity: completions fell clearly short of arrivals (second half of the "
                 "arrivals, by more than 2.6 sd of the counts) or the queue grew all run (TTFT p50 of the last "
                 "quarter of arrivals over twice the first's), so this attainment falls further the longer the run")
MIN_BEYOND = 100  # NOTES-statistics: a quantile wants >= 100 samples beyond it
THIN_MARK = "†"
THIN_NOTE = (f"{THIN_MARK} fewer than {MIN_BEYOND} requests beyond this quantile: indicative only "
             "(summary.json has its 95% interval, None where the sample cannot bound it)")


def _q(d: Dist, key: str) -> str:
    """A quantile in ms; a tail quantile (p90, p99) is marked when too few samples lie beyond it."""
    beyond = (d.beyond or {}).get(key)
    thin = key != "p50" and beyond is not None and beyond < MIN_BEYOND and d.get(key) is not None
    return _ms(d.get(key)) + (THIN_MARK if thin else "")


def _pct(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.1%}"


STOPPED_EARLY_NOTE = ("stopped early: more requests were known to miss the SLO than its target allows, so the "
                      "probe's fail was decided and it stopped (sending ended, requests in flight were cancelled); "
                      "its attainment is a bound, and its latencies describe the part that ran (--no-early-stop "
                      "measures every probe to its end)")


def attainment_text(s: RunSummary) -> str:
    """The attainment and its interval; for a run stopped early, what is known of it."""
    att = s.attainment
    if att is None:
        return "-"
    if s.stopped_early is not None:
        return bound_text(att.ci_high, float(s.stopped_early["at_s"]))
    return f"{_pct(att.value)} [{_pct(att.ci_low)}, {_pct(att.ci_high)}]"


def per_replica_text(rows: Sequence[Breakdown]) -> str:
    """One line per fleet: each replica's requests, TTFT p50 / p99 (the SLO's clock) and attainment."""
    return "per replica (TTFT p50/p99, attainment): " + _groups_text(rows, "#")


def per_tag_text(rows: Sequence[Breakdown]) -> str:
    """One line per run with request classes or phases: each tag's requests, TTFT p50 / p99 and attainment."""
    return "per class (TTFT p50/p99, attainment): " + _groups_text(rows, "")


def _groups_text(rows: Sequence[Breakdown], prefix: str) -> str:
    parts = []
    for r in rows:
        parts.append(f"{prefix}{printable(r.key)} {r.num_requests} req, TTFT {_ms(r.ttft_p50_s)}/{_ms(r.ttft_p99_s)} ms"
                     + ("" if r.attainment is None else f", {r.attainment:.0%}"))
    return "; ".join(parts)


def errors_text(counts: Mapping[str, int], examples: Mapping[str, str] | None) -> list[str]:
    """A line per error kind with its count and the first message of that kind, as the HTML report shows
    them: `server error mid-stream × 35: "Token id 29987 is out of vocabulary"`."""
    if not counts:
        return []
    examples = examples or {}
    return ["errors:"] + [f"  {printable(kind)} × {n}" + (f": \"{printable(examples[kind])}\"" if kind in examples else "")
                          for kind, n in counts.items()]


@dataclass(frozen=True, slots=True)
class SweepError:
    """One error kind across a sweep's rates: its count over them all, the lowest rate it was seen at and
    its first message there (`error_example`'s: redacted, control characters out, truncated)."""

    kind: str
    count: int
    first_rate_rps: float
    example: str | None


def sweep_errors(points: Sequence[tuple[float, RunSummary]]) -> list[SweepError]:
    """Each error kind of a sweep's points once, the most frequent first: `points` are (rate, summary)."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[float, str | None]] = {}
    for rate, s in sorted(points, key=lambda p: p[0]):
        examples = s.error_examples or {}
        for kind, n in s.error_counts.items():
            counts[kind] = counts.get(kind, 0) + n
            if kind not in first:
                first[kind] = (rate, examples.get(kind))
    return [SweepError(kind, n, *first[kind]) for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def sweep_errors_text(points: Sequence[tuple[float, RunSummary]]) -> list[str]:
    """A line per error kind of a sweep, as `errors_text` gives a run's, with the rate it was first seen at:
    `too long × 12 (first at 2 req/s): "This model's maximum context length is 4096 tokens. ..."`."""
    errors = sweep_errors(points)
    if not errors:
        return []
    return ["errors across the rates:"] + [
        f"  {e.kind} × {e.count} (first at {e.first_rate_rps:g} req/s)" + (f": \"{e.example}\"" if e.example else "")
        for e in errors
    ]


def print_sweep_errors(rows: Sequence[Mapping[str, Any]], console: Console) -> None:
    """`sweep_errors_text` of a sweep document's rows (`rate_rps`, `summary`), under its table."""
    for line in sweep_errors_text([(float(r["rate_rps"]), as_run_summary(r["summary"])) for r in rows]):
        console.print(Text(line, style="yellow"))  # a server's words: text, never rich markup


def gc_text(gc: Mapping[str, Any] | None) -> str | None:
    """A line when Python's GC paused the client during the load (it is held off otherwise; run/quiet_gc.py)."""
    if not gc or not gc.get("collections"):
        return None
    return (f"client: Python's cyclic GC collected {gc['collections']} time(s) during the load (the run made "
            f"{gc.get('collected', 0)} objects of cyclic garbage); longest pause {_ms(gc.get('pause_s_max'))} ms, "
            "added to the latency of every request in flight then")


def prefix_cache_text(c: Mapping[str, Any]) -> str:
    """One line: the server's prefix-cache hits and what they did to TTFT (the HTML report says the same)."""
    text = (f"prefix cache: {c['cached_token_share']:.0%} of prompt tokens served from cache; "
            f"{c['num_hits']} of {c['num_reported']} requests hit")
    hit, miss = c.get("ttft_p50_hit_s"), c.get("ttft_p50_miss_s")
    if hit is not None and miss is not None:
        text += f"; TTFT p50 {_ms(hit)} ms with a hit, {_ms(miss)} ms without"
    return text


def print_run(summary: RunSummary, console: Console | None = None, title: str = "run") -> None:
    console = console or make_console()
    t = Table(title=Text(printable(title)), show_header=True, header_style="bold")  # a title holds server/user text
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="right")
    thin = False
    rows: list[tuple[Dist | None, str]] = [
        (summary.ttft, "TTFT ms (from sent)"),
        (summary.ttft_from_scheduled, "TTFT ms (from scheduled)"),
        (summary.ttfa, "TTFA ms, first answer token (from sent)"),
        (summary.ttfa_from_scheduled, "TTFA ms, first answer token (from scheduled)"),
        (summary.tpot, "TPOT ms"),
        (summary.answer_tpot, "TPOT ms, answer alone"),
        (summary.itl, "ITL ms"),
        (summary.e2e, "E2E ms"),
    ]
    for d, label in rows:
        if d is None:  # (the answer's rows: only where some answer carried reasoning)
            continue
        cells = [_ms(d.mean), *(_q(d, c) for c in ("p50", "p90", "p99")), _ms(d.max)]
        thin = thin or any(THIN_MARK in c for c in cells)
        t.add_row(label, *cells)
    console.print(t)
    if thin:
        console.print(THIN_NOTE, highlight=False)
    lat = summary.client.lateness_s
    console.print(
        f"requests {summary.num_requests} (ok {summary.num_ok}, warm-up {summary.num_warmup})  "
        f"offered {summary.offered_rps:.2f} req/s  sent {summary.achieved_send_rps:.2f} req/s  "
        f"completed {summary.request_throughput_rps:.2f} req/s  "
        f"output {summary.output_token_throughput_tps:.0f} tok/s"
    )
    console.print(f"client lateness p50 {_ms(lat.get('p50'))} ms  p99 {_ms(lat.get('p99'))} ms")
    if line := reasoning_text(summary.reasoning):
        console.print(line, highlight=False, markup=False)
    if summary.attainment is not None:
        console.print(
            f"SLO {summary.slo or ''} attainment {attainment_text(summary)}  "
            f"good throughput {summary.attainment.good_throughput_rps:.2f} req/s"
        )
    if summary.stopped_early is not None:
        console.print(STOPPED_EARLY_NOTE, highlight=False, markup=False)
    for line in sessions_text(summary.sessions):
        console.print(line, highlight=False, markup=False)
    if f := summary.fleet:
        console.print(f"fleet: {f['replicas']} replicas behind {f['router']}; requests per replica "
                      f"{' / '.join(map(str, f['requests_per_replica']))}", highlight=False, markup=False)
    drift = summary.queue_drift
    if drift and drift.get("overloaded"):
        console.print(f"[yellow]past capacity: TTFT p50 went from {_ms(drift['ttft_p50_first_quarter_s'])} ms "
                      f"(first quarter of arrivals) to {_ms(drift['ttft_p50_last_quarter_s'])} ms (last quarter); "
                      "the queue grew all run, so a longer run would miss more[/yellow]", highlight=False)
    if summary.per_replica:
        console.print(per_replica_text(summary.per_replica), highlight=False, markup=False)
    if summary.per_tag:
        console.print(per_tag_text(summary.per_tag), highlight=False, markup=False)  # tags are user text
    if summary.prefix_cache:
        console.print(prefix_cache_text(summary.prefix_cache), highlight=False, markup=False)
    if waits := summary.deliberate_waits:
        console.print(f"deliberate waits (in-flight cap, --rate-limit): {waits['num']} requests held back, "
                      f"p50 {_ms(waits.get('p50'))} ms, max {_ms(waits.get('max'))} ms (not client lateness)",
                      highlight=False, markup=False)
    for line in lengths_text(summary.lengths):
        console.print(line, highlight=False, markup=False)
    for line in trace_rows_text(summary.trace_rows):  # file paths and row text: never markup
        console.print(line, highlight=False, markup=False)
    for run_note in summary.notes or ():  # what the run changed or lost on the way (requests shortened, actors lost)
        console.print(Text(f"note: {printable(run_note)}"))
    for line in errors_text(summary.error_counts, summary.error_examples):
        console.print(Text(line, style="yellow"))  # a server's words: text, never rich markup
    if summary.client.warning:
        console.print(Text(printable(summary.client.warning), style="bold red"))
    elif summary.client.note:
        console.print(Text(printable(summary.client.note)))
    if note := gc_text(summary.client.gc):
        console.print(Text(note, style="yellow"))
    if summary.interrupted:
        console.print("[yellow]interrupted: in-flight requests after the grace period were marked cancelled[/yellow]")


def reasoning_text(r: Mapping[str, Any] | None) -> str | None:
    """One line on the reasoning channel: its share of the output, how it was counted, and the requests that
    reasoned and never answered (completed, with no answer token: no TTFA)."""
    if not r:
        return None
    share = r.get("reasoning_share")
    counted = ", ".join(f"{n} by {'the server' if k == 'usage' else 'counting the stream'}"
                        for k, n in (r.get("counted_by") or {}).items())
    text = (f"reasoning: {r.get('num_reasoning', 0)} answers reasoned; reasoning "
            f"{'-' if share is None else format(share, '.0%')} of output tokens ({counted or 'uncounted'})")
    if r.get("num_no_answer"):
        text += f"; {r['num_no_answer']} completed with reasoning only, no answer token (no TTFA)"
    return text


def run_title(*parts: str) -> str:
    """A run's or sweep's table title: what answered, the workload, the API and the output directory, the
    parts given joined by " · " (an empty part is left out, never a dangling separator)."""
    return " · ".join(p for p in parts if p)


def sweep_table(rows: Sequence[dict[str, Any]], title: str = "sweep") -> Table:
    t = Table(title=Text(printable(title)), header_style="bold")
    for c in (
        "rate req/s", "sent req/s", "done req/s", "attainment [95% CI]", "goodput req/s",
        "TTFT p50/p90/p99 ms ¹", "TPOT p50/p90/p99 ms", "errors", "lateness p99 ms",
    ):
        t.add_column(c, justify="right")
    for r in rows:
        s = as_run_summary(r["summary"])
        ttft = s.ttft_on_clock()  # TTFT on the clock the SLO judges by
        late = s.client.lateness_s.get("p99")
        bottleneck = " (client!)" if s.client.is_bottleneck else ""
        t.add_row(
            f"{r['rate_rps']:g}" + (" (interrupted)" if r.get("interrupted") else ""),
            f"{s.achieved_send_rps:.2f}",
            f"{s.request_throughput_rps:.2f}",
            attainment_text(s) + (OVERLOAD_MARK if s.overloaded else ""),
            f"{s.attainment.good_throughput_rps if s.attainment else 0.0:.2f}",
            "/".join(_q(ttft, k) for k in ("p50", "p90", "p99")),
            "/".join(_q(s.tpot, k) for k in ("p50", "p90", "p99")),
            str(s.num_requests - s.num_ok),
            _ms(late) + bottleneck,
        )
    cells = [str(c) for col in t.columns for c in col.cells]
    # each legend only where its mark is in the table
    legend = ["¹ from the scheduled arrival (immune to coordinated omission) unless the SLO says clock=sent"]
    legend += [THIN_NOTE] if any(THIN_MARK in c for c in cells) else []
    legend += [OVERLOAD_NOTE] if any(c.endswith(OVERLOAD_MARK) for c in cells) else []
    legend += [STOPPED_EARLY_NOTE] if any("(stopped early" in c for c in cells) else []
    t.caption = "\n".join(legend)
    return t


def headline_text(h: dict[str, Any] | None) -> str:
    """The headline in one plain sentence (the HTML report prints the same words)."""
    if not h:
        return "no SLO given: no attainment headline"
    rate = h["max_rate_meeting_rps"]
    if h.get("past_capacity_meeting_rps"):
        return past_capacity_text(h, rate)
    if rate is None:
        return f"attainment is below {h['target']:.0%} at every rate tried"
    lo, hi = h["interval_rps"]
    lo_s = "below the lowest rate tried" if lo is None else f"{lo:.3g}"
    if h["is_lower_bound"]:
        # every rate met the target: the capacity is above the sweep, and only the low end is known
        low = "" if lo is not None and lo >= rate else f"; 95% interval from {lo_s} req/s"
        return (f"attainment stays >= {h['target']:.0%} up to {rate:.3g} req/s "
                f"(a lower bound: no rate tried missed){low}")
    hi_s = "above the highest rate tried" if hi is None else f"{hi:.3g}"
    text = f"attainment stays >= {h['target']:.0%} up to {rate:.3g} req/s; 95% interval {lo_s} to {hi_s} req/s"
    b_lo, b_hi = h.get("bracket_rps") or (None, None)
    if b_lo is not None and b_hi is not None and (lo, hi) == (b_lo, b_hi) and b_hi > 1.25 * b_lo:
        # the interval is two rates far apart, and the straight line drawn between them a guess
        undecided = h.get("undecided_rps") or []
        if undecided:
            at = " and ".join(f"{r:.3g}" for r in undecided[:3])
            text += (f" (the rates that surely meet and surely miss it; {at} req/s, between them, measured within "
                     "sampling noise of the target: more requests a rate, --num-requests, narrow it)")
        else:
            text += " (the measured rates around the crossing; sweep between them, e.g. --refine-knee 2, to narrow it)"
    return text


def past_capacity_text(h: dict[str, Any], rate: float | None) -> str:
    """The headline when a rate past capacity met the target: its run ended before the misses showed, so
    the crossing lies between the highest rate kept up with and that one."""
    past = h["past_capacity_meeting_rps"]
    one = len(past) == 1
    at = " and ".join(f"{r:.3g}" for r in past[:3])
    why = (f"{at} req/s{OVERLOAD_MARK} {'is' if one else 'are'} past capacity and met the target only because "
           f"{'its run' if one else 'their runs'} ended before the queue grew into misses")
    if rate is None:
        return f"no rate tried meets {h['target']:.0%} attainment and keeps up: {why}"
    return (f"attainment stays >= {h['target']:.0%} up to {rate:.3g} req/s; {why}, so the crossing lies between "
            f"{rate:.3g} and {past[0]:.3g} req/s")


def capacity_text(c: Mapping[str, Any]) -> str:
    """A capacity search's result in one sentence (capacity.json's fields, the words `slobench capacity`
    prints): the capacity with its interval, or that it is inconclusive and why, with no figure."""
    if c.get("inconclusive"):
        return f"capacity: inconclusive (no capacity located): {c['inconclusive']}"
    target = c.get("attainment_target")
    at = "" if target is None else f" at >= {target:.0%} attainment"
    rate = c.get("capacity_rps")
    if rate is None:
        return f"capacity: attainment is below {target:.0%} at every rate tried" if target is not None else \
            "capacity: no rate tried met the SLO"
    iv, n = c.get("interval_rps"), c.get("num_replicates") or 0
    level = c.get("level") or 0.95
    rng = f" [{iv[0]:.3g}, {iv[1]:.3g}] ({level:.0%}, {n} replicates)" if iv else ""
    return f"capacity: {rate:.3g} req/s{at}{rng}" + (" (a lower bound)" if c.get("is_lower_bound") else "")


def print_headline(h: dict[str, Any] | None, console: Console | None = None) -> None:
    console = console or make_console()
    style = "bold red" if h and h["max_rate_meeting_rps"] is None else "bold"
    console.print(f"[{style}]headline: {headline_text(h)}[/{style}]", highlight=False)


def trace_rows_text(rows: Mapping[str, Any] | None) -> list[str]:
    """Lines on what a replayed trace's rows became (summary.json `trace_rows`): how many were read, left
    out and altered, and the loader's notes on why."""
    if not rows:
        return []
    read = rows.get("num_rows_read")
    where = "the whole file" if rows.get("is_whole_file") else "up to the run's last request"
    head = f"trace {rows.get('path')}: {read if read is not None else '?'} rows read ({where}) -> {rows.get('num_requests')} requests"
    if "num_dropped" in rows:
        head += f"; {rows['num_dropped']} rows left out, {rows['num_altered']} requests altered"
    lines = [head]
    unreadable = (rows.get("dropped") or {}).get("unreadable")
    if unreadable:
        lines.append(f"  {unreadable} unreadable rows skipped: {'; '.join(rows.get('unreadable_first') or [])}")
    lines += [f"  {note}" for note in rows.get("notes") or []]
    return [printable(line) for line in lines]  # paths and row text from a file


def lengths_text(lengths: Mapping[str, Any] | None) -> list[str]:
    """Lines on asked vs delivered lengths, only where they differ (a server that stops early, a prompt that
    came out longer or shorter than asked, a usage count not believed)."""
    if not lengths:
        return []
    lines = []
    o = lengths["output"]
    if o["share_cut_short"] > 0:
        lines.append(f"output lengths: asked p50 {o['requested_p50']:g} / p99 {o['requested_p99']:g} tokens, "
                     f"produced p50 {o['produced_p50']:g} / p99 {o['produced_p99']:g}; "
                     f"{o['share_cut_short']:.0%} stopped short (TPOT uses the tokens produced)")
    p = lengths.get("prompt")
    if p and p["mismatch"]:
        lines.append(f"prompt lengths differ from those asked: the server counted {p['median_relative_difference']:+.0%} "
                     f"at the median (p50 {p['served_p50']:g} vs {p['requested_p50']:g} tokens); give --tokenizer "
                     "for exact text prompts")
    if lengths.get("usage_disagreements"):
        lines.append(f"usage disagreed with the stream on {lengths['usage_disagreements']} requests "
                     "(implausible counts were not used)")
    return lines
