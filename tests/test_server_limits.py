"""A server's limits bound what slobench sends: the token ids it accepts, its context (`max_model_len` in
/v1/models), a token-id prompt it fails on, a slow first answer. Each reproduced by the token server with a
quirk (vLLM with a small vocabulary, a proxy answering ids with a bare 500, Ollama loading a model) and
driven through `slobench run` with the defaults."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from slobench.analysis.summary import error_kind
from slobench.cli import main
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts
from slobench.testing import EngineServerProcess
from slobench.testing.token_server import MAX_MODEL_LEN, SMALL_VOCAB
from slobench.workload.limits import BoundedSpecs, ServerLimits
from slobench.workload.prompts import WORDS
from tests.test_server_quirks import run_cli

pytestmark = pytest.mark.integration


def test_a_small_vocabulary_bounds_the_prompt_ids(quirky: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM with a small vocabulary answers ids past its end with an error event in a 200 stream
    srv = quirky("small-vocab", log=True)
    code, records, manifest = run_cli(srv, tmp_path / "r", workload="chat")
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert caps["token_prompts"] is True and caps["token_id_range"] == [1000, SMALL_VOCAB]
    assert any(f"takes ids up to {SMALL_VOCAB - 1}" in n for n in caps["notes"])
    assert f"takes ids up to {SMALL_VOCAB - 1}" in capsys.readouterr().err
    sent = [line for line in srv.read_log() if line["path"] == "/v1/completions" and line["prompt_tokens"] == 8]
    assert len(sent) == 12  # the prompts kept their length


WIDE_IDS = """name = "wide-ids"
api = "completions"
prompt = "tokens"
token_ids = [1000, 50000]

[arrival]
process = "poisson"
rate_rps = 2.0

[input]
dist = "uniform"
min = 8
max = 16

