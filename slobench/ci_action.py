"""What the GitHub Action (action.yml) runs: `python -m slobench.ci_action`, configured by INPUT_* variables.

Start the server (optional), measure it (`slobench capacity`, a search or replicates at fixed rates), gate
it against the committed baseline, and leave for the workflow: JUnit, Markdown, an HTML report, a pull
request comment body (under GitHub's 65,536-character limit), the step summary, outputs in $GITHUB_OUTPUT,
and optionally a history line and page and a baseline refreshed on a pass. It needs no `act` and no GitHub:
tests run it against the bundled engine with GITHUB_OUTPUT and GITHUB_STEP_SUMMARY pointing at temp files.

A capacity search that locates no capacity (`slobench capacity` exits 4: the replicates put it outside the
rates probed, or its interval reaches 0) is a verdict, "inconclusive" with the reason, not an error: the
reports say why, and no baseline or history line is written from it.

Exit: 0 pass (or no baseline yet, or inconclusive unless INPUT_FAIL_ON_INCONCLUSIVE), 1 regression, 2 bad
input, 3 the server did not come up, 4 inconclusive with INPUT_FAIL_ON_INCONCLUSIVE=true; another code of
`slobench capacity` (a crash, an interrupted run) is the verdict "error" with that code.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slobench.analysis.slo import t_interval
from slobench.cli import main as slobench_main
from slobench.cli.gate import check_updatable, update_baseline_on_pass
from slobench.errors import SlobenchError, TargetUnreachable, UsageError
from slobench.gate import EXIT_INCONCLUSIVE, Threshold, gate, junit_xml, load_samples, markdown
from slobench.history import append_entry, entry_from_results
from slobench.history.page import build_history_page
from slobench.input_file import JSON_DOC, check_input
from slobench.load_options import LoadOptions
from slobench.report import build_report
from slobench.run.rundir import read_capacity, write_json_atomic
from slobench.targets.transport import ControlClient, TransportError, endpoint_url

COMMENT_LIMIT = 65_536  # GitHub's maximum issue/PR comment body, in characters
COMMENT_MARKER = "<!-- slobench-gate -->"  # lets a workflow find and edit its previous comment
_ICON = {"pass": "✅ pass", "regression": "❌ regression", "inconclusive": "⚠️ inconclusive",
         "no-baseline": "🆕 no baseline yet"}


@dataclass(frozen=True, slots=True)
class Inputs:
    url: str
    start_command: str
    startup_timeout_s: float
    model: str
    workload: str
    slo: str
    rates: str
    replicates: int
    capacity_args: list[str]
    load: Mapping[str, Any]  # the load options the inputs give, by flag name (LoadOptions.make checked them)
    baseline: str
    max_drop: list[str]
    max_rise: list[str]
    fail_on_inconclusive: bool
    update_baseline: bool
    history: str
    out_dir: Path
    artifact_url: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Inputs:
        def get(name: str, default: str = "") -> str:
            return env.get(f"INPUT_{name.upper().replace('-', '_')}", default).strip() or default

        def flag(name: str) -> bool:
            v = get(name, "false").lower()
            if v not in ("true", "false"):
                raise UsageError(f"input {name}: expected true or false (got {v!r})")
            return v == "true"

        try:
            replicates = int(get("replicates", "5"))
            timeout = float(get("startup-timeout", "600"))
        except ValueError as e:
            raise UsageError(f"inputs replicates/startup-timeout: not a number ({e})") from None
        if not get("slo"):
            raise UsageError("input slo is required (e.g. ttft=500ms,tpot=50ms)")
        # the inputs that are load options meet the CLI's own checks here, before a server starts
        load = {"url": get("url", "http://127.0.0.1:8000/v1"), "model": get("model") or None,
                "workload": get("workload", "chat"), "slo": get("slo"), "rates": get("rates") or None}
        LoadOptions.make("capacity", **load)
        run_url = ""
        if env.get("GITHUB_SERVER_URL") and env.get("GITHUB_REPOSITORY") and env.get("GITHUB_RUN_ID"):
            run_url = f"{env['GITHUB_SERVER_URL']}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        return cls(
            load=load, url=get("url", "http://127.0.0.1:8000/v1"), start_command=get("start-command"),
            startup_timeout_s=timeout, model=get("model"), workload=get("workload", "chat"), slo=get("slo"),
            rates=get("rates"), replicates=replicates, capacity_args=shlex.split(get("capacity-args")),
            baseline=get("baseline"), max_drop=_words(get("max-drop")), max_rise=_words(get("max-rise")),
            fail_on_inconclusive=flag("fail-on-inconclusive"), update_baseline=flag("update-baseline"),
            history=get("history"), out_dir=Path(get("out-dir", "slobench-ci")),
            artifact_url=get("artifact-url", run_url),
        )


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[\s,]+", text) if w]


# --- the server ---------------------------------------------------------------------------------------------


def _answers_200(url: str) -> bool:
    """One GET through the transport seam's control client; no answer at all is False, like a 503."""
    async def status() -> int:
        async with ControlClient(timeout_s=2.0) as client:
            return (await client.get(url)).status

    try:
        return asyncio.run(status()) == 200
    except TransportError:
        return False


