"""Capture vLLM's Responses API answers (`POST /v1/responses`) byte for byte, streamed and whole, into
streams/vllm032-responses-<case>.sse (a whole answer's JSON body too: the replay serves the bytes as they
came), each with its sidecar (see test_stream_fixtures.py) counted here the way a correct client reads the
bytes, independently of slobench: each `response.*_text.delta` event carries a token (its `logprobs`, when
sent, say how many); the usage of the final response (`response.completed` or `response.incomplete`, or the
whole answer) gives the output and input counts; the final response's `status` "incomplete" with
`incomplete_details.reason` "max_output_tokens" is finish_reason "length", "completed" is "stop";
`response.failed` and `error` events, an error object or an HTTP error status are errors. Standard
library only; run by .ci/vllm-capture.sh beside capture_vllm.py.

Usage: `python tests/conformance/capture_vllm_responses.py PORT MODEL_DIR [OUT_DIR]`; prints what each
request got.
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from typing import Any

from capture_vllm import SOURCE, STREAMS, post

MAX_OUTPUT_TOKENS = 16
EMPTY_DELTA_TRIES = 12
COALESCED_TOKENS = 64
COALESCED_TRIES = 8
TOKEN_DELTAS = ("response.output_text.delta", "response.reasoning_text.delta",
                "response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
                "response.refusal.delta")
ENDS = ("response.completed", "response.incomplete")


def events(raw: bytes) -> list[tuple[str, Any]]:
    """Each SSE event as (its `event:` name, its `data:` JSON)."""
    out: list[tuple[str, Any]] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = "", None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data = json.loads(line[5:].strip())
        if data is not None:
            out.append((name, data))
    return out


def finish_reason(response: dict[str, Any]) -> str | None:
    status = response.get("status")
    if status == "completed":
        return "stop"
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else reason
    return None


def error_text(obj: dict[str, Any]) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message"))
    return str(obj.get("message") or err)


def stream_counts(raw: bytes) -> dict[str, Any]:
    """What a stream carries: token deltas, the final response's usage and finish, an error."""
    content = 0
    final: dict[str, Any] | None = None
    error: str | None = None
    for name, ev in events(raw):
        kind = ev.get("type", name) if isinstance(ev, dict) else name
        if kind in TOKEN_DELTAS:
            logprobs = ev.get("logprobs")
            content += len(logprobs) if isinstance(logprobs, list) and logprobs else 1
        elif kind in ENDS:
            final = ev["response"]
        elif kind == "response.failed":
            error = error_text(ev["response"])
        elif kind == "error" or (isinstance(ev, dict) and ev.get("object") == "error"):
            error = error_text(ev)
    usage = (final or {}).get("usage") or {}
    return {
        "status": "error" if error is not None or final is None else "ok",
        "content_tokens": content,
        "output_tokens": usage.get("output_tokens", content),
        "prompt_tokens": usage.get("input_tokens"),
        "finish": final is not None,
        "finish_reason": finish_reason(final) if final is not None else None,
        **({"error_contains": error} if error is not None else {}),
    }


def whole_counts(status: int, raw: bytes) -> dict[str, Any]:
    """What a whole answer carries: no streamed token, the usage, the finish, or the error."""
    obj = json.loads(raw)
    if status >= 400 or obj.get("error") or obj.get("object") == "error":
        return {"status": "error", "content_tokens": 0, "output_tokens": 0, "prompt_tokens": None,
                "finish": False, "error_contains": error_text(obj)}
    usage = obj.get("usage") or {}
    finish = finish_reason(obj)
    return {"status": "ok", "content_tokens": 0, "output_tokens": usage["output_tokens"],
            "prompt_tokens": usage["input_tokens"], "finish": finish is not None, "finish_reason": finish}


def save(out: Path, name: str, body: dict[str, Any], status: int, ctype: str, raw: bytes, note: str,
         abort: bool = False) -> None:
    (out / f"{name}.sse").write_bytes(raw)
    streamed = bool(body.get("stream"))
    side = stream_counts(raw) if streamed and status < 400 else whole_counts(status, raw)
    side["api"] = "responses"
    if not streamed:
        side["stream"] = False
    if status != 200:
        side["http_status"] = status
    if abort:  # a client must say the stream was cut off, not that it ended
        side["abort"] = True
        side["error_contains"] = ["closed before the body ended", "without response.completed"]
    side["max_tokens"] = body.get("max_output_tokens", MAX_OUTPUT_TOKENS)
    side["source"] = f"{SOURCE}: {note}"
    (out / f"{name}.json").write_text(json.dumps(side, indent=2, ensure_ascii=False) + "\n")
    print(f"{name}: HTTP {status} {ctype}, {len(raw)} bytes -> {json.dumps(side, ensure_ascii=False)}")


