"""Writes the golden outputs that tests/test_golden.py compares against: the terminal text of a simulated run,
sweep, capacity search and report, and the sha256 of every file they write.

Run it only when a change is meant to alter what slobench prints or writes, and say why in the commit:
    .venv/bin/python tests/golden/regen.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from slobench.run.columnar import PARQUET, read_parquet_records

HERE = Path(__file__).resolve().parent

# Each command runs on the simulator's virtual clock, so its every byte is a function of its arguments.
SIM = ["--simulate", "--profile", "h100-llama-1b", "--workload", "chat", "--seed", "3"]
COMMANDS: dict[str, list[str]] = {
    "run": ["run", *SIM, "--rate", "8", "--num-requests", "200", "--slo", "ttft=500ms,tpot=50ms",
            "--out", "run1"],
    "sweep": ["sweep", *SIM, "--rates", "2:32:4", "--num-requests", "150", "--slo", "ttft=300ms,tpot=30ms",
              "--out", "sweep1"],
    "capacity": ["capacity", *SIM, "--num-requests", "150", "--slo", "ttft=300ms,tpot=30ms", "--out", "cap1"],
    "report": ["report", "sweep1", "run1", "-o", "report.html"],
    "summarize": ["summarize", "run1"],
}


def produce(workdir: Path) -> dict[str, object]:
    """Runs every command in `workdir`; returns each one's exit code and output, and every file's digest."""
    env = {**os.environ, "COLUMNS": "110", "NO_COLOR": "1", "TERM": "dumb"}
    outputs: dict[str, object] = {}
    for name, argv in COMMANDS.items():
        done = subprocess.run([sys.executable, "-m", "slobench", *argv], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=300)
        outputs[name] = {"exit": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    digests = {str(p.relative_to(workdir)): digest(p) for p in sorted(workdir.rglob("*")) if p.is_file()}
    return {"outputs": outputs, "files": digests}


def digest(path: Path) -> str:
    """A file's sha256; requests.parquet's of the records it holds, written as requests.jsonl lines: its
    bytes name the pyarrow that wrote them (created_by), which an upgrade changes, and its summary is pinned
    beside it. The digest equals requests.jsonl's when the two hold the same records."""
    if path.name == PARQUET:
        return "rows:" + hashlib.sha256("".join(r.to_json() + "\n" for r in read_parquet_records(path.parent)).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        golden = produce(Path(tmp))
    (HERE / "golden.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {HERE / 'golden.json'}: {len(golden['files'])} files")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
