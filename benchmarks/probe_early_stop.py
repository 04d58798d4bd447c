"""Do probes that stop early keep the capacity search's verdicts and intervals, and how much time do they save?

Against the bundled engine's HTTP server (a child process, modeled executor, the CI gate's profile and 60
KV blocks), one live `slobench capacity` search per seed with early stopping (the default) and one with
`--no-early-stop`, side by side in one run (which goes first alternates by seed, so a drift of the shared
machine falls on both). Printed: every probe's verdict each way (and whether it stopped), the capacity and
its interval each way, wall time and its ratio. Then, from the early-stop searches' own probes, the
capacity each seed would give with another attainment value for a stopped probe in the crossing's
interpolation (`crossing.cross_at`): its upper bound, the share met among the decided requests (the one
used) or its lower bound, each against the whole-probe search of the same seed.

`--replay DIR` needs no server and no machine time: every whole probe kept under DIR (the `<seed>-whole`
search directories of a run with `--keep DIR`) is replayed through the decider over its own records, as
the runner would have seen them every 0.1 s: each probe that missed must stop and each that met must not
(the rule is exact), and it prints when each would have stopped, the share of its traffic and drain that
saves, and the stopped value each rule gives against the probe's own whole attainment: a comparison free
of the live noise between two searches.

    python benchmarks/probe_early_stop.py [--seeds 10] [--duration 8] [--replicates 2] [--tolerance 0.1] [--json FILE]

Figures: docs/measurements/probe_early_stop.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from result_json import write_result  # this folder is on sys.path

from slobench.analysis.slo import SLO
from slobench.cli import main as slobench_main
from slobench.experiments.crossing import SeedCrossing, cross_at, seeds_interval
from slobench.run.early_stop import CHECK_EVERY_S, MissCounter
from slobench.run.records import RequestRecord
from slobench.run.rundir import load_run

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "baselines" / "ci-profile.json"
SLO_FLAG = "ttft=300ms,tpot=70ms"
TARGET = 0.9
RULES = ("at_most", "decided", "at_least")  # a stopped probe's attainment in the interpolation


def start_server() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_engine.server", "--executor", "modeled", "--profile", str(PROFILE),
         "--kv-blocks", "60", "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else ""
        if line.startswith("LISTENING"):
            return proc, int(line.split()[1])
        if not line:
            break
    proc.kill()
    raise SystemExit("the engine server did not start")


def search(port: int, out: Path, seed: int, args: argparse.Namespace, early: bool) -> tuple[dict[str, Any], float]:
    argv = ["capacity", "--url", f"http://127.0.0.1:{port}/v1", "--model", "tiny", "--workload", "tiny",
            "--input-len", "32", "--output-len", "16", "--duration", f"{args.duration:g}", "--start-rate", "4",
            "--replicates", str(args.replicates), "--tolerance", f"{args.tolerance:g}", "--slo", SLO_FLAG, "--seed", str(seed), "--out", str(out),
            "--no-progress", *([] if early else ["--no-early-stop"])]
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = slobench_main(argv)
    wall_s = time.monotonic() - t0
    if code not in (0, 1, 4):
        raise SystemExit(f"capacity exited {code}: {argv}")
    return json.loads((out / "capacity.json").read_text()), wall_s


def value_under(probe: dict[str, Any], rule: str) -> float:
    stopped = probe.get("stopped_early")
    if stopped is None or rule == "decided":
        return float(probe["attainment"])
    return float(stopped["attainment_at_most" if rule == "at_most" else "attainment_at_least"])


def capacity_under(doc: dict[str, Any], rule: str) -> float | None:
    """The search's capacity with a stopped probe's attainment taken by `rule` in each seed's crossing."""
    located = []
    for rep in doc["replicates"]:
        if rep["met"] is None or rep["missed"] is None:
            return None
        missed = next(p for p in doc["probes"] if p["seed"] == rep["seed"] and p["rate_rps"] == rep["missed"][0])
        met = (rep["met"][0], rep["met"][1])
        miss = (rep["missed"][0], value_under(missed, rule))
        located.append(SeedCrossing(rep["seed"], met, miss, cross_at(met, miss, TARGET), rep["probes"]))
    return seeds_interval(located, doc["level"])[0]


