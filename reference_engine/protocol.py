"""The OpenAI request bodies this engine accepts, validated by hand, and the response shapes it sends.

Validation is explicit rather than by pydantic models so that every wrong type is a 400 (pydantic's lax mode
would turn "5" into 5) and the error names the offending field, in OpenAI's error shape.
"""

from __future__ import annotations

import json
import json.scanner
import re
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, Protocol

from reference_engine.executor.base import SamplingParams
from reference_engine.stop import MAX_STOP_STRINGS, OutputText

DEFAULT_COMPLETION_MAX_TOKENS = 16  # the OpenAI completions default
DEFAULT_CHAT_MAX_TOKENS = 256
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class BadRequest(Exception):
    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class TextTokenizer(Protocol):
    """What the server needs of a tokenizer (reference_engine.tokenizer.ByteTokenizer fits)."""

    vocab_size: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(slots=True)
class GenerationRequest:
    prompt_token_ids: SequenceABC[int]  # a list from the wire; the simulator passes its prompt's tuple
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False

    def output_text(self) -> OutputText:
        """The server's view of this request's text: decoded, cut at a stop string."""
        return OutputText(self.stop, include_stop=self.include_stop_str_in_output, min_tokens=self.min_tokens)

    def stop_check(self) -> OutputText | None:
        """The engine's stop-string check for this request (None without stop strings)."""
        return self.output_text() if self.stop else None


# ---- the body -----------------------------------------------------------------------------------------
MAX_JSON_DEPTH = 64  # far deeper than any real request; bounds every recursive walk over a body
# json.loads builds a body's values in C without releasing the GIL: ~0.1 us each, so a body of a quarter
# million values holds every other thread (and the event loop) for ~30 ms, while 8 MiB of `[],[],...` would
# hold them for ~0.7 s and ~360 MB. A body that may hold more values is parsed by the pure-Python scanner
# (~2 us a value), which lets other threads run, counts what it builds and stops at `json_values_limit`.
FAST_JSON_VALUES = 1 << 18


def json_values_limit(max_model_len: int) -> int:
    """The most JSON values a request for a model of `max_model_len` tokens needs: a few per token (a token
    id; a chat message's text part is an object and two strings), and room for the other fields."""
    return 4 * max_model_len + 4096


# A `\\uD800`-`\\uDFFF` escape: the only way a UTF-8 body can carry a surrogate into a Python str.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_CONTAINERS = (dict, list)


