"""Do probes that stop early keep the capacity search's verdicts and intervals, and how much time do they save?

Against the bundled engine's HTTP server (a child process, modeled executor, the CI gate's profile and 60
KV blocks), one live `slobench capacity` search per seed with early stopping (the default) and one with
`--no-early-stop`, side by side in one run (which goes first alternates by seed, so a drift of the shared
machine falls on both). Printed: every probe's verdict each way (and whether it stopped), the capacity and
its interval each way, wall time and its ratio. Then, from the early-stop searches' own probes, the
capacity each seed would give with another attainment value for a stopped probe in the crossing's
interpolation (`crossing.cross_at`): its upper bound, the share met among the decided requests (the one
used) or its lower bound, each against the whole-probe search of the same seed.

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
from pathlib import Path
from typing import Any

from result_json import write_result  # this folder is on sys.path

from slobench.cli import main as slobench_main
from slobench.experiments.crossing import SeedCrossing, cross_at, seeds_interval

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "baselines" / "ci-profile.json"
SLO = "ttft=300ms,tpot=70ms"
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
            "--replicates", str(args.replicates), "--tolerance", f"{args.tolerance:g}", "--slo", SLO, "--seed", str(seed), "--out", str(out),
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
    ap.add_argument("--from-json", default=None, help="summarise the searches a --json file holds; measure nothing")
    args = ap.parse_args()
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())["seeds"]
        for r in rows:
            print_seed(r)
        summarise(rows, args)
        return 0
    proc, port = start_server()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                got: dict[bool, tuple[dict[str, Any], float]] = {}
                for early in ((True, False) if seed % 2 == 0 else (False, True)):
                    got[early] = search(port, Path(tmp) / f"s{seed}-{'early' if early else 'whole'}", seed, args, early)
                (e_doc, e_s), (w_doc, w_s) = got[True], got[False]
                rows.append({"seed": seed, "early": e_doc, "whole": w_doc, "early_s": e_s, "whole_s": w_s})
                print_seed(rows[-1])
    finally:
        proc.terminate()
        proc.wait(10)
    figures = summarise(rows, args)
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


if __name__ == "__main__":
    sys.exit(main())