def verdicts(doc: dict[str, Any]) -> dict[tuple[float, int], str]:
    return {(p["rate_rps"], p["seed"]): ("met" if p["attainment"] >= TARGET else "missed")
            + (" (stopped)" if p.get("stopped_early") else "") for p in doc["probes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of traffic a probe")
    ap.add_argument("--replicates", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.1, help="the search's relative bracket width")
    ap.add_argument("--json", default=None, help="also write every figure here")
    ap.add_argument("--from-json", default=None,
                    help="summarise the searches a --json file holds (with --replay, their kept directories) and "
                         "write the result; measure nothing")
    ap.add_argument("--keep", default=None, help="keep every search's directory here")
    ap.add_argument("--note", default="", help="with --from-json: said beside the figures (how they were measured)")
    ap.add_argument("--replay", default=None, help="replay the whole probes kept under this directory; measure nothing")
    args = ap.parse_args()
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())["seeds"]
        for r in rows:
            print_seed(r)
        figures = summarise(rows, args) | (replay_all(Path(args.replay)) if args.replay else {})
        if len(rows) >= 10:
            write_result("probe_early_stop", figures, note=args.note)
        return 0
    if args.replay:
        replay_all(Path(args.replay))
        return 0
    proc, port = start_server()
    rows = []
    try:
        with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                got: dict[bool, tuple[dict[str, Any], float]] = {}
                for early in ((True, False) if seed % 2 == 0 else (False, True)):
                    got[early] = search(port, Path(tmp) / f"s{seed}-{'early' if early else 'whole'}", seed, args, early)
                (e_doc, e_s), (w_doc, w_s) = got[True], got[False]
                rows.append({"seed": seed, "early": e_doc, "whole": w_doc, "early_s": e_s, "whole_s": w_s})
                print_seed(rows[-1])
            proc.terminate()
            figures = summarise(rows, args) | replay_all(Path(tmp))
    finally:
        proc.terminate()
        proc.wait(10)
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "seeds": [
            {k: v for k, v in r.items()} for r in rows]}, indent=1))
    if args.seeds >= 10:
        write_result("probe_early_stop", figures)
    return 0


def _cap(doc: dict[str, Any]) -> str:
    iv = doc.get("interval_rps")
    if doc.get("capacity_rps") is None:
        return f"none ({doc.get('inconclusive') or 'no rate met'})"
    return f"{doc['capacity_rps']:.2f} [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else f"{doc['capacity_rps']:.2f}"


def print_seed(r: dict[str, Any]) -> None:
    e, w = verdicts(r["early"]), verdicts(r["whole"])
    print(f"seed {r['seed']}: early stop {r['early_s']:.0f} s, capacity {_cap(r['early'])}; "
          f"whole probes {r['whole_s']:.0f} s, capacity {_cap(r['whole'])}")
    for key in sorted(set(e) | set(w)):
        print(f"  {key[0]:7.3f} req/s seed {key[1]}: early {e.get(key, '-'):17s} whole {w.get(key, '-')}")
    sys.stdout.flush()