def json_value_bound(raw: bytes | bytearray) -> int:
    """At least the number of JSON values in `raw`, counted at C speed: every value but the outermost
    follows a `,`, `[` or `:` (those inside strings only make the bound looser)."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b":") + 1


def parse_json_body(raw: bytes | bytearray, max_values: int = json_values_limit(1 << 20)) -> Any:
    """The request body as JSON, or BadRequest: malformed, nested past MAX_JSON_DEPTH, holding more than
    `max_values` values (413), or holding a lone surrogate (valid JSON, but not text: it cannot be encoded,
    tokenized or echoed back). A body that may hold more than FAST_JSON_VALUES values takes the slow
    scanner, which stops after `max_values` (a body it parses whole is not counted): call this in a worker
    thread then (see FAST_JSON_VALUES)."""
    try:
        body = json.loads(raw) if json_value_bound(raw) <= FAST_JSON_VALUES else _loads_counted(raw, max_values)
    except RecursionError:
        raise BadRequest(f"the JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", None,
                         "invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON body: {e}", None, "invalid_json") from None
    _check_tree(body, check_text=_SURROGATE_ESCAPE.search(raw) is not None)
    return body


def _loads_counted(raw: bytes | bytearray, max_values: int) -> Any:
    """json.loads by the pure-Python scanner (strings still scanned in C), refusing past `max_values`
    containers, numbers and strings (true, false and null are shared objects: they cost a pointer)."""
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    decoder: Any = json.JSONDecoder()  # its parse_* attributes (what py_make_scanner calls) are untyped
    scan_array, scan_object, scan_string = decoder.parse_array, decoder.parse_object, decoder.parse_string
    built = 0

    def count() -> None:
        nonlocal built
        built += 1
        if built > max_values:
            raise BadRequest(f"the JSON body holds more than {max_values} values, more than a request for "
                             "this model's context needs", None, "body_too_large", status=413)

    def parse_array(*args: Any) -> Any:
        count()
        return scan_array(*args)

    def parse_object(*args: Any) -> Any:
        count()
        return scan_object(*args)

    def parse_string(*args: Any) -> Any:
        count()
        return scan_string(*args)

    def parse_number(kind: Callable[[str], Any]) -> Callable[[str], Any]:
        def parse(numeral: str) -> Any:
            count()
            return kind(numeral)
        return parse

    decoder.parse_array, decoder.parse_object, decoder.parse_string = parse_array, parse_object, parse_string
    decoder.parse_int, decoder.parse_float = parse_number(int), parse_number(float)
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(text)


def _check_tree(body: Any, *, check_text: bool) -> None:
    """Depth and (when the raw body had surrogate escapes) text of every key and string, without recursion.
    Without text to check, only containers are visited, picked out at C speed (a prompt of 1M ids costs
    milliseconds)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise BadRequest(f"the JSON body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", None,
                                 "invalid_json")
            values = node.values() if isinstance(node, dict) else node
            if check_text:
                if isinstance(node, dict):
                    stack.extend((k, depth) for k in node)
                stack.extend((v, depth + 1) for v in values)
            else:
                inner = compress(values, map(isinstance, values, repeat(_CONTAINERS)))
                stack.extend(zip(inner, repeat(depth + 1)))
        elif check_text and isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadRequest(f"the JSON body holds a lone surrogate ({node[e.start:e.end]!a}), which is not "
                                 "text", None, "invalid_json") from None


# ---- field readers -------------------------------------------------------------------------------------
_MISSING = object()


def _get(body: dict[str, Any], name: str, kind: str, check: Callable[[Any], bool], default: Any) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return default
    ok_type = {
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "string": isinstance(value, str),
        "object": isinstance(value, dict),
    }[kind]
    if not ok_type:
        raise BadRequest(f"'{name}' must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {json.dumps(value)[:80]}",
                         name, "invalid_type")
    if not check(value):
        raise BadRequest(f"'{name}' has an invalid value: {json.dumps(value)[:80]}", name, "invalid_value")
    return value


# Fields that would change what comes back: refused unless absent, null or neutral, so that a client never
# gets a response that silently ignored what it asked for.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "best_of": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "stop_token_ids": ([],),
    "suffix": ("",),
    "tools": ([],),
    "response_format": ({"type": "text"},),
    "use_beam_search": (False,),
}


def _common(body: Any, model_name: str) -> None:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", None, "invalid_json")
    model = _get(body, "model", "string", lambda v: True, model_name)
    if model != model_name:
        raise BadRequest(f"The model `{model}` does not exist. This server serves `{model_name}`.",
                         "model", "model_not_found")
    _get(body, "n", "integer", lambda v: v == 1, 1)
    for name, neutral in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(type(value) is type(v) and value == v for v in neutral):
            raise BadRequest(f"'{name}' is not supported by this engine (only {json.dumps(list(neutral))[1:-1]} or "
                             f"null; got {json.dumps(value)[:80]})", name, "unsupported")


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("stop")
    if raw is None or raw == "":
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise BadRequest(f"'stop' must be a string or a list of strings, got {json.dumps(raw)[:80]}", "stop",
                         "invalid_type")
    if any(x == "" for x in stops):
        raise BadRequest("'stop' strings must not be empty", "stop", "invalid_value")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"'stop' has {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted", "stop",
                         "invalid_value")
    return tuple(dict.fromkeys(stops))


