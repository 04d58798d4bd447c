"""Text prompts sized for the server's own count of tokens a word, without --tokenizer.

A server that takes no token ids (or any chat server) gets slobench's prompt words, one token each in
common BPE vocabularies. A character- or byte-level vocabulary counts several a word: the bundled engine's
byte tokenizer about 5, llama.cpp's tiny conformance model 4.4, and a chat run asking 32-token prompts
sent ~160-token ones. Preflight now measures the ratio (two non-streamed requests) and sends n / ratio
words, and the manifest's capabilities say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.cli import main
from slobench.testing import TokenServerProcess
from slobench.testing.process import EngineServerProcess

pytestmark = pytest.mark.integration


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]


def test_a_byte_level_chat_server_sees_about_the_asked_prompt_length(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with EngineServerProcess("--executor", "modeled", "--kv-blocks", "1024") as srv:
        code = main(["run", "--url", srv.base_url, "--api", "chat", "--workload", "tiny", "--input-len", "200",
                     "--output-len", "4", "--rate", "20", "--num-requests", "8", "--out", str(out), "--no-progress",
                     "--scrape-interval", "0"])
    assert code == 0
    caps = json.loads((out / "manifest.json").read_text())["target"]["capabilities"]
    assert caps["tokens_per_word"] > 3, caps  # bytes a word plus its space
    assert any("tokens a word" in n for n in caps["notes"]), caps["notes"]
    counted = [r["prompt_tokens"] for r in _records(out)]
    # the chat template adds a few tokens; words differ in length: within 20% of 200, not ~1,000
    assert all(170 <= n <= 240 for n in counted), counted


def test_a_server_counting_a_token_a_word_gets_the_prompts_as_before(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with TokenServerProcess(ttft_ms=1, itl_ms=1, quirks=("text-prompts-only",)) as srv:
        code = main(["run", "--url", srv.base_url, "--model", srv.model, "--workload", "tiny", "--rate", "50",
                     "--num-requests", "10", "--out", str(out), "--no-progress", "--scrape-interval", "0"])
    assert code == 0
    caps = json.loads((out / "manifest.json").read_text())["target"]["capabilities"]
    assert caps["tokens_per_word"] == 1.0 and caps["token_prompts"] is False
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in _records(out))
