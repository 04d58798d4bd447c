"""The README's "Headline results" and each backing page's headline table, made from the page's JSON.

Each headline page has its result beside it, `docs/measurements/<page>.json`, written by its benchmark
through `result_json.write_result` when it runs. This script makes from those files the "Headline" section
of each page and the README's table, so that no figure is copied by hand:

    python benchmarks/headlines.py --write     # after a benchmark wrote its JSON
    python benchmarks/headlines.py             # check: exit 1 naming what disagrees (tests/test_headlines.py)

`HEADLINES` says, per page, which figures the headline quotes, how each reads, and the README's sentence.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "docs" / "measurements"
README_BEGIN = ("<!-- headlines: made by `python benchmarks/headlines.py --write` from docs/measurements/*.json;"
                " edit the JSON, not this table -->")
README_END = "<!-- end of headlines -->"
PAGE_END = "<!-- end of headline -->"


def page_begin(page: str) -> str:
    return f"<!-- headline: made by `python benchmarks/headlines.py --write` from {page}.json; edit the JSON -->"


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    what: str
    fmt: str = "{:,}"


@dataclass(frozen=True, slots=True)
class Headline:
    page: str
    title: str
    figures: tuple[Figure, ...]
    readme: str  # the README's sentence, `{key}` standing for each figure as its `fmt` writes it

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(f.key for f in self.figures)


F = Figure
HEADLINES: tuple[Headline, ...] = (
    Headline("client_overhead", "Client overhead", (
        F("cpu_ms_800", "CPU a request at 800 req/s, ms (median of the rounds)", "{:.2f}"),
        F("cpu_ms_1200", "CPU a request at 1,200 req/s, ms", "{:.2f}"),
        F("x_floor_800", "× the minimal aiohttp client's CPU a request, at 800 req/s", "{:.2f}"),
        F("x_floor_1200", "× the minimal aiohttp client's CPU a request, at 1,200 req/s", "{:.2f}"),
        F("run5_cpu_s", "CPU of a whole 5-request `slobench run`, s (median of 5)", "{:.2f}"),
    ), "800 and 1,200 req/s of 16-token streams held from one core, at {x_floor_800}× and {x_floor_1200}× the CPU "
       "a request of a minimal aiohttp client ({cpu_ms_800} and {cpu_ms_1200} ms); a 5-request run costs "
       "{run5_cpu_s} s of CPU"),
    Headline("simulate_speed", "Simulator speed", (
        F("cpu_s_100k_min", "CPU s for 100,000 chat requests, fewest", "{:.1f}"),
        F("cpu_s_100k_max", "CPU s for 100,000 chat requests, most", "{:.1f}"),
    ), "100,000 chat requests simulated in {cpu_s_100k_min}–{cpu_s_100k_max} CPU s on one core"),
    Headline("scale_sim", "Simulation at scale", (
        F("wall_s_100k_min", "wall s, `run --simulate` of 100,000 chat requests, fastest", "{:.1f}"),
        F("wall_s_100k_max", "wall s, the same, slowest (load average under 4)", "{:.1f}"),
        F("rss_mib_100k_min", "peak RSS MiB at 100,000, least", "{:,.0f}"),
        F("rss_mib_100k_max", "peak RSS MiB at 100,000, most", "{:,.0f}"),
        F("wall_s_1m", "wall s, 1,000,000 requests", "{:,.0f}"),
        F("rss_mib_1m", "peak RSS MiB at 1,000,000", "{:,.0f}"),
    ), "100,000 chat requests simulated end to end through the CLI (records, Parquet, summary) in "
       "{wall_s_100k_min}–{wall_s_100k_max} s at {rss_mib_100k_min}–{rss_mib_100k_max} MiB; 1,000,000 in "
       "{wall_s_1m} s at {rss_mib_1m} MiB"),
    Headline("capacity_coverage", "Capacity search", (
        F("covered", "default searches whose 95% interval covered the variant's true capacity"),
        F("searches", "default searches"),
        F("coverage_pct", "coverage, %", "{:.1f}"),
        F("inconclusive", "searches inconclusive"),
        F("variants", "simulated engine variants"),
        F("truth_seeds", "seeds of each variant's dense sweep (the truth)"),
        F("median_width_pct", "median interval width, % of capacity", "{:.1f}"),
    ), "its 95% interval covered a {truth_seeds}-seed dense sweep's capacity in {covered} of {searches} default "
       "searches ({coverage_pct}%; the target is 93%) over {variants} simulated engine variants, {inconclusive} "
       "inconclusive"),
    Headline("gate_false_alarm", "Gate", (
        F("trials", "trials a candidate"),
        F("identical_passed", "identical candidate: trials passed"),
        F("step_slower_failed", "every step 15% slower: trials failed"),
        F("kv_fewer_failed", "30% fewer KV blocks: trials failed"),
    ), "identical candidate passed {identical_passed}/{trials}; a 15% slower step failed {step_slower_failed}/"
       "{trials}, 30% fewer KV blocks {kv_fewer_failed}/{trials}"),
    Headline("validate_sim", "Simulation against measurement", (
        F("comparisons", "comparisons a validation"),
        F("calibrated_min", "within target, simulation as calibrated, fewest of the validations"),
        F("calibrated_max", "the same, most"),
        F("self_min", "within target, the server against itself, fewest"),
        F("self_max", "the same, most"),
        F("told_speed_min", "within target, simulation told the machine's speed, fewest"),
        F("told_speed_max", "the same, most"),
    ), "{calibrated_min}–{calibrated_max} of {comparisons} comparisons within target as calibrated, where the "
       "server against itself made {self_min}–{self_max}; told the machine's speed, {told_speed_min}–"
       "{told_speed_max}"),
    Headline("plan_day", "Fleet planner", (
        F("planner_gpu_hours", "planner, GPU-hours a day (99.9% of the day)", "{:.0f}"),
        F("static_gpu_hours", "best static co-located fleet, GPU-hours", "{:.0f}"),
        F("gpu_hours_saved_pct", "GPU-hours saved, %", "{:.0f}"),
        F("planner_attainment_pct", "planner, the day's attainment, %", "{:.2f}"),
        F("static_attainment_pct", "static fleet, the day's attainment, %", "{:.2f}"),
    ), "a simulated day on H100s: {gpu_hours_saved_pct}% fewer GPU-hours than the best static fleet "
       "({planner_gpu_hours} against {static_gpu_hours}) at a day attainment of {planner_attainment_pct}% against "
       "{static_attainment_pct}%"),
    Headline("http_overhead", "HTTP overhead", (
        F("ttft_p50_ms_virtual", "TTFT p50 ms, virtual clock", "{:.2f}"),
        F("ttft_p50_ms_in_process", "TTFT p50 ms, in process, real time", "{:.2f}"),
        F("ttft_p50_ms_http", "TTFT p50 ms, HTTP + SSE over 127.0.0.1", "{:.2f}"),
        F("http_added_ttft_p50_ms", "HTTP + SSE over in process, ms", "{:.1f}"),
        F("virtual_vs_real_ttft_p50_ms", "|virtual clock − in process|, ms", "{:.1f}"),
    ), "HTTP + SSE add ~{http_added_ttft_p50_ms} ms to the median TTFT over the in-process engine; the virtual "
       "clock is within {virtual_vs_real_ttft_p50_ms} ms of real time"),
    Headline("trace_replay", "Trace replay", (
        F("rows", "trace rows"),
        F("stream_first_request_s", "streamed: first request after, s", "{:.1f}"),
        F("stream_rss_mib", "streamed: RSS while sending, MiB", "{:,.0f}"),
        F("whole_first_request_s", "loaded whole: first request after, s", "{:.0f}"),
        F("whole_rss_mib", "loaded whole: RSS while sending, MiB", "{:,.0f}"),
    ), "a {rows}-row trace: first request after {stream_first_request_s} s, {stream_rss_mib} MiB while sending "
       "(whole: {whole_first_request_s} s, {whole_rss_mib} MiB)"),
    Headline("soak", "Soak", (
        F("requests", "requests"),
        F("aborted", "aborted by the client"),
        F("harness_rss_growth_pct", "harness RSS growth after warm-up, %", "{:.1f}"),
    ), "{requests} requests, {aborted} aborted by the client: one record each, no KV block held, RSS "
       "+{harness_rss_growth_pct}%"),
    Headline("report_build", "Report build", (
        F("records", "records"),
        F("report_s_min", "`report` of the sweep, wall s, fastest run", "{:.1f}"),
        F("report_s_max", "the same, slowest", "{:.1f}"),
        F("report_peak_gb", "`report` peak RSS, GB", "{:.2f}"),
        F("html_mb", "the HTML file, MB", "{:.1f}"),
        F("summarize_s_min", "`summarize` of one run, wall s, fastest", "{:.1f}"),
        F("summarize_s_max", "the same, slowest", "{:.1f}"),
    ), "a sweep of {records} records built into a {html_mb} MB HTML report in {report_s_min}–{report_s_max} s "
       "at {report_peak_gb} GB peak, one run of {records} summarised in {summarize_s_min}–{summarize_s_max} s, "
       "read from `requests.parquet`"),
    Headline("probe_early_stop", "Early stop", (
        F("seeds", "seeds (one live capacity search each way per seed)"),
        F("wall_ratio", "live: wall time with early stop / without", "{:.2f}"),
        F("stopped", "live: probes stopped early"),
        F("probes", "live: probes of the early-stop searches"),
        F("replay_missed", "replayed: whole probes that missed"),
        F("replay_met", "replayed: whole probes that met"),
        F("replay_wrong", "replayed: a met probe stopped, or a missed one not"),
        F("replay_saved_pct", "replayed: probe time saved, %"),
        F("replay_decided_shift_pct", "replayed: capacity moved, % (mean absolute)", "{:.1f}"),
    ), "probes stop once their fail is certain: replayed over their own records, all {replay_missed} whole probes "
       "that missed stop and none of {replay_met} that met ({replay_wrong} exceptions), saving {replay_saved_pct}% "
       "of probe time with the capacity moved {replay_decided_shift_pct}%; live, a capacity search on the bundled "
       "engine took {wall_ratio}x the wall time over {seeds} seeds"),
    Headline("validate_published", "Published GPU runs", (
        F("distserve_within_3", "DistServe disaggregated runs, attainment within 3 points (fitted)"),
        F("distserve_runs", "DistServe disaggregated runs"),
        F("vllm_within_3", "vLLM runs, attainment within 3 points (fitted)"),
        F("vllm_runs", "vLLM runs"),
        F("distserve_calibrated_within_3", "DistServe runs within 3 points, host costs calibrated on the lower-rate half"),
        F("vllm_runs_differ", "vLLM runs that decode at another speed than the rest at the same batch (the "
          "runs checked against each other)"),
        F("vllm_calibrated_within_3", "vLLM runs within 3 points, calibrated on the lower-rate half of the runs "
          "that agree"),
        F("distserve_calibrated_every_target", "DistServe runs meeting every target (attainment, TTFT and TPOT "
          "p50/p90), calibrated on the lower-rate half"),
        F("vllm_calibrated_every_target", "vLLM runs meeting every target, calibrated on the lower-rate half of "
          "the runs that agree"),
    ), "DistServe's measured OPT-13B/A100 runs replayed: attainment within 3 points on {distserve_within_3} of "
       "{distserve_runs} disaggregated runs with DistServe's fitted step times and {distserve_calibrated_within_3} "
       "of {distserve_runs} with host costs calibrated from the lower-rate half of the runs "
       "({distserve_calibrated_every_target} meeting every latency target too); {vllm_within_3} of "
       "{vllm_runs} vLLM runs, {vllm_calibrated_within_3} calibrated on the runs that agree (the other "
       "{vllm_runs_differ} decode slower at the same batch, a server of their own: on the page)"),
    Headline("tune_guided", "Guided tuning", (
        F("seeds", "seeds (each an exhaustive live tune of 12 configurations)"),
        F("held", "seeds where the guided winner is the exhaustive one or inside its 95% interval"),
        F("exact", "seeds where it is the exhaustive winner itself"),
        F("wall_ratio_pct", "guided wall time, % of the exhaustive one (all seeds)", "{:.0f}"),
        F("real_guided_seeds", "seeds whose guided tune ran for real (the rest derived, see the page)"),
        F("real_guided_held", "of those, seeds where its winner held"),
    ), "`tune --simulate-first 3` over 12 live configurations of the bundled engine found the exhaustive "
       "winner, or one inside its 95% interval, in {held} of {seeds} seeds at {wall_ratio_pct}% of the wall time "
       "({real_guided_held} of {real_guided_seeds} guided tunes run for real held)"),
)


def headline_of(page: str) -> Headline:
    for h in HEADLINES:
        if h.page == page:
            return h
    raise KeyError(f"{page}: no README headline rests on this page; known: {', '.join(h.page for h in HEADLINES)}")


def load(page: str, root: Path = ROOT) -> dict[str, Any]:
    path = root / "docs" / "measurements" / f"{page}.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    missing = sorted(set(headline_of(page).needs) - set(doc.get("figures", {})))
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)}, which its headline quotes")
    return doc


def sentence(h: Headline, doc: dict[str, Any]) -> str:
    """The README's words for `doc`; a range whose ends read the same (one run's min and max) reads as one."""
    text = h.readme.format(**{f.key: f.fmt.format(doc["figures"][f.key]) for f in h.figures})
    return re.sub(r"(?<![\d.,])([\d.,]+)–\1(?![\d.,])", r"\1", text)


def page_section(h: Headline, doc: dict[str, Any]) -> str:
    said = f"Measured {doc['date']}, `{doc['command']}` ({doc['machine']})."
    lines = [page_begin(h.page), "## Headline", "", said + (f" {doc['note']}" if doc.get("note") else ""), "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {f.what} | {f.fmt.format(doc['figures'][f.key])} |" for f in h.figures]
    lines += ["", f"In the README: {sentence(h, doc)}.", PAGE_END]
    return "\n".join(lines)


def readme_table(docs: dict[str, dict[str, Any]]) -> str:
    rows = [f"| [{h.title}](docs/measurements/{h.page}.md) | {sentence(h, docs[h.page])} |" for h in HEADLINES]
    return "\n".join([README_BEGIN, "| what | result |", "|---|---|", *rows, README_END])


def between(text: str, begin: str, end: str) -> str | None:
    """The block from `begin` to `end`, both included; None when the text has none."""
    i = text.find(begin)
    j = text.find(end, i)
    return text[i:j + len(end)] if i >= 0 and j >= 0 else None


def put_page_section(text: str, section: str, page: str) -> str:
    old = between(text, page_begin(page), PAGE_END)
    if old is not None:
        return text.replace(old, section)
    at = text.find("\n## ")  # a page's first section: the headline goes above it
    if at < 0:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    return text[:at + 1] + section + "\n\n" + text[at + 1:]


def check(root: Path = ROOT) -> list[str]:
    """What disagrees: a JSON missing or short of a figure, a page or the README not made from its JSON."""
    problems: list[str] = []
    docs: dict[str, dict[str, Any]] = {}
    for h in HEADLINES:
        try:
            docs[h.page] = load(h.page, root)
        except (OSError, ValueError) as e:
            problems.append(str(e))
            continue
        page = (root / "docs" / "measurements" / f"{h.page}.md").read_text()
        if between(page, page_begin(h.page), PAGE_END) != page_section(h, docs[h.page]):
            problems.append(f"docs/measurements/{h.page}.md: its headline section is not the one {h.page}.json makes")
    if len(docs) == len(HEADLINES):
        readme = (root / "README.md").read_text()
        if between(readme, README_BEGIN, README_END) != readme_table(docs):
            problems.append("README.md: the headline table is not the one docs/measurements/*.json make")
    return problems


def write(root: Path = ROOT) -> None:
    docs = {h.page: load(h.page, root) for h in HEADLINES}
    for h in HEADLINES:
        path = root / "docs" / "measurements" / f"{h.page}.md"
        path.write_text(put_page_section(path.read_text(), page_section(h, docs[h.page]), h.page))
    readme = root / "README.md"
    text = readme.read_text()
    old = between(text, README_BEGIN, README_END)
    if old is None:
        raise SystemExit(f"README.md: no {README_BEGIN!r} ... {README_END!r} block to fill")
    readme.write_text(text.replace(old, readme_table(docs)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the pages' headline sections and the README table")
    args = p.parse_args()
    if args.write:
        write()
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
