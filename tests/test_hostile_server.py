"""A hostile server (slobench.testing.hostile_server) against the client: huge bodies and gzip bombs are
refused at their limit, deep JSON is a named error, no redirect is followed, an echoed key is never
stored, a stream left open after its end costs no --timeout, and a hostile /metrics leaves the run whole."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import main
from slobench.errors import TargetUnreachable
from slobench.run.columnar import PARQUET, read_parquet_records
from slobench.run.records import RequestRecord, RequestSpec
from slobench.targets import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts
from slobench.testing.hostile_server import HostileServerProcess

pytestmark = pytest.mark.integration

TRANSPORTS = ("raw", "httpx")


def send_one(url: str, *, stream: bool = True, transport: str = "raw", **options: Any) -> RequestRecord:
    """One request of 3 tokens, through `transport`, its record (the send bounded well below --timeout)."""
    o = TargetOptions(model="test-model", api_key_env=None, stream=stream, transport=transport,  # type: ignore[arg-type]
                      server_profile="vllm", **options)
    spec = RequestSpec(request_id=0, arrival_s=0.0, prompt=(1, 2, 3), input_tokens=3, max_tokens=3)
    record = RequestRecord(0, 0.0)

    async def go() -> None:
        async with OpenAITarget(url, o) as t:
            await asyncio.wait_for(t.send(spec, record), 60)

    asyncio.run(go())
    return record


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("behaviour, stream", [("huge-error", True), ("huge-answer", False), ("huge-answer", True)])
def test_a_huge_body_is_refused_at_the_limit(behaviour: str, stream: bool, transport: str) -> None:
    with HostileServerProcess(behaviour, size=8 << 20) as srv:
        r = send_one(srv.base_url, stream=stream, transport=transport, max_body_bytes=1 << 20)
    assert r.status == "error" and "1 MiB limit" in (r.error or "") and "--max-body" in (r.error or ""), r.error


def test_a_gzip_bomb_or_deep_json_listing_is_a_named_refusal() -> None:
    async def discover(url: str) -> str:
        async with OpenAITarget(url, TargetOptions(api_key_env=None)) as t:
            return await t.discover_model()

    with HostileServerProcess("gzip-bomb-models", size=256 << 20) as srv:
        with pytest.raises(TargetUnreachable, match=r"over the 64 MiB limit once decompressed \(gzip\)"):
            asyncio.run(discover(srv.base_url))
    with HostileServerProcess("deep-json-models", "deep-json-error") as srv:
        with pytest.raises(TargetUnreachable, match="JSON nested deeper than 1024 levels"):
            asyncio.run(discover(srv.base_url))
        r = send_one(srv.base_url)
    assert r.status == "error" and r.http_status == 400 and "nested deeper than 1024 levels" in (r.error or "")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_redirect_is_followed_and_a_3xx_names_its_status_and_location(transport: str) -> None:
    with HostileServerProcess(log=True) as other:
        with HostileServerProcess("redirect", redirect_to=other.root_url) as srv:
            r = send_one(srv.base_url, transport=transport, headers={"X-Api-Key": "xk-secret-1"})
            with pytest.raises(TargetUnreachable, match="HTTP 307 redirect to http://127.0.0.1:"):
                asyncio.run(OpenAITarget(srv.base_url, TargetOptions(api_key_env=None)).discover_model())
        assert other.read_log() == []  # nothing, and so no key, reached the other host
    assert r.status == "error" and r.http_status == 307
    assert f"HTTP 307 redirect to {other.root_url}/v1/completions: not followed" in (r.error or ""), r.error
    with HostileServerProcess("found") as srv:
        r = send_one(srv.base_url, transport=transport)
    assert r.http_status == 302 and (r.error or "").startswith("HTTP 302 redirect (no Location)"), r.error


def test_a_server_echoing_the_key_gets_it_stored_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOBENCH_HOSTILE_KEY", "sk-from-env-0001")
    with HostileServerProcess("echo-key") as srv:
        url = srv.base_url.replace("http://", "http://alice:pa%24%24word@")
        code = main(["run", "--url", url, "--model", "test-model", "--workload", "tiny", "--rate", "50",
                     "--num-requests", "4", "--input-len", "4", "--output-len", "2", "--out", str(tmp_path / "r"),
                     "--no-progress", "--scrape-interval", "0", "--server-profile", "vllm",
                     "--api-key-env", "SLOBENCH_HOSTILE_KEY", "--header", "X-Api-Key: xk-header-0002",
                     "--header", "Authorization: Bearer tok-bare-0003"])
        r = send_one(url)  # no Authorization header: the URL's credentials go as Basic
    records = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert code == 1 and len(records) == 4 and all(r["http_status"] == 401 for r in records)
    assert "bearer=***" in records[0]["error"], records[0]["error"]
    assert r.http_status == 401 and "decoded=***" in (r.error or ""), r.error
    run_dir = tmp_path / "r"
    # every file as text; requests.parquet (compressed columns) as its records read back
    written = "".join(p.read_text() for p in run_dir.iterdir() if p.is_file() and p.name != PARQUET)
    written += "".join(rec.to_json() for rec in read_parquet_records(run_dir)) + (r.error or "")
    for secret in ("sk-from-env-0001", "xk-header-0002", "tok-bare-0003", "pa$$word", "pa%24%24word"):
        assert secret not in written, secret


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("behaviour", ["done-hang", "finish-hang"])
def test_a_stream_left_open_after_its_end_completes_at_once(behaviour: str, transport: str) -> None:
    with HostileServerProcess(behaviour) as srv:
        r = send_one(srv.base_url, transport=transport, timeouts=Timeouts(request_s=600.0))
    assert r.status == "ok" and r.output_tokens == 3, r.error  # send_one gives up after 60 s, not 600


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_without_end_is_refused_not_kept(transport: str) -> None:
    with HostileServerProcess("endless-stream") as srv:
        r = send_one(srv.base_url, transport=transport, timeouts=Timeouts(request_s=600.0))
    assert r.status == "error" and "over 1,036 tokens streamed for max_tokens=3: refused" in (r.error or ""), r.error
    assert sum(r.chunk_tokens) > 1036


@pytest.mark.slow
@pytest.mark.parametrize("behaviour, size", [("gzip-bomb-metrics", 256 << 20), ("huge-metrics", 50 << 20),
                                             ("slow-metrics", 0)])
def test_a_hostile_metrics_endpoint_leaves_the_run_whole(tmp_path: Path, behaviour: str, size: int) -> None:
    with HostileServerProcess(behaviour, size=size) as srv:
        code = main(["run", "--url", srv.base_url, "--model", "test-model", "--workload", "tiny", "--rate", "40",
                     "--num-requests", "80", "--input-len", "4", "--output-len", "4", "--out", str(tmp_path / "r"),
                     "--no-progress", "--scrape-interval", "0.2", "--server-profile", "vllm"])
    records = [json.loads(x) for x in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert code == 0 and len(records) == 80 and all(r["status"] == "ok" for r in records)
    assert not (tmp_path / "r" / "server_metrics.jsonl").exists()  # every scrape refused: no samples


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("behaviour, stream, ok, error", [
    ("superscript-length", False, False, "invalid HTTP response"),
    ("superscript-status", False, False, "invalid HTTP response"),
    ("bare-lf-head", True, True, None),
    ("duplicate-length", False, True, None),
    ("chunk-underscore", True, False, "invalid HTTP response"),
    ("no-content", True, False, "HTTP 204 No Content: an answer with no body"),
])
def test_odd_bytes_are_read_by_rfc_9112_or_refused_by_name(behaviour: str, stream: bool, ok: bool, error: str | None,
                                                           transport: str, caplog: pytest.LogCaptureFixture) -> None:
    with HostileServerProcess(behaviour) as srv:
        r = send_one(srv.base_url, stream=stream, transport=transport)
    if ok:
        assert (r.status, r.output_tokens) == ("ok", 3), r.error
    else:
        assert r.status == "error" and (r.error or "").startswith(error or ""), r.error
    # no "Fatal error: protocol.data_received() call failed" from the event loop
    assert [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"] == []


def run_cli(url: str, out: Path, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["run", "--url", url, "--model", "test-model", "--workload", "tiny", "--input-len", "4",
                 "--output-len", "2", "--out", str(out), "--no-progress", "--scrape-interval", "0", *extra])
    return code, [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("behaviour, why", [("close-after-500", "HTTP 500"),
                                         ("close-on-token-ids", "server closed the connection")])
def test_a_server_failing_token_ids_and_closing_falls_back_to_text_prompts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], behaviour: str, why: str) -> None:
    # close-after-500: token-id prompts get a bare 500, and the connection it left open is closed as the next
    # probe comes; close-on-token-ids: they are met with a close, on every connection
    with HostileServerProcess(behaviour, every=1_000_000) as srv:
        code, records = run_cli(srv.base_url, tmp_path / "r", "--rate", "50", "--num-requests", "6")
    said = capsys.readouterr()
    assert code == 0 and len(records) == 6 and all(r["status"] == "ok" for r in records), said.err
    (note,) = [line for line in said.err.splitlines() if "token-id prompts failed (" in line]
    assert why in note and "prompts sent as text" in note, note


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_at_load_a_server_closing_after_its_500s_fails_only_those(tmp_path: Path, transport: str) -> None:
    with HostileServerProcess("close-after-500", every=10) as srv:
        code, records = run_cli(srv.base_url, tmp_path / "r", "--rate", "150", "--num-requests", "150",
                                "--server-profile", "vllm", "--transport", transport)
    assert len(records) == 150
    assert [r["error"] for r in records if r["status"] != "ok" and r.get("http_status") != 500] == []


def test_a_short_keepalive_gives_no_spurious_failure(tmp_path: Path) -> None:
    # 0.1 req/s against a 5 s keep-alive, scaled: 10 req/s against 0.05 s (each gap near the timeout races it)
    with HostileServerProcess("short-keepalive", keepalive_s=0.05) as srv:
        code, records = run_cli(srv.base_url, tmp_path / "r", "--rate", "10", "--num-requests", "30",
                                "--server-profile", "vllm")
    assert code == 0 and [r["error"] for r in records if r["status"] != "ok"] == []