def summarise(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    both = [r for r in rows if r["early"].get("capacity_rps") is not None and r["whole"].get("capacity_rps") is not None]
    same_rate = [(r, k) for r in rows for k in set(verdicts(r["early"])) & set(verdicts(r["whole"]))]
    agree = sum(1 for r, k in same_rate
                if verdicts(r["early"])[k].split()[0] == verdicts(r["whole"])[k].split()[0])
    stopped = sum(1 for r in rows for p in r["early"]["probes"] if p.get("stopped_early"))
    probes = sum(len(r["early"]["probes"]) for r in rows)
    e_s, w_s = sum(r["early_s"] for r in rows), sum(r["whole_s"] for r in rows)
    rel = [(r["early"]["capacity_rps"] - r["whole"]["capacity_rps"]) / r["whole"]["capacity_rps"] for r in both]
    inside = sum(1 for r in both if r["early"]["interval_rps"] and r["whole"]["interval_rps"]
                 and r["whole"]["interval_rps"][0] <= r["early"]["capacity_rps"] <= r["whole"]["interval_rps"][1])
    print(f"\n{len(rows)} seeds, {args.duration:g} s probes, {args.replicates} replicates, tolerance {args.tolerance:g}")
    print(f"wall: early stop {e_s:.0f} s, whole probes {w_s:.0f} s, ratio {e_s / w_s:.2f}")
    print(f"probes stopped early: {stopped} of {probes}")
    print(f"verdicts at a rate and seed both searches probed: {agree} of {len(same_rate)} agree")
    print(f"capacity found both ways: {len(both)} seeds; early-stop capacity inside the whole search's interval: "
          f"{inside}; mean relative difference {statistics.mean(rel) * 100 if rel else float('nan'):+.1f}%")
    # a stopped probe's attainment by each rule against the whole probe's at the same rate and seed
    pairs = [(p, w) for r in rows for p in r["early"]["probes"] if p.get("stopped_early")
             for w in r["whole"]["probes"] if (w["rate_rps"], w["seed"]) == (p["rate_rps"], p["seed"])]
    for rule in RULES:
        errs = [value_under(p, rule) - w["attainment"] for p, w in pairs]
        if errs:
            print(f"a stopped probe's attainment as {rule:8s} minus the whole probe's at the same rate and seed: "
                  f"{statistics.mean(errs) * 100:+.1f} points mean, {statistics.mean(map(abs, errs)) * 100:.1f} "
                  f"mean absolute, over {len(errs)} probes")
    by_rule = {}
    for rule in RULES:
        diffs = [(c - r["whole"]["capacity_rps"]) / r["whole"]["capacity_rps"] for r in both
                 if (c := capacity_under(r["early"], rule)) is not None]
        by_rule[rule] = (statistics.mean(diffs) * 100, statistics.mean(abs(d) for d in diffs) * 100) if diffs else None
        if diffs:
            print(f"a stopped probe's attainment as {rule:8s}: capacity vs whole probes {by_rule[rule][0]:+.1f}% "
                  f"mean, {by_rule[rule][1]:.1f}% mean absolute")
    return {"seeds": len(rows), "wall_ratio": round(e_s / w_s, 2), "early_s": round(e_s), "whole_s": round(w_s),
            "stopped": stopped, "probes": probes, "verdicts_agree": agree, "verdicts_compared": len(same_rate),
            "both_found": len(both), "inside_whole_interval": inside,
            "mean_rel_diff_pct": round(statistics.mean(rel) * 100, 1) if rel else None,
            **{f"{rule}_mean_abs_diff_pct": round(v[1], 1) for rule, v in by_rule.items() if v is not None}}


def replay(run_dir: Path, slo: SLO, every_s: float = CHECK_EVERY_S) -> tuple[float | None, float, dict[str, float]]:
    """When the decider would have stopped this whole probe (None: never), its last completion, and the
    attainment each rule would have given it stopped (none when never)."""
    run = load_run(run_dir)
    records = [r for r in run.records if not r.is_warmup]
    n = int(run.summary.num_scheduled or len(records))
    end_s = max((r.done_s or r.scheduled_s) for r in records)
    finished: set[int] = set()
    counter = MissCounter(slo, n, in_flight_rules=True)
    t = every_s
    while t <= end_s + every_s:
        done = [r for r in records if r.done_s is not None and r.done_s <= t and r.request_id not in finished]
        finished.update(r.request_id for r in done)
        counter.add_finished(done)
        in_flight = [as_seen(r, t) for r in records if r.request_id not in finished and r.scheduled_s <= t]
        stop = counter.check(in_flight, t)
        if stop is not None:
            return t, end_s, {"at_most": stop.attainment_at_most, "decided": stop.decided_share,
                              "at_least": stop.attainment_at_least}
        t += every_s
    return None, end_s, {}


def replayed_capacity(doc: dict[str, Any], stopped: dict[tuple[float, int], dict[str, float]],
                      rule: str) -> tuple[float, tuple[float, float]]:
    """A whole search's capacity and interval had its probes stopped: each seed's missed edge valued by
    `rule` where the replay stopped it ("midpoint": the bracket's middle as the crossing)."""
    located = []
    for rep in doc["replicates"]:
        met, missed = (rep["met"][0], rep["met"][1]), (rep["missed"][0], rep["missed"][1])
        values = stopped.get((missed[0], rep["seed"]))
        if values is not None and rule == "midpoint":
            crossing = (met[0] + missed[0]) / 2
        else:
            if values is not None:
                missed = (missed[0], values[rule])
            crossing = cross_at(met, missed, TARGET)
        located.append(SeedCrossing(rep["seed"], met, missed, crossing, rep["probes"]))
    return seeds_interval(located, doc["level"])


def as_seen(r: RequestRecord, t: float) -> RequestRecord:
    """A record as a live runner saw it at run time t: what came after t not yet stamped."""
    return replace(r, sent_s=r.sent_s if r.sent_s is not None and r.sent_s <= t else None, done_s=None,
                   first_token_s=r.first_token_s if r.first_token_s is not None and r.first_token_s <= t else None,
                   status="ok", error=None)


def replay_all(root: Path) -> dict[str, Any]:
    rows = []
    edges = []  # each seed's missed edge: the probe whose value the crossing is interpolated from
    shifts: dict[str, list[tuple[float, float, float]]] = {rule: [] for rule in (*RULES, "midpoint")}
    for cap in sorted(root.glob("*-whole/capacity.json")):
        doc = json.loads(cap.read_text())
        slo = SLO.from_dict(doc["slo"])
        missed_edges = {(r["missed"][0], r["seed"]) for r in doc["replicates"] if r["missed"]}
        stopped_values = {}
        for p in doc["probes"]:
            at_s, end_s, value = replay(cap.parent / p["run_dir"], slo)
            rows.append((p["attainment"] >= slo.target, at_s, end_s, value, p["attainment"]))
            if at_s is not None:
                stopped_values[(p["rate_rps"], p["seed"])] = value
            if (p["rate_rps"], p["seed"]) in missed_edges and at_s is not None:
                edges.append((value, p["attainment"], rows[-1]))
        if doc.get("capacity_rps") is None or not doc.get("interval_rps"):
            continue
        for rule, out in shifts.items():  # the same probes and verdicts: only the stopped edges' values change
            est, (lo, hi) = replayed_capacity(doc, stopped_values, rule)
            cap_rps, (w_lo, w_hi) = doc["capacity_rps"], doc["interval_rps"]
            out.append(((est - cap_rps) / cap_rps, (lo - w_lo) / cap_rps, (hi - w_hi) / cap_rps))
    missed = [r for r in rows if not r[0]]
    wrong = sum(1 for r in rows if r[0] == (r[1] is not None))
    figures: dict[str, Any] = {"replay_probes": len(rows), "replay_missed": len(missed),
                               "replay_met": len(rows) - len(missed), "replay_wrong": wrong}
    print(f"{len(rows)} whole probes replayed: {len(missed)} missed, {wrong} where the replay disagrees "
          "(a met probe stopped, or a missed one not)")
    if missed:
        saved = [1 - r[1] / r[2] for r in missed if r[1] is not None]
        figures["replay_saved_pct"] = round(100 * sum(r[2] - r[1] for r in missed if r[1]) / sum(r[2] for r in rows))
        print(f"a missed probe would have stopped after {statistics.median(r[1] / r[2] for r in missed if r[1]):.0%} "
              f"of its traffic and drain (median), saving {sum(r[2] - r[1] for r in missed if r[1]):.0f} s of "
              f"{sum(r[2] for r in rows):.0f} s of probe time; per missed probe saved {statistics.mean(saved):.0%}")
        for rule, out in shifts.items():
            if out:
                print(f"capacity with a stopped edge's value as {rule:8s}, against the same search measured whole "
                      f"({len(out)} searches): estimate {statistics.mean(abs(o[0]) for o in out) * 100:.1f}% mean "
                      f"absolute ({statistics.mean(o[0] for o in out) * 100:+.1f}% mean), interval ends "
                      f"{statistics.mean(abs(o[1]) + abs(o[2]) for o in out) / 2 * 100:.1f}% mean absolute")
                figures[f"replay_{rule}_shift_pct"] = round(statistics.mean(abs(o[0]) for o in out) * 100, 1)
                figures["replay_searches"] = len(out)
        for rule in RULES:
            for what, group in (("every missed probe", [(r[3], r[4]) for r in missed if r[1] is not None]),
                                ("the seeds' missed edges", [(v, a) for v, a, _ in edges])):
                errs = [v[rule] - a for v, a in group]
                print(f"{rule:8s} minus the whole probe's attainment, {what} ({len(errs)}): "
                      f"{statistics.mean(errs) * 100:+.1f} points mean, {statistics.mean(map(abs, errs)) * 100:.1f} "
                      "mean absolute")
    return figures


if __name__ == "__main__":
    sys.exit(main())