class Server:
    """The start command in its own process group (a shell's children die with it), logged to a file."""

    def __init__(self, command: str, log: Path) -> None:
        self.log = log
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(["bash", "-c", command], stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_ready(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        models = endpoint_url(url, "/models")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetUnreachable(f"the start command exited ({self.proc.returncode}) before {models} "
                                        f"answered; its log ends:\n{self.tail()}")
            if _answers_200(models):
                return
            time.sleep(0.5)  # polling a server that is loading a model, bounded by the deadline
        raise TargetUnreachable(f"{models} did not answer 200 within {timeout_s:g} s; the log ends:\n{self.tail()}")

    def tail(self, num_chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-num_chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


# --- the pull request comment ----------------------------------------------------------------------------


def _fmt(key: str, x: float) -> str:
    name = key.split("@", 1)[0]
    if name.startswith(("attainment",)):
        return f"{x:.1%}"
    if name in ("capacity", "throughput", "good_throughput"):
        return f"{x:.3g} req/s"
    return f"{x * 1e3:.3g} ms"


def _with_interval(key: str, values: Sequence[float]) -> str:
    if not values:
        return "–"
    mean = sum(values) / len(values)
    if len(values) < 2:
        return _fmt(key, mean)
    lo, hi = t_interval(list(values), 0.95)
    lo = max(lo, 0.0)  # every gated metric is a rate, a share or a time: none is negative
    if key.startswith("attainment"):
        hi = min(hi, 1.0)
    return f"{_fmt(key, mean)} [{_fmt(key, lo)}, {_fmt(key, hi)}]"


def comment_body(res: Any, base: Any, cand: Any, *, artifact_url: str = "", context: str = "",
                 limit: int = COMMENT_LIMIT, verdict: str | None = None) -> str:
    """Verdict (the gate's unless `verdict` is given), the metrics with 95% intervals, the notes and a link;
    rows that do not fit are left out (the worst first kept) and a note says how many. A metric one side
    could not measure (an inconclusive capacity) shows "–" on that side."""
    head = [COMMENT_MARKER, f"### slobench gate: {_ICON[verdict or res.verdict]}", ""]
    if context:
        head += [context, ""]
    head += ["| metric | threshold | baseline (95% CI) | candidate (95% CI) | change | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    order = {"regression": 0, "inconclusive": 1, "pass": 2}
    checks = sorted(res.checks, key=lambda c: order[c.verdict])
    rows = []
    for c in checks:
        rel = (c.candidate_mean - c.baseline_mean) / c.baseline_mean if c.baseline_mean else float("nan")
        p = "–" if c.p_value != c.p_value else f"{c.p_value:.2g}"
        change = "–" if rel != rel else f"{rel * 100:+.1f}%"
        rows.append(f"| `{c.key}` | {c.threshold} | {_with_interval(c.key, list(base.metrics.get(c.key, {}).values()))} "
                    f"| {_with_interval(c.key, list(cand.metrics.get(c.key, {}).values()))} | {change} | {p} "
                    f"| {_ICON[c.verdict]} |")
    notes = [f"- {c.message[:500]}" for c in checks if c.verdict != "pass"]
    foot = [""]
    if artifact_url:
        foot.append(f"Artifacts (JUnit, Markdown, HTML report): {artifact_url}")
    foot.append(f"<sub>baseline `{base.source[:200]}` · candidate `{cand.source[:200]}`</sub>")
    budget = limit - len("\n".join(head + foot)) - 400  # room for the truncation notes
    body_rows: list[str] = []
    for r in rows:
        if budget - len(r) - 1 < 0:
            break
        body_rows.append(r)
        budget -= len(r) + 1
    out = head + body_rows
    if len(body_rows) < len(rows):
        out.append(f"\n*{len(rows) - len(body_rows)} more rows left out to fit a comment; every row is in "
                   f"the Markdown and JUnit files.*")
    kept_notes = []
    for n in notes:
        if budget - len(n) - 1 < 0:
            break
        kept_notes.append(n)
        budget -= len(n) + 1
    if kept_notes:
        out += [""] + kept_notes
    if len(kept_notes) < len(notes):
        out.append(f"- … {len(notes) - len(kept_notes)} more notes in the Markdown file")
    return "\n".join(out + foot) + "\n"


# --- the action ------------------------------------------------------------------------------------------------


def _capacity_argv(inp: Inputs, out: Path) -> list[str]:
    """`slobench capacity` from the inputs' load options (LoadOptions.as_argv) and the search's own flags."""
    return [*LoadOptions.as_argv("capacity", **inp.load, out=str(out), overwrite=True, no_progress=True),
            "--replicates", str(inp.replicates), *inp.capacity_args]


def run_action(env: Mapping[str, str]) -> int:
    inp = Inputs.from_env(env)
    out = inp.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if inp.baseline and os.path.lexists(inp.baseline):
        check_input(inp.baseline, JSON_DOC)  # a symlink to a device or a FIFO: exit 2 now, not after the search
        check_updatable([inp.baseline])
    ths = [Threshold.parse(t, "drop") for t in inp.max_drop] + [Threshold.parse(t, "rise") for t in inp.max_rise]
    outputs: dict[str, str] = {}
    server = Server(inp.start_command, out / "server.log") if inp.start_command else None
    try:
        if server is not None:
            outputs["server-log"] = str(server.log)
            server.wait_ready(inp.url, inp.startup_timeout_s)
        code = slobench_main(_capacity_argv(inp, out / "capacity"))
    finally:
        if server is not None:
            server.stop()
    result = out / "capacity"
    why = inconclusive_reason(result) if code == EXIT_INCONCLUSIVE else None
    if code not in (0, 1) and why is None:  # 1: a search where no rate met the SLO, still a result to gate
        _write_outputs(env, {**outputs, "verdict": "error", "exit-code": str(code)},
                       f"### slobench gate: error\n\n`slobench capacity` exited {code}; see the job's log.\n")
        return code
    outputs["result"] = str(result)
    outputs["html"] = str(build_report([result], out / "report.html"))
    cand = load_samples([result])
    said = f"⚠️ **The capacity search was inconclusive**: {why}" if why else ""
    if inp.baseline and os.path.lexists(inp.baseline):  # a symlink to a device is refused by name, never skipped
        base = load_samples([inp.baseline])
        res = gate(base, cand, ths)
        # a capacity not located makes the run inconclusive, whatever else passed; a regression stands
        verdict = "inconclusive" if why and res.verdict == "pass" else res.verdict
        md = markdown(res)
        if why:  # the verdict's heading, then the reason, then the gate's table
            md = f"### slobench gate: {_ICON[verdict]}\n\n{said}\n" + md.split("\n", 1)[1]
        (out / "gate.xml").write_text(junit_xml(res))
        write_json_atomic(out / "gate.json", res.to_dict())
        context = f"workload `{inp.workload}` · SLO `{inp.slo}` · {inp.replicates} replicates"
        comment = comment_body(res, base, cand, artifact_url=inp.artifact_url, verdict=verdict,
                               context=f"{said}\n\n{context}" if why else context)
        outputs["junit"] = str(out / "gate.xml")
    else:
        verdict = "inconclusive" if why else "no-baseline"
        gated = (f"No baseline at `{inp.baseline or '(none given)'}`: this run measured {len(cand.metrics)} "
                 "metrics and gated nothing.")
        md = f"### slobench gate: {_ICON[verdict]}\n\n" + (f"{said}\n\n" if why else "") + gated + "\n"
        comment = f"{COMMENT_MARKER}\n{md}" + (f"\nArtifacts: {inp.artifact_url}\n" if inp.artifact_url else "")
    (out / "gate.md").write_text(md)
    (out / "comment.md").write_text(comment)
    outputs |= {"verdict": verdict, "markdown": str(out / "gate.md"), "comment": str(out / "comment.md")}
    if why:
        outputs["inconclusive-reason"] = " ".join(why.split())
    if inp.update_baseline and inp.baseline:
        if why:
            print("baseline not updated: the capacity search was inconclusive")
            outputs["baseline-updated"] = "false"
        elif verdict == "no-baseline":
            Path(inp.baseline).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(inp.baseline), cand.to_baseline())
            print(f"baseline written: {inp.baseline} (there was none)")
            outputs["baseline-updated"] = "true"
        else:
            updated, msg = update_baseline_on_pass(res, cand, Path(inp.baseline))
            print(msg)
            outputs["baseline-updated"] = str(updated).lower()
    if inp.history and why:  # a search that located no capacity has no headline metric to draw
        print("history: nothing recorded: the capacity search was inconclusive")
    elif inp.history:
        entry = entry_from_results([result], commit=env.get("GITHUB_SHA") or "local",
                                   date=datetime.now(UTC).isoformat(timespec="seconds"),
                                   verdict={"regression": "fail", "no-baseline": None}.get(verdict, verdict))
        append_entry(inp.history, entry)
        page, _ = build_history_page(inp.history, out / "history.html")
        outputs["history-html"] = str(page)
    exit_code = {"pass": 0, "no-baseline": 0, "regression": 1,
                 "inconclusive": EXIT_INCONCLUSIVE if inp.fail_on_inconclusive else 0}[verdict]
    outputs["exit-code"] = str(exit_code)
    _write_outputs(env, outputs, comment)
    print(md, end="")
    return exit_code


def inconclusive_reason(result: Path) -> str | None:
    """Why `slobench capacity` located no capacity (capacity.json's `inconclusive`), or None when the result
    says no such thing (an exit 4 without it is an error, not a verdict)."""
    try:
        doc = read_capacity(result)
    except UsageError:  # no capacity.json, or a damaged one
        return None
    why = doc["inconclusive"] if "inconclusive" in doc else None
    return str(why) if why else None


def _write_outputs(env: Mapping[str, str], outputs: dict[str, str], summary: str) -> None:
    if path := env.get("GITHUB_OUTPUT"):
        with open(path, "a", encoding="utf-8") as fh:
            for k, v in outputs.items():
                if "\n" in v:
                    raise ValueError(f"output {k} holds a newline")  # paths and words only
                fh.write(f"{k}={v}\n")
    if path := env.get("GITHUB_STEP_SUMMARY"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(summary + "\n")


def main() -> int:
    try:
        return run_action(os.environ)
    except SlobenchError as e:
        print(f"slobench action: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
