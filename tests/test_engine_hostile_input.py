"""Hostile request bodies against the engine's server: every one is a 4xx in OpenAI's shape, never a 500,
and the engine is left as it was. Hand-picked cases (issue 13, item 5) and a hypothesis fuzz over bodies."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # starlette >= 0.5x suggests httpx2 for its TestClient; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
from reference_engine.engine import LLMEngine
from reference_engine.protocol import FAST_JSON_VALUES, BadRequest, json_values_limit, parse_json_body
from reference_engine.server import INLINE_PARSE_BYTES, build_app
from reference_engine.tokenizer import ByteTokenizer
from tests.test_engine_server import MODEL, make_engine

ROUTES = ("/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, LLMEngine]]:
    engine = make_engine(num_blocks=64, max_model_len=128)
    with TestClient(build_app(engine, MODEL, ByteTokenizer()), raise_server_exceptions=False) as c:  # the lifespan starts the engine
        yield c, engine


def nested(depth: int) -> bytes:
    return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"


def assert_client_error(status: int, text: str) -> None:
    assert 400 <= status < 500, (status, text[:300])
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


HOSTILE: list[tuple[str, bytes]] = [
    ("/v1/completions", nested(100_000)),  # RecursionError in json.loads
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("/v1/completions", b'{"prompt": "\\ud800"}'),  # a lone surrogate: UnicodeEncodeError in the tokenizer
    ("/v1/completions", b'{"prompt": ["\\udfff"]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": ["user"], "content": "hi"}]}'),  # unhashable role
    ("/v1/chat/completions", b'{"messages": [{"role": {"a": 1}, "content": "hi"}]}'),
    ("/v1/completions", b'{"prompt": "hi", "model": "\\ud800"}'),  # echoed in the error message
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\ud800"]}'),
    ("/v1/completions", b'{"\\ud800": 1, "prompt": "hi"}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000000000000000000000000}'),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "hi", "top_p": Infinity}'),
    ("/v1/completions", b'{"prompt": [1e400]}'),
    # past INLINE_PARSE_BYTES: parsed in a worker thread by json.loads
    ("/v1/completions", b'{"pad": "' + b"a" * (INLINE_PARSE_BYTES + 1) + b'", "prompt": ' + b"[" * 100_000
     + b"]" * 100_000 + b"}"),
    # more than FAST_JSON_VALUES possible values: the counting pure-Python scanner, also in the thread
    ("/v1/completions", b'{"pad": [' + b"0," * FAST_JSON_VALUES + b'0], "prompt": ' + b"[" * 100_000
     + b"]" * 100_000 + b"}"),
    ("/v1/chat/completions", b'{"messages": [' + b"{}," * FAST_JSON_VALUES + b"{}]}"),  # over the value limit
]


@pytest.mark.parametrize(("route", "raw"), HOSTILE, ids=[f"{i}" for i in range(len(HOSTILE))])
def test_hostile_body_is_a_client_error_and_changes_nothing(
    client: tuple[TestClient, LLMEngine], route: str, raw: bytes
) -> None:
    c, engine = client
    before = engine.stats()
    r = c.post(route, content=raw, headers={"content-type": "application/json"})
    assert_client_error(r.status_code, r.text)
    assert engine.stats() == before and engine.is_healthy()


def test_escaped_surrogate_pairs_are_still_text(client: tuple[TestClient, LLMEngine]) -> None:
    """json.dumps escapes an emoji as a surrogate *pair*: that is valid text, not a lone surrogate."""
    c, _ = client
    r = c.post("/v1/completions", content=json.dumps({"prompt": "smile \U0001f600", "max_tokens": 2}))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len("smile \U0001f600".encode())


# ---- fuzz: bodies near the real ones, with wrong types, huge numbers and odd strings everywhere ---------
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
            | st.sampled_from(["\ud800", "a\udfffb", "user", "text", MODEL, ""]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
_fields = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "min_tokens", "temperature",
           "top_p", "seed", "stream", "stream_options", "stop", "ignore_eos", "include_stop_str_in_output", "n",
           "echo", "logprobs", "tools", "response_format", "logit_bias"]
_message = st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system"]) | _json,
                                               "content": _json})
_body = st.dictionaries(st.sampled_from(_fields), _json, max_size=6) | st.fixed_dictionaries(
    {"messages": st.lists(_message | _json, max_size=3)},
    optional={f: _json for f in _fields if f != "messages"},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_body, route=st.sampled_from(ROUTES))
def test_fuzzed_bodies_never_500(client: tuple[TestClient, LLMEngine], body: dict[str, Any], route: str) -> None:
    c, engine = client
    body = {**body, "max_tokens": 2} if body.get("max_tokens") is None else body  # keep accepted ones short
    raw = json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes
    r = c.post(route, content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:300], body)
    if r.status_code >= 400:
        assert_client_error(r.status_code, r.text)
    assert engine.is_healthy()


def test_a_body_over_the_value_limit_is_413_whatever_its_shape() -> None:
    limit = json_values_limit(128)
    for many in (b"[" + b"0," * limit + b"0]", b"[" + b'"",' * limit + b'""]', b"[" + b"[]," * limit + b"[]]",
                 b'{"a": [' + b"1.5, {}, " * (limit // 2) + b"1]}"):
        with pytest.raises(BadRequest) as e:
            parse_json_body(b'{"pad": "' + b"," * FAST_JSON_VALUES + b'", "x": ' + many + b"}", limit)
        assert e.value.status == 413 and e.value.code == "body_too_large"


@settings(max_examples=100, deadline=None)
@given(value=_json)
def test_the_counting_scanner_reads_what_json_loads_reads(value: Any) -> None:
    """A string of commas makes a body look many-valued: it takes the slow scanner, which must agree with
    json.loads (the fast path) on every value and every refusal."""
    def outcome(pad: str) -> tuple[Any, ...]:
        try:  # dumps: NaN != NaN
            return ("ok", json.dumps(parse_json_body(json.dumps({"pad": pad, "value": value}).encode())["value"]))
        except BadRequest as e:
            return ("refused", e.status, e.code)

    assert outcome("," * FAST_JSON_VALUES) == outcome("")


def test_a_text_longer_than_the_context_is_refused_before_it_is_tokenized(client: tuple[TestClient, LLMEngine]
                                                                          ) -> None:
    """The byte tokenizer makes a token per byte: a text of over a million characters cannot fit a 128-token
    context, and is refused without the ~30 ms of holding the GIL that tokenizing it would cost."""
    c, engine = client
    before = engine.stats()
    text = "a" * ((1 << 20) + 1)
    for route, body in (("/v1/completions", {"prompt": text}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
        r = c.post(route, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert "at least" in r.json()["error"]["message"]
    assert engine.stats() == before
