"""`slobench.run_load` and `slobench run` are one path: the same options make the same manifest, the same
notes, the same files (the /metrics scraper's included), and an existing run directory is refused by both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import slobench
from slobench.cli import main
from slobench.errors import UsageError
from slobench.testing import TokenServerProcess

EXTRA = {"temperature": 0.5}


@pytest.fixture(scope="module")
def short_context() -> Iterator[TokenServerProcess]:
    """A token server that lists max_model_len 64, so 60-token prompts with 10-token outputs are shortened
    (a note) and the server's limit is seen at preflight."""
    with TokenServerProcess(ttft_ms=1, itl_ms=1, quirks=("max-model-len",)) as srv:
        yield srv


def _notes(err: str, out: Path) -> list[str]:
    return sorted(line.replace(str(out), "OUT") for line in err.splitlines() if line.startswith("slobench:"))


def _manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    m.pop("command")
    assert set(m.pop("clock")) == {"wall_anchor_unix_s"}  # when each run started: the one field that differs
    return m


def test_cli_and_api_make_the_same_run(short_context: TokenServerProcess, tmp_path: Path, capsys) -> None:
    url = short_context.base_url
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    code = main(["run", "--url", url, "--workload", "tiny", "--rate", "50", "--num-requests", "8", "--input-len", "60",
                 "--output-len", "10", "--slo", "ttft=1s", "--extra-body", json.dumps(EXTRA), "--scrape-interval", "0.05",
                 "--out", str(cli_out), "--no-progress"])
    assert code == 0
    cli_notes = _notes(capsys.readouterr().err, cli_out)
    run = slobench.run_load(url, workload="tiny", rate=50, num_requests=8, input_len=60, output_len=10, slo="ttft=1s",
                            extra_body=EXTRA, scrape_interval=0.05, out=api_out)
    api_notes = _notes(capsys.readouterr().err, api_out)

    assert api_notes == cli_notes
    assert any("shortened to fit the server's max_model_len 64" in n for n in api_notes)  # the bounding, said
    assert any("--extra-body sets temperature" in n for n in api_notes)
    assert _manifest(api_out) == _manifest(cli_out)
    assert run.manifest["target"]["capabilities"]["max_model_len"] == 64
    assert run.manifest["command"] == [
        "run", "--url", url, "--rate", "50", "--workload", "tiny", "--num-requests", "8", "--slo", "ttft=1s",
        "--out", str(api_out), "--seed", "0", "--no-progress", "--input-len", "60", "--output-len", "10",
        "--extra-body", '{"temperature":0.5}', "--scrape-interval", "0.05"]  # as redact_argv writes JSON
    for name in ("server_metrics.jsonl", "summary.json", "requests.jsonl"):
        assert (api_out / name).is_file() and (cli_out / name).is_file()


def test_api_refuses_an_existing_run_directory(short_context: TokenServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "r"
    kw = dict(workload="tiny", rate=50, num_requests=4, input_len=8, output_len=4, scrape_interval=0, out=out)
    slobench.run_load(short_context.base_url, **kw)
    with pytest.raises(UsageError, match="overwrite"):
        slobench.run_load(short_context.base_url, **kw)
    again = slobench.run_load(short_context.base_url, overwrite=True, **kw)
    assert again.summary is not None and again.summary.num_requests == 4


def test_api_takes_no_key_itself() -> None:
    with pytest.raises(TypeError, match="api_key_env"):
        slobench.run_load("http://127.0.0.1:9/v1", rate=1.0, api_key="sk-secret")
