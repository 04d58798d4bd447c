"""Text prompts for servers that refuse token ids: ids map to words by id, exact counts with --tokenizer,
and --rate-limit (issue 11)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.load_flags import parse_rate_limit
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import TargetBase
from slobench.workload.prompts import WORDS, token_prompts
from slobench.workload.text import ExactText, ids_to_text

tokenizers = pytest.importorskip("tokenizers")


def _word_tokenizer(path: Path) -> Path:
    """A word-level tokenizer over the prompt words (one token per word, as BPE is for common words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def _bpe_tokenizer(path: Path) -> Path:
    """A small byte-level BPE trained on little text: many words split into several tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS[:40])] * 5, trainer)
    tok.save(str(path))
    return path


def test_ids_map_to_words_by_id_so_shared_prefixes_stay_shared() -> None:
    rng = np.random.default_rng(0)
    prefix = tuple(range(1000, 1050))
    a, b = token_prompts([80, 90], rng, prefix=prefix)
    ta, tb = ids_to_text(a), ids_to_text(b)
    assert len(ta.split()) == 80 and len(tb.split()) == 90
    assert ta.split()[:50] == tb.split()[:50] and ta.split()[50:] != tb.split()[50:60]


@pytest.mark.parametrize("make", [_word_tokenizer, _bpe_tokenizer])
def test_exact_text_has_exactly_the_asked_token_count(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    exact = ExactText(make(tmp_path / "tokenizer.json"))
    rng = np.random.default_rng(1)
    for n in [1, 2, 7, 64, 513]:
        ids = token_prompts([n], rng)[0]
        text = exact.fit(ids_to_text(ids), n)
        assert exact.count(text) == n, (n, text[:80])
    # a folder holding tokenizer.json works too
    assert ExactText(tmp_path).count("the of and") >= 3


def test_exact_text_through_a_text_only_server(tmp_path: Path) -> None:
    from slobench.testing import TokenServerProcess

    tok = _word_tokenizer(tmp_path / "tokenizer.json")
    with TokenServerProcess(ttft_ms=1, itl_ms=1, quirks=("text-prompts-only",)) as srv:
        code = main(["run", "--url", srv.base_url, "--model", srv.model, "--workload", "tiny", "--rate", "50",
                     "--num-requests", "10", "--out", str(tmp_path / "r"), "--no-progress", "--scrape-interval", "0",
                     "--tokenizer", str(tok)])
    assert code == 0
    records = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    # the server counts words; the word tokenizer made each text exactly input_tokens long
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in records), [(r["prompt_tokens"], r["input_tokens"]) for r in records]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["lengths"]["prompt"]["mismatch"] is False


@pytest.mark.parametrize(("text", "want"), [("600/min", (600, 60.0)), ("10/s", (10, 1.0)), ("5/h", (5, 3600.0))])
def test_rate_limit_parses(text: str, want: tuple[int, float]) -> None:
    assert parse_rate_limit(text) == want


@pytest.mark.parametrize("bad", ["600", "0/min", "x/min", "10/fortnight", "-1/s"])
def test_rate_limit_refuses_bad_values(bad: str) -> None:
    with pytest.raises(UsageError, match="--rate-limit"):
        parse_rate_limit(bad)


class _Instant(TargetBase):
    """A target that answers at once, recording when each request was handed to it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.sent: list[float] = []

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        record.sent_s = self.clock.now_s()
        self.sent.append(record.sent_s)
        record.first_token_s = record.done_s = record.sent_s
        record.output_tokens = 1


async def test_rate_limit_holds_sends_to_the_ceiling_and_counts_the_waits_as_deliberate() -> None:
    clock = Clock()
    target = _Instant(clock)
    specs = [RequestSpec(request_id=i, arrival_s=0.0, prompt="x", input_tokens=1, max_tokens=1) for i in range(12)]
    res = await run(specs, target, clock=clock, handle_sigint=False,  # type: ignore[arg-type]
                    opts=RunOptions(progress=False, rate_limit=(4, 0.2)))
    sent = sorted(target.sent)
    # 12 sends at 4 per 0.2 s: three windows
    assert sent[-1] - sent[0] >= 0.4 - 0.01
    for i in range(len(sent) - 4):
        assert sent[i + 4] - sent[i] >= 0.2 - 0.005
    waits = res.summary.deliberate_waits
    assert waits["num"] == 8
    # client lateness excludes the deliberate waits
    assert res.summary.client.lateness_s["p99"] < 0.05
    assert not res.summary.client.is_bottleneck
    await asyncio.sleep(0)
