"""Text prompts the length asked, on the completions and the chat API, and within the server's context.

The token server's `real-tokenizer` quirk counts prompts as a real server does: subword words, a BOS token,
and on chat a template with a system preamble and role markers (slobench.testing.prompt_count). Preflight
fits the server's count of slobench's words on the API the run uses (tokens a word, and the tokens added to
every prompt, counted once), so the server counts the asked length within 3% at the median; with its context
known, a request whose asked prompt + output fit is never refused for length, and one that does not is
shortened before it is sent and said.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slobench.testing.prompt_count import prompt_tokens, text_tokens
from slobench.workload.prompts import WORDS, random_text
from slobench.workload.word_fit import WordFit, fit_counter, fit_words, probe_lengths
from tests.test_server_quirks import run_cli


def _chat_count(text: str) -> int:
    return prompt_tokens({"messages": [{"role": "user", "content": text}]}, True, real=True)


def test_the_fit_finds_the_templates_tokens_once_and_the_mean_word() -> None:
    fit = fit_counter(_chat_count)
    mean_word = statistics.fmean(text_tokens(w) for w in WORDS)
    assert fit.tokens_per_word == pytest.approx(mean_word, rel=1e-9)  # every word once: the exact mean
    assert round(fit.fixed_tokens) == _chat_count("a") - 1  # the template's tokens, less the one word's
    assert 0.2 < fit.sd_per_word < 0.8  # words of 1 to 2 tokens
    # prompts of the words the fit asks for count the asked length, within the margin
    rng = np.random.default_rng(0)
    counts = [_chat_count(random_text(fit.num_words(400), rng)) for _ in range(50)]
    assert abs(statistics.median(counts) - 400) <= 4 and max(abs(c - 400) for c in counts) <= fit.margin_tokens(400)


def test_a_linear_count_is_fitted_exactly_and_its_margin_is_one_word() -> None:
    lengths = probe_lengths(200)
    fit = fit_words(lengths, [30 + 2 * n for n in lengths])
    assert (fit.tokens_per_word, fit.fixed_tokens, fit.sd_per_word) == (2.0, 30.0, 0.0)
    assert fit.num_words(230) == 100 and fit.margin_tokens(230) == 2
    # the margin grows with the words' spread and with the words the fit did not see
    assert WordFit(2.0, 30.0, 0.5, len(WORDS)).margin_tokens(1030) < WordFit(2.0, 30.0, 0.5, 16).margin_tokens(1030)
    with pytest.raises(ValueError, match="did not grow"):
        fit_words([1, 10], [5, 5])


def _relative_errors(records: list[dict[str, Any]]) -> list[float]:
    return [r["prompt_tokens"] / r["input_tokens"] - 1 for r in records]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_server_counts_the_asked_prompt_length_on_both_apis(quirky: Any, tmp_path: Path, api: str) -> None:
    # text-prompts-only: the completions API gets text too (a server that takes no ids)
    srv = quirky("real-tokenizer", "text-prompts-only")
    code, records, manifest = run_cli(srv, tmp_path / "r", "--api", api, n=20, input_len=160, output_len=4)
    assert code == 0 and len(records) == 20
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert caps["template_overhead"] == (_chat_count("a") - 1 if api == "chat" else 1), caps
    errors = _relative_errors(records)
    assert abs(statistics.median(errors)) <= 0.03, errors


def _run_within(quirky: Any, tmp_path: Path, input_len: int, output_len: int, capsys: Any
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    srv = quirky("real-tokenizer", "max-model-len", log=True, max_model_len=256)
    code, records, _ = run_cli(srv, tmp_path / "r", "--api", "chat", n=20, input_len=input_len,
                               output_len=output_len, workload="chat")
    assert code == 0 and len(records) == 20
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    sent = [x for x in srv.read_log() if x["path"] == "/v1/chat/completions" and x["max_tokens"] == output_len]
    return records, sent, capsys.readouterr().err


def test_a_request_that_fits_the_context_as_asked_is_sent_whole(quirky: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # 190 + 40 of a 256 context: within it by less than a fixed margin of 16 tokens and 5% of the context
    records, sent, err = _run_within(quirky, tmp_path, 190, 40, capsys)
    assert "shortened" not in err
    assert all(r["input_tokens"] == 190 and r["max_tokens"] == 40 for r in records)
    assert len(sent) == 20 and all(x["prompt_tokens"] + x["max_tokens"] <= 256 for x in sent)


def test_a_request_past_the_context_is_shortened_before_it_is_sent(quirky: Any, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    records, sent, err = _run_within(quirky, tmp_path, 300, 60, capsys)
    assert "20 requests shortened to fit the server's max_model_len 256" in err
    assert all(r["max_tokens"] == 60 and r["input_tokens"] < 200 for r in records)  # the prompt cut, not the output
    assert len(sent) == 20 and all(x["prompt_tokens"] + x["max_tokens"] <= 256 for x in sent)
    # the margin is derived from the words' spread: the prompts use most of what is left, and the server
    # counts the shortened length asked
    assert min(x["prompt_tokens"] for x in sent) > 256 - 60 - 40, sorted(x["prompt_tokens"] for x in sent)
    assert abs(statistics.median(_relative_errors(records))) <= 0.03