def post_cut(port: int, body: dict[str, Any]) -> tuple[int, str, bytes, bool]:
    """As `capture_vllm.post`, and whether the server closed the connection before the body ended (then
    the bytes are those that came)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        try:
            return resp.status, resp.getheader("Content-Type", ""), resp.read(), False
        except http.client.IncompleteRead as e:
            return resp.status, resp.getheader("Content-Type", ""), e.partial, True
    finally:
        conn.close()


def empty_deltas(port: int, base: dict[str, Any]) -> int:
    """How many of EMPTY_DELTA_TRIES sampled streams hold a delta with empty text (chat and completions
    stream a token ending inside a UTF-8 character so; this prints whether the Responses API does)."""
    found = 0
    for seed in range(EMPTY_DELTA_TRIES):
        body = {**base, "stream": True, "input": "zopel anor véé 日本", "temperature": 1.0, "seed": seed}
        _, _, raw = post(port, "/v1/responses", body)
        found += any(isinstance(ev, dict) and ev.get("type") in TOKEN_DELTAS and ev.get("delta") == ""
                     for _, ev in events(raw))
    print(f"streams with an empty-text delta: {found} of {EMPTY_DELTA_TRIES} sampled (temperature 1.0)")
    return found


def main() -> None:
    port, model = int(sys.argv[1]), sys.argv[2]
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else STREAMS
    out.mkdir(parents=True, exist_ok=True)
    base = {"model": model, "input": "kalo mitre sunbar", "temperature": 0.0,
            "max_output_tokens": MAX_OUTPUT_TOKENS}
    logprobs = {"include": ["message.output_text.logprobs"]}

    body = {**base, "stream": True}
    save(out, "vllm032-responses-max-output-tokens", body, *post(port, "/v1/responses", body),
         f"streamed, greedy, max_output_tokens {MAX_OUTPUT_TOKENS}, as slobench sends it (input text, no "
         "stream_options): response.created and response.in_progress, the message item and its part "
         "added, output_text deltas (logprobs []), the text, part and item done, then "
         "response.completed whose response has status \"incomplete\" and incomplete_details.reason "
         "\"max_output_tokens\" and the usage; no data: [DONE]")

    body = {**base, "stream": True, "max_output_tokens": COALESCED_TOKENS}
    for attempt in range(COALESCED_TRIES):
        status, ctype, raw = post(port, "/v1/responses", body)
        side = stream_counts(raw)
        if side["content_tokens"] < side["output_tokens"]:
            save(out, "vllm032-responses-coalesced", body, status, ctype, raw,
                 f"streamed, greedy, max_output_tokens {COALESCED_TOKENS} (try {attempt + 1}): deltas that "
                 "carry several tokens each (the engine's outputs queued up before the stream took them), "
                 "fewer deltas than usage.output_tokens")
            break
    else:
        print(f"no stream with fewer deltas than tokens in {COALESCED_TRIES} tries")

    body = {**base, **logprobs, "top_logprobs": 0, "stream": True}
    save(out, "vllm032-responses-logprobs", body, *post(port, "/v1/responses", body),
         "streamed, greedy, include message.output_text.logprobs: each delta's logprobs list has one "
         "entry a token it carries")

    body = {**base, "stream": False}
    save(out, "vllm032-responses-whole", body, *post(port, "/v1/responses", body),
         f"not streamed, greedy, max_output_tokens {MAX_OUTPUT_TOKENS}: one JSON response object, status "
         "\"incomplete\", incomplete_details.reason \"max_output_tokens\", the usage")

    body = {**base, **logprobs, "top_logprobs": 100, "stream": True}
    status, ctype, raw, cut = post_cut(port, body)
    save(out, "vllm032-responses-cut-off", body, status, ctype, raw,
         "streamed, include message.output_text.logprobs with top_logprobs 100 (more than vLLM's 20): "
         "response.created and response.in_progress, then the server's validation error ends the "
         "connection without ending the chunked body (the server logs \"response already started\")",
         abort=cut)

    body = {**base, "stream": True, "temperature": -1.0}
    save(out, "vllm032-responses-bad-parameter", body, *post(port, "/v1/responses", body),
         "streamed request, temperature -1: refused before any stream with HTTP 400 and a JSON error "
         "object (no bad parameter tried, nor a bad previous_response_id, made an error event inside a "
         "stream: vLLM checks the request first)")

    empty_deltas(port, base)


if __name__ == "__main__":
    main()