def _generation(body: dict[str, Any], prompt: list[int], default_max_tokens: int, max_tokens_name: str,
                max_model_len: int) -> GenerationRequest:
    max_tokens = _get(body, max_tokens_name, "integer", lambda v: v >= 1, None)
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, max_model_len - len(prompt)))
    min_tokens = _get(body, "min_tokens", "integer", lambda v: 0 <= v <= max_tokens, 0)
    temperature = _get(body, "temperature", "number", lambda v: 0 <= v <= 2, 1.0)
    top_p = _get(body, "top_p", "number", lambda v: 0 < v <= 1, 1.0)
    seed = _get(body, "seed", "integer", lambda v: True, None)
    stream = _get(body, "stream", "boolean", lambda v: True, False)
    options = _get(body, "stream_options", "object", lambda v: True, {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("'stream_options.include_usage' must be a boolean", "stream_options", "invalid_type")
    return GenerationRequest(
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_get(body, "ignore_eos", "boolean", lambda v: True, False),
        sampling=SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed),
        stream=stream,
        include_usage=include_usage and stream,
        stop=_stop_strings(body),
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", "boolean", lambda v: True, False),
    )


def parse_completion(body: Any, model_name: str, tokenizer: TextTokenizer, max_model_len: int) -> GenerationRequest:
    _common(body, model_name)
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt", "missing_field")
    raw = body["prompt"]
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]  # a batch of one text prompt
    if isinstance(raw, str):
        prompt = tokenizer.encode(raw)
    elif isinstance(raw, list) and all(type(t) is int for t in raw):  # type(), not isinstance: no bools
        if raw and (min(raw) < 0 or max(raw) >= tokenizer.vocab_size):  # min/max: C speed on long prompts
            bad = next(t for t in raw if not 0 <= t < tokenizer.vocab_size)
            raise BadRequest(f"prompt token id {bad} is outside the vocabulary 0..{tokenizer.vocab_size - 1}",
                             "prompt", "invalid_value")
        prompt = list(raw)
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids (integers)", "prompt", "invalid_type")
    if not prompt:
        raise BadRequest("'prompt' is empty", "prompt", "invalid_value")
    return _generation(body, prompt, DEFAULT_COMPLETION_MAX_TOKENS, "max_tokens", max_model_len)


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """A deliberately simple template: each turn as `<|role|>` then its text, then the assistant's cue."""
    turns = [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
    return "".join(turns) + "<|assistant|>\n"


def parse_chat(body: Any, model_name: str, tokenizer: TextTokenizer, max_model_len: int) -> GenerationRequest:
    _common(body, model_name)
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("'messages' is required", "messages", "missing_field")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages", "invalid_type")
    flat: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in CHAT_ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {sorted(CHAT_ROLES)}",
                             f"messages[{i}].role", "invalid_value")
        flat.append({"role": m["role"], "content": _message_text(m.get("content"), i)})
    prompt = tokenizer.encode(chat_prompt(flat))
    max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _generation(body, prompt, DEFAULT_CHAT_MAX_TOKENS, max_name, max_model_len)


def _message_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise BadRequest(f"messages[{i}].content: only text parts are supported",
                                 f"messages[{i}].content", "invalid_value")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts",
                     f"messages[{i}].content", "invalid_type")


# ---- responses ---------------------------------------------------------------------------------------
def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int | None = None
          ) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
    if num_cached_tokens is not None:  # OpenAI's (and vLLM's) field for prefix-cache hits
        out["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
    return out


@dataclass(slots=True)
class ResponseShape:
    """Builds the JSON objects of one response, completion or chat."""

    request_id: str
    model: str
    is_chat: bool
    created: int = 0

    def __post_init__(self) -> None:
        self.created = int(time.time())

    def _head(self, object_name: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": object_name, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.is_chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int | None = None
                    ) -> dict[str, Any]:
        head = self._head("chat.completion.chunk" if self.is_chat else "text_completion")
        return {**head, "choices": [], "usage": usage(num_prompt_tokens, num_completion_tokens, num_cached_tokens)}

    def whole(self, text: str, finish_reason: str | None, num_prompt_tokens: int, num_completion_tokens: int,
              num_cached_tokens: int | None = None) -> dict[str, Any]:
        if self.is_chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish_reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(num_prompt_tokens, num_completion_tokens, num_cached_tokens)}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
