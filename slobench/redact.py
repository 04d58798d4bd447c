"""Secrets out of what slobench writes down: the command line, URLs, a server's self-description.

A run directory is meant to be shared (attached to a CI job, committed as a baseline), so the command line
recorded in manifest.json and sweep.json, the target URL and the terminal title must not carry a key:
`--header 'Authorization: Bearer …'`, a secret-named `--extra-body` field, `http://user:pass@host`, a
`?api_key=` in a URL, or the value of a secret-named flag (`--api-key KEY`). Names are judged by their
words (`X-Api-Key` → x, api, key), so `max_tokens` is kept while `api_key` and `X-Auth-Token` are not.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

REDACTED = "<redacted>"
_SECRET_WORDS = frozenset({
    "auth", "authorization", "authentication", "key", "apikey", "token", "secret", "password", "passwd", "pwd",
    "cookie", "credential", "credentials", "bearer", "signature", "jwt", "xapikey",
})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s,]+")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+\S+")
# in a server's own words "token" is mostly the model's (`Token id 29987 is out of vocabulary`)
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)\s+\S+")


def is_secret_name(name: str) -> bool:
    """True when a header, field, flag or query name hints at a credential."""
    words = {w.lower() for w in _WORD.findall(name)}
    return bool(words & _SECRET_WORDS) or name.lower().replace("-", "").replace("_", "") in _SECRET_WORDS


def redact_url(url: str) -> str:
    """The URL without a userinfo password and without the values of secret-named query parameters.

    Userinfo is cut at the last `@`, even where a strict parser would see a path or a query (an unencoded
    `/`, `?` or `#` in a password): leaking a password is worse than mangling a rare `@` further on."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    at = rest.rfind("@")
    if at >= 0:
        user, has_password, _ = rest[:at].partition(":")
        rest = (f"{user}:{REDACTED}" if has_password and "/" not in user else REDACTED) + rest[at:]
    head, qmark, tail = rest.partition("?")
    if qmark:
        query, hash_, fragment = tail.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="<>")
        rest = f"{head}?{query}{hash_}{fragment}"
    return f"{scheme}://{rest}"


def redact_text(text: str) -> str:
    """Every URL in free text (a comma-separated --url list, "m served at URL") with its secrets removed."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redact_message(text: str) -> str:
    """A server's message (an error): its URLs' secrets and any `Bearer …` or `Basic …` credential replaced."""
    return _AUTH_SCHEME.sub(lambda m: f"{m.group(1)} {REDACTED}", redact_text(text))


def redact_header(header: str) -> str:
    """`K: V` (or `K=V`) with V replaced when K names a credential."""
    for sep in (":", "="):
        name, found, _ = header.partition(sep)
        if found and name.strip() and " " not in name.strip():
            return f"{name}{sep} {REDACTED}" if is_secret_name(name) else redact_text(header)
    return redact_text(header)


def redact_json_text(text: str) -> str:
    """A JSON document with the values of secret-named keys (at any depth) replaced; unparsable: all of it."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return REDACTED
    return json.dumps(_redact_tree(doc), separators=(",", ":"))


def _redact_tree(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: REDACTED if is_secret_name(str(k)) else _redact_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_redact_tree(v) for v in node]
    if isinstance(node, str):
        return redact_text(node)
    return node


def _flag_value_redactor(flag: str) -> Any:
    """How to redact the value that follows `flag`, or None to keep it."""
    name = flag.lstrip("-")
    if name in ("header", "H"):
        return redact_header
    if name == "extra-body":
        return redact_json_text
    if is_secret_name(name) and not name.endswith("-env"):  # --api-key KEY; --api-key-env names a variable
        return lambda _value: REDACTED
    return None


def redact_argv(argv: list[str]) -> list[str]:
    """The command line as it may be written to disk: same length, secrets replaced by `<redacted>`."""
    out: list[str] = []
    pending = None  # the redactor for the value that follows the previous flag
    for arg in argv:
        if pending is not None:
            out.append(pending(arg))
            pending = None
            continue
        if arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit():
            flag, eq, value = arg.partition("=")
            redactor = _flag_value_redactor(flag)
            if eq:
                out.append(f"{flag}={redactor(value) if redactor else redact_text(value)}")
            else:
                out.append(arg)
                pending = redactor
            continue
        out.append(_BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", redact_text(arg)))
    return out
