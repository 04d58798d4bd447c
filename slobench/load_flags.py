"""The load flags that are text with a grammar of their own, read into values: `--header K:V`,
`--extra-body JSON`, `--url A,B`, `--rate-limit N/PERIOD`, `--max-error-rate F`. Each bad value is a
UsageError (exit 2, one line) naming its flag; the option groups (`slobench.load_options`) call these
whether a value came from a flag, a Python keyword or an Action input."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from slobench.errors import UsageError

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")  # visible ASCII, space and tab: what every client sends as is
_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for h in items:
        if ":" not in h:
            raise UsageError(f"--header: expected K:V (got {h!r})")
        k, v = h.split(":", 1)
        k, v = k.strip(), v.strip()
        if not _HEADER_NAME.fullmatch(k):
            raise UsageError(f"--header {k!r}: a header name is letters, digits and -_.!#$%&'*+^`|~ only")
        if not _HEADER_VALUE.fullmatch(v):
            raise UsageError(f"--header {k}: the value must be printable ASCII (no line breaks, control or "
                             f"non-ASCII characters; percent-encode them)")
        out[k] = v
    return out


def parse_extra_body(value: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`--extra-body` as JSON text (a flag, an input) or as a mapping (the Python API)."""
    if value is None or isinstance(value, Mapping):
        return None if value is None else dict(value)
    try:
        v = json.loads(value, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"--extra-body: not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise UsageError(f"--extra-body: expected a JSON object (got {value!r})")
    return v


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; a server would refuse the body")


def check_urls(text: str) -> None:
    """`--url A[,B...]`: each an http(s) URL with a host and a port that exists (urllib would otherwise fail
    inside the client, after the run directory was made)."""
    if not text.strip(" ,"):
        raise UsageError(f"--url {text!r}: names no server (leave --url out for the default, or give http://HOST:PORT/v1)")
    for url in (u.strip() for u in text.split(",")):
        if not url:
            continue
        if any(c.isspace() or not c.isprintable() for c in url):
            raise UsageError(f"--url {url!r}: a URL holds no spaces or control characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:  # a port out of 0-65535 or not a number, a bad IPv6 literal
            raise UsageError(f"--url {url}: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url {url}: expected http://HOST[:PORT]/v1 or https://HOST[:PORT]/v1")
        if port == 0:
            raise UsageError(f"--url {url}: port 0 cannot be connected to")


def parse_rate_limit(text: str | None) -> tuple[int, float] | None:
    """`--rate-limit 600/min` -> (600, 60.0); None when not given."""
    if text is None:
        return None
    n, slash, period = str(text).strip().partition("/")
    seconds = _PERIODS.get(period.strip().lower()) if slash else None
    if seconds is None or not (n.strip().isascii() and n.strip().isdigit()) or int(n) < 1:
        raise UsageError(f"--rate-limit: expected N/PERIOD such as 600/min, 10/s or 36000/h (got {text!r})")
    return int(n), seconds


def parse_error_rate(text: str | None) -> float | None:
    """`--max-error-rate 0.05` or `5%` -> 0.05; None when not given."""
    if text is None:
        return None
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--max-error-rate: expected a fraction such as 0.05 or 5% (got {text!r})") from None
    if not 0 <= value < 1:
        raise UsageError(f"--max-error-rate: must be from 0 to below 1 (got {text!r})")
    return value
