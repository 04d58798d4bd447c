"""The one writer of a benchmark's headline result: `docs/measurements/<page>.json`, beside the page it backs.

A benchmark whose page backs a row of the README's "Headline results" calls `write_result` with the
figures that row and the page's headline table quote (their names: `headlines.HEADLINES`). Then
`python benchmarks/headlines.py --write` makes the page's headline table and the README's row from the
JSON, and `tests/test_headlines.py` fails while README, page and JSON disagree.

    write_result("soak", {"requests": 20000, "aborted": 3950, ...})
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from headlines import MEASUREMENTS, headline_of  # this folder is on sys.path

__all__ = ["write_result"]


def machine() -> str:
    """The machine as a page's "Latest figures" heading describes it: cores and the load beside the run."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load} at the end"


def write_result(page: str, figures: Mapping[str, float | int], *, note: str = "", part: bool = False,
                 out_dir: Path = MEASUREMENTS) -> Path | None:
    """Write `<out_dir>/<page>.json` with today's date, the command that ran and the figures. A run that
    lacks a figure its headline quotes (a partial or smaller run: other flags) writes nothing and says so,
    so the committed headline is never replaced by half of one.

    `part=True` is for a benchmark whose headline takes several runs (one per setup): this run's figures
    replace theirs in the file and the others stay, with their command, and the note says which is which."""
    path = out_dir / f"{page}.json"
    command = "python " + shlex.join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    date = datetime.now(UTC).date().isoformat()
    if part and path.is_file():
        before = json.loads(path.read_text())
        kept = sorted(set(before["figures"]) - set(figures))
        if kept:
            note = (f"{note} " if note else "") + (f"{', '.join(sorted(figures))}: {date}, `{command}`; "
                                                   f"the rest: {before['date']}, `{before['command']}`.")
            figures = {**before["figures"], **figures}
    missing = sorted(set(headline_of(page).needs) - set(figures))
    if missing:
        print(f"{page}.json not written: this run has no {', '.join(missing)} (the headline quotes them)",
              file=sys.stderr)
        return None
    doc = {
        "page": page,
        "date": date,
        "command": command,
        "machine": machine(),
        "figures": {k: figures[k] for k in sorted(figures)},
    }
    if note:
        doc["note"] = note
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}; `python benchmarks/headlines.py --write` puts it on the page and in the README")
    return path