[output]
dist = "uniform"
min = 4
max = 8
"""


def test_the_id_probe_reaches_the_top_of_the_workloads_own_range(quirky: Any, tmp_path: Path) -> None:
    # a vocabulary of 40,000 takes the default range's top id (29,999) but not a workload's ids to 49,999
    (tmp_path / "wide.toml").write_text(WIDE_IDS)
    srv = quirky("small-vocab", log=True, vocab=40_000)
    code, records, manifest = run_cli(srv, tmp_path / "r", workload=str(tmp_path / "wide.toml"))
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert caps["token_id_range"] == [1000, 40_000]
    assert any(n.startswith("token id 49999 refused") and "takes ids up to 39999" in n for n in caps["notes"])


def test_ids_out_of_vocabulary_mid_run_are_named_once_with_the_fix(
    quirky: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a fixed profile probes nothing: the run's own requests meet the small vocabulary
    _, records, _ = run_cli(quirky("small-vocab", log=True), tmp_path / "r", "--server-profile", "vllm", workload="chat")
    assert records and all("out of vocabulary" in r["error"] for r in records)
    err = capsys.readouterr().err
    assert err.count("outside its vocabulary") == 1 and "--tokenizer" in err


def test_a_bare_500_to_token_ids_falls_back_to_text(quirky: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, records, manifest = run_cli(quirky("ids-500", log=True), tmp_path / "r", workload="chat")
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    caps = manifest["target"]["capabilities"]
    assert caps["token_prompts"] is False
    assert any("token-id prompts failed (HTTP 500" in n for n in caps["notes"])
    assert "prompts sent as text" in capsys.readouterr().err


def test_a_failed_preflight_suggests_plainer_requests(quirky: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(quirky("refuse-all", log=True), tmp_path / "r", workload="chat")
    assert code == 3
    err = capsys.readouterr().err
    assert "--api chat" in err and "--server-profile generic" in err


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_max_model_len_from_models_bounds_the_requests(quirky: Any, tmp_path: Path, api: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    srv = quirky("max-model-len", log=True)
    code, records, manifest = run_cli(srv, tmp_path / "r", "--api", api, input_len=3 * MAX_MODEL_LEN, workload="chat")
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    assert manifest["target"]["capabilities"]["max_model_len"] == MAX_MODEL_LEN
    assert "12 requests shortened to fit the server's max_model_len 64" in capsys.readouterr().err
    sent = [line for line in srv.read_log() if line["path"].endswith("completions") and line["max_tokens"] == 6]
    assert len(sent) >= 12 and all(line["prompt_tokens"] + 6 <= MAX_MODEL_LEN for line in sent)


def test_a_request_refused_for_length_is_an_error_kind_of_its_own(quirky: Any) -> None:
    # what a request longer than the context records, when nothing bounded it (a trace, another client)
    srv = quirky("max-model-len", log=True)

    async def go() -> RequestRecord:
        target = OpenAITarget(srv.base_url, TargetOptions(model=srv.model, server_profile="vllm"))
        await target.start()
        try:
            record = RequestRecord(0, 0.0)
            await target.send(RequestSpec(0, 0.0, tuple(range(1000, 1100)), 100, 8), record)
            return record
        finally:
            await target.close()

    record = asyncio.run(go())
    assert record.status == "error" and error_kind(record.error or "") == "too long"


def test_preflight_waits_for_a_slow_first_answer(quirky: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # Ollama loads a model on its first request: the first answer takes longer than the preflight timeout
    srv = quirky("slow-first", log=True)

    async def go() -> str:
        target = OpenAITarget(srv.base_url, TargetOptions(model=srv.model, timeouts=Timeouts(preflight_s=0.5)))
        await target.start()
        try:
            return await target.preflight()
        finally:
            await target.close()

    assert "test-model" in asyncio.run(go())
    assert "waiting for the server's first answer" in capsys.readouterr().err


def test_the_tokenizers_vocabulary_bounds_the_prompt_ids(quirky: Any, tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}  # a few hundred ids
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    code, records, manifest = run_cli(quirky("small-vocab", log=True), tmp_path / "r", "--tokenizer", str(tmp_path / "tokenizer.json"), workload="chat")
    assert code == 0
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    assert manifest["target"]["capabilities"]["token_id_range"] == [len(vocab) // 4, len(vocab)]


def _spec(i: int, prompt: Any, max_tokens: int, min_tokens: int | None = None) -> RequestSpec:
    n = len(prompt) if isinstance(prompt, tuple) else len(prompt.split())
    return RequestSpec(i, 0.1 * i, prompt, n, max_tokens, min_tokens=min_tokens)


def test_ids_past_the_range_map_into_it_the_same_way_every_time() -> None:
    head = (5000, 29999, 1500)
    specs = [_spec(0, (*head, 1200), 4), _spec(1, (*head, 7000), 4), _spec(2, (1001, 1002), 4)]
    bounded = BoundedSpecs(specs, ServerLimits(id_range=(1000, 2048))).specs
    assert isinstance(bounded, list)
    a, b, c = (s.prompt for s in bounded)
    assert all(1000 <= t < 2048 for t in (*a, *b))
    assert a[:3] == b[:3] and a[3] == 1200  # a shared prefix stays shared; ids in range are kept
    assert bounded[2] is specs[2]  # nothing to change: the same spec


def test_a_request_past_the_context_is_cut_prompt_first_then_output() -> None:
    limits = ServerLimits(max_model_len=100)
    made = BoundedSpecs(iter([_spec(0, tuple(range(1000, 1090)), 20, min_tokens=20),
                              _spec(1, tuple(range(1000, 1300)), 80), _spec(2, tuple(range(1000, 1010)), 10)]),
                        limits)
    long_prompt, both, fits = list(made.specs)
    assert (long_prompt.input_tokens, len(long_prompt.prompt), long_prompt.max_tokens) == (80, 80, 20)
    assert long_prompt.prompt == tuple(range(1000, 1080)) and long_prompt.min_tokens == 20
    assert (both.input_tokens, both.max_tokens) == (50, 50)  # the prompt down to half, then the output
    assert (fits.input_tokens, fits.max_tokens) == (10, 10) and made.num_shortened == 2
    text = BoundedSpecs([_spec(0, " ".join(["word"] * 90), 20)], ServerLimits(max_model_len=100, as_text=True))
    shortened = list(text.specs)[0]
    assert shortened.input_tokens + shortened.max_tokens <= 100 - 16 - 5  # a text prompt keeps a margin
    assert len(str(shortened.prompt).split()) == shortened.input_tokens


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_bundled_tiny_engine_takes_the_default_workload(tmp_path: Path, api: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # vocabulary 512 and a byte tokenizer (about 5 tokens a word), context 256: ids, text and lengths all
    # past what the server takes unless preflight bounds them
    with EngineServerProcess("--executor", "modeled", "--model", "tiny", "--max-model-len", "256") as srv:
        code = main(["run", "--url", srv.base_url, "--workload", "chat", "--api", api, "--rate", "20",
                     "--num-requests", "8", "--input-len", "300", "--output-len", "4", "--out", str(tmp_path / "r"),
                     "--no-progress", "--scrape-interval", "0"])
    records = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert code == 0 and len(records) == 8
    assert all(r["status"] == "ok" for r in records), {r["error"] for r in records}
    assert "8 requests shortened to fit the server's max_model_len 256" in capsys.readouterr().err
