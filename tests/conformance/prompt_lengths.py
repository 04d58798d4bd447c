"""How close a live server's prompt counts come to the lengths slobench asked, and whether outputs were cut by
its context: `slobench run` against a running server (vLLM, by .ci/vllm-capture.sh's recipe) with the chat
workload on the chat API, then the run's own summary read back. Not collected by pytest; run by hand:

    python tests/conformance/prompt_lengths.py URL OUT_DIR [NUM_REQUESTS]

Prints the median and the largest |server prompt tokens / asked - 1|, the share of outputs cut short, the
requests refused as too long, and the notes preflight and the bounding gave.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from slobench.cli import main


def check(url: str, out: Path, num_requests: int = 30, api: str = "chat") -> dict[str, object]:
    run_dir = out / api
    code = main(["run", "--url", url, "--workload", "chat", "--api", api, "--num-requests", str(num_requests),
                 "--rate", "2", "--out", str(run_dir), "--no-progress", "--scrape-interval", "0"])
    records = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    caps = json.loads((run_dir / "manifest.json").read_text())["target"]["capabilities"]
    served = [r for r in records if r.get("prompt_tokens")]
    errors = [r["prompt_tokens"] / r["input_tokens"] - 1 for r in served]
    return {
        "api": api, "exit": code, "requests": len(records), "ok": sum(r["status"] == "ok" for r in records),
        "median_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(map(abs, errors)) if errors else None,
        "share_cut_short": (summary.get("lengths") or {}).get("output", {}).get("share_cut_short"),
        "too_long": summary.get("error_counts", {}).get("too long", 0),
        "tokens_per_word": caps.get("tokens_per_word"), "template_overhead": caps.get("template_overhead"),
        "tokens_per_word_sd": caps.get("tokens_per_word_sd"), "max_model_len": caps.get("max_model_len"),
        "notes": caps.get("notes"),
    }


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    print(json.dumps(check(sys.argv[1], Path(sys.argv[2]), n), indent=1))
