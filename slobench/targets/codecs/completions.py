"""The completions API's codec: the request's `prompt` (token ids where the server takes them, else text).
Its stream is a `choices` stream (`slobench.targets.codecs.choices`)."""

from __future__ import annotations

from typing import Any

PATH = "/completions"
MAX_TOKENS_FIELD = "max_tokens"


def put_prompt(body: dict[str, Any], prompt: str | tuple[int, ...]) -> None:
    body["prompt"] = list(prompt) if type(prompt) is tuple else prompt
