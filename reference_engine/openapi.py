"""The request bodies and error responses of the generation routes, as OpenAPI (JSON Schema) for /openapi.json.

The server validates bodies by hand (protocol.py), so FastAPI cannot infer these; they are written out
here so that clients, and a schema-driven fuzzer (tests/test_engine_openapi.py), see what is accepted.
"""

from __future__ import annotations

from typing import Any

from reference_engine.protocol import CHAT_ROLES
from reference_engine.stop import MAX_STOP_STRINGS

_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "min_tokens": {"type": ["integer", "null"], "minimum": 0},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": ["integer", "null"]},
    "n": {"type": ["integer", "null"], "const": 1},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "minLength": 1},
                                              "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]},
    "ignore_eos": {"type": ["boolean", "null"]},
    "include_stop_str_in_output": {"type": ["boolean", "null"]},
}

COMPLETION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        ]},
        **_SAMPLING,
    },
}

CHAT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"enum": sorted(CHAT_ROLES)},
                "content": {"anyOf": [
                    {"type": "string"}, {"type": "null"},
                    {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}},
                ]},
            },
        }},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        **_SAMPLING,
    },
}

ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "integer", "null"]}},
    }},
}


def generation_route(body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for `app.post(...)`: the body's schema and every status the route answers."""
    error = {"content": {"application/json": {"schema": ERROR}}}
    return {
        "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}},
        "responses": {
            200: {"description": "the completion (JSON), or its stream (text/event-stream)",
                  "content": {"application/json": {}, "text/event-stream": {}}},
            400: {"description": "invalid request", **error},
            401: {"description": "missing or wrong API key", **error},
            408: {"description": "the body did not arrive in time", **error},
            413: {"description": "the body exceeds --max-body-size (default 8 MiB), or holds more JSON values "
                                  "than a request for the context needs", **error},
            500: {"description": "the engine failed, or an injected fault (--faults)", **error},
            502: {"description": "an injected reset without a socket to reset", **error},
            503: {"description": "the engine is not running", **error},
        },
    }
