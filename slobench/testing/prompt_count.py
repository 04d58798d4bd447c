"""How the token server counts a request's prompt tokens: one a word, or as a real server would.

By default a text prompt counts one token a word and a token-id prompt one a token, with no template: the
lengths slobench asks. With the `real-tokenizer` quirk the count is shaped like a real model's: a word counts
one token per 4 letters started (common short words are one BPE token, longer ones split), a text prompt gets a
BOS token, and a chat request goes through a chat template that wraps each message in role markers and puts
a fixed system preamble before them and the assistant's cue after, as Llama 3's and Qwen's templates do (a
token-id prompt on /v1/completions is taken verbatim, as vLLM takes it). So the lengths a client asks and
those the server counts differ as they do on vLLM, and a test can measure how close slobench gets on both APIs.
"""

from __future__ import annotations

from typing import Any

LETTERS_A_TOKEN = 4  # a word's tokens: one per this many letters, started
BOS_TOKENS = 1
PREAMBLE_TOKENS = 24  # the system preamble a template adds ("Cutting Knowledge Date: ...", a default prompt)
ROLE_TOKENS = 5  # around each message: start of header, role, end of header, blank line, end of turn
CUE_TOKENS = 4  # the assistant's cue that ends the prompt


def text_tokens(text: str) -> int:
    """A text's tokens under the subword rule (`LETTERS_A_TOKEN`)."""
    return sum(-(-len(w) // LETTERS_A_TOKEN) for w in text.split())


def _content(message: Any) -> str:
    content = message.get("content", "") if isinstance(message, dict) else ""
    if isinstance(content, list):  # text parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def prompt_tokens(body: dict[str, Any], is_chat: bool, *, real: bool = False) -> int:
    """The prompt tokens of a request body: words (or ids) one each; with `real`, as a real server counts."""
    if is_chat:
        msgs = [m for m in (body.get("messages") or []) if isinstance(m, dict)]
        if not real:
            return sum(len(_content(m).split()) for m in msgs)
        return (BOS_TOKENS + PREAMBLE_TOKENS + sum(ROLE_TOKENS + text_tokens(_content(m)) for m in msgs)
                + CUE_TOKENS)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    if not real:
        return len(str(prompt).split())
    return BOS_TOKENS + text_tokens(str(prompt))
