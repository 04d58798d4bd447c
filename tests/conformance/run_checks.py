"""What a conformance run must show in its run directory, with messages that quote what the server did."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_OK_SHARE = 0.95


@dataclass(frozen=True)
class Expect:
    num_requests: int
    usage_in_stream: bool  # the server reports usage in streams: it must be recorded and agree
    exact_output: bool  # the server cannot stop early (tiny_gguf's model, the engine with ignore_eos)
    serves_metrics: bool  # /metrics exists: server_metrics.jsonl must have samples


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def describe_errors(records: list[dict[str, Any]]) -> str:
    counts = Counter(f"{r['status']}: {(r.get('error') or '')[:160]}" for r in records if r["status"] != "ok")
    return "\n".join(f"  {n} x {text}" for text, n in counts.most_common(8)) or "  (none)"


def check_run_dir(run_dir: Path, expect: Expect) -> list[dict[str, Any]]:
    """Assert the issue's requirements on one run directory; return its records for further checks."""
    assert (run_dir / "manifest.json").is_file(), f"no manifest in {run_dir}"
    json.loads((run_dir / "manifest.json").read_text())  # valid JSON
    records = [r for r in read_records(run_dir) if not r.get("is_warmup")]
    assert len(records) == expect.num_requests, f"{len(records)} records, {expect.num_requests} requests sent"

    ok = [r for r in records if r["status"] == "ok"]
    share = len(ok) / len(records)
    assert share >= MIN_OK_SHARE, (
        f"{len(ok)}/{len(records)} requests ok ({share:.0%} < {MIN_OK_SHARE:.0%}); errors:\n{describe_errors(records)}"
    )
    for r in ok:
        assert r["output_tokens"] > 0, f"request {r['request_id']} ok with no output: {r}"
        usage = r.get("usage_output_tokens")  # the server's completion_tokens, where the client records it
        if expect.usage_in_stream:
            assert r["prompt_tokens"] is not None, f"request {r['request_id']}: the server's usage was not read"
            if "usage_output_tokens" in r:
                assert usage is not None, f"request {r['request_id']}: the server sent usage, none was recorded"
        if usage is not None:
            assert r["output_tokens"] == usage, (
                f"request {r['request_id']}: output_tokens {r['output_tokens']} != the server's usage {usage}"
            )
        if expect.exact_output:
            assert r["output_tokens"] == r["max_tokens"], (
                f"request {r['request_id']}: {r['output_tokens']} output tokens recorded, {r['max_tokens']} "
                f"generated (the server cannot stop early); chunks {r['chunk_tokens']}"
            )

    metrics = run_dir / "server_metrics.jsonl"
    samples = metrics.read_text().splitlines() if metrics.exists() else []
    if expect.serves_metrics:
        assert samples, f"the server serves /metrics but {metrics} holds no samples"
    else:
        assert not samples, f"the server serves no /metrics, yet {metrics} holds samples"
    return records
