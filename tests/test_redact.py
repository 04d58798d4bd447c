"""Secrets never reach disk through the recorded command line (issue 13, item 1)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slobench.redact import REDACTED, is_secret_name, redact_argv, redact_text, redact_url

SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize("header", [f"Authorization: Bearer {SECRET}", f"X-Api-Key: {SECRET}", f"api-key:{SECRET}",
                                    f"Cookie: session={SECRET}", f"X-Auth-Token: {SECRET}",
                                    f"Proxy-Authorization: Basic {SECRET}", f"X-Client-Secret={SECRET}"])
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_secret_headers_are_redacted(header: str, form: str) -> None:
    argv = ["run", "--header", header] if form == "separate" else ["run", f"--header={header}"]
    out = redact_argv(argv)
    assert SECRET not in " ".join(out) and REDACTED in " ".join(out)
    assert len(out) == len(argv) and out[0] == "run"
    assert header.split(":")[0].split("=")[0] in " ".join(out)  # the header's name stays: the run is still described


def test_ordinary_headers_and_flags_are_kept() -> None:
    argv = ["run", "--header", "X-Request-Source: ci", "--url", "http://127.0.0.1:8000/v1", "--rate", "4",
            "--api-key-env", "MY_KEY", "--extra-body", '{"max_tokens": 5, "top_k": 3}', "--slo", "ttft=500ms"]
    out = redact_argv(argv)
    assert out[:-4] == argv[:-4] and out[-2:] == argv[-2:]
    assert json.loads(out[-3]) == {"max_tokens": 5, "top_k": 3}


def test_extra_body_secret_keys_are_redacted_at_any_depth() -> None:
    body = {"api_key": SECRET, "max_tokens": 5, "metadata": {"accessToken": SECRET, "user": "bob"},
            "auth": [{"password": SECRET}]}
    out = redact_argv(["--extra-body", json.dumps(body)])
    doc = json.loads(out[1])
    assert SECRET not in out[1]
    assert doc["max_tokens"] == 5 and doc["metadata"]["user"] == "bob" and doc["api_key"] == REDACTED
    assert redact_argv(["--extra-body={not json " + SECRET])[0] == f"--extra-body={REDACTED}"


@pytest.mark.parametrize(("url", "kept"), [
    (f"http://user:{SECRET}@host:8000/v1", "http://user:"),
    (f"https://{SECRET}@host/v1", "https://"),
    (f"https://host/v1?api_key={SECRET}&x=1", "x=1"),
])
def test_url_secrets_are_redacted(url: str, kept: str) -> None:
    for argv in (["--url", url], [f"--url={url}"], ["--url", f"http://a:8000/v1,{url}"]):
        out = " ".join(redact_argv(argv))
        assert SECRET not in out and kept in out and "host" in out
    assert SECRET not in redact_text(f"m served at {url}") and redact_url("http://h:1/v1") == "http://h:1/v1"


def test_secret_flag_values_and_bare_bearer_tokens() -> None:
    out = redact_argv(["serve", "--api-key", SECRET, "--port", "8000", f"--api-key={SECRET}", f"Bearer {SECRET}"])
    assert SECRET not in " ".join(out) and out[3:5] == ["--port", "8000"]


def test_names_are_judged_by_their_words() -> None:
    assert all(map(is_secret_name, ["api_key", "X-Api-Key", "APIKey", "authorization", "client_secret", "token"]))
    assert not any(map(is_secret_name, ["max_tokens", "min_tokens", "ignore_eos", "top_k", "monkey", "model"]))


@given(st.lists(st.text(max_size=30), max_size=8))
def test_redact_argv_never_fails_and_keeps_the_length(argv: list[str]) -> None:
    assert len(redact_argv(argv)) == len(argv)


@given(st.sampled_from(["--header", "--extra-body", "--url", "--api-key"]), st.text(min_size=8, max_size=20,
       alphabet="abcdefXYZ0123456789:/?#@%+=&._~-"))
def test_a_secret_placed_in_any_secret_slot_never_survives(flag: str, secret: str) -> None:
    value = {"--header": f"Authorization: Bearer {secret}", "--extra-body": json.dumps({"api_key": secret}),
             "--url": f"http://u:{secret}@h/v1", "--api-key": secret}[flag]
    assert secret not in " ".join(redact_argv(["run", flag, value]))


def test_no_secret_reaches_the_run_directory_or_the_terminal(token_server, tmp_path, monkeypatch, capsys) -> None:
    from slobench.cli import main

    out = tmp_path / "run"
    # a key in the query too: every call (preflight, the requests, /metrics) keeps it after its own path
    url = token_server.base_url.replace("http://", f"http://user:{SECRET}@") + f"?api_key={SECRET}"
    argv = ["run", "--url", url, "--workload", "tiny", "--rate", "50", "--num-requests", "5", "--out", str(out),
            "--header", f"Cookie: session={SECRET}", "--header", f"X-Api-Key: {SECRET}",
            "--extra-body", json.dumps({"api_key": SECRET}), "--no-progress", "--scrape-interval", "0",
            "--report", str(tmp_path / "report.html")]
    monkeypatch.setattr("sys.argv", ["slobench", *argv])  # the manifest records sys.argv
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err
    files = [*out.iterdir(), tmp_path / "report.html"]
    assert {p.name for p in files} >= {"manifest.json", "requests.jsonl", "summary.json", "report.html"}
    for p in files:
        assert SECRET not in p.read_text(errors="replace"), p.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert "user:<redacted>@" in manifest["target"]["url"] and "--header" in manifest["command"]
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(r["status"] == "ok" for r in recs)
