"""Text prompts for servers that take no token ids, of an exact token count when a tokenizer is given.

`ids_to_text` maps each token id to one of the prompt words (`prompts.WORDS`, each one BPE token with its
leading space in common tokenizers), by the id alone: two prompts that share a prefix of ids share the
same prefix of text, so a prefix-caching workload keeps its hits when it has to fall back to text.

Without a tokenizer n ids give about n words: preflight fits how many tokens the server counts a word and how
many it adds to every prompt (`slobench.workload.word_fit`), and `sized_text` sends as many words as make the
asked count; the server's `usage.prompt_tokens` is the truth and the summary compares it with what was asked. With `--tokenizer PATH` (a `tokenizer.json`, or an HF
tokenizer folder holding one, read with the `tokenizers` library, never from a hub) the text is trimmed
or padded at its end until it encodes to exactly the asked count, less the chat template's overhead
measured at preflight.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from pathlib import Path
from typing import Any, TypeVar

from slobench.errors import UsageError
from slobench.input_file import TOKENIZER, check_input
from slobench.workload.prompts import WORDS

_NUM_WORDS = len(WORDS)
T = TypeVar("T")
_PADS = (" the", " a", " of", " x", ".", "a", " ")  # short pieces; padding takes one that adds a single token


def ids_to_text(ids: SequenceABC[int]) -> str:
    return " ".join([WORDS[i % _NUM_WORDS] for i in ids])


def words_for_tokens(ids: SequenceABC[T], tokens_per_word: float, fixed_tokens: float = 0.0) -> tuple[T, ...]:
    """The ids whose words make a text the server counts as about len(ids) tokens, when it counts
    `tokens_per_word` tokens a word and `fixed_tokens` more for any prompt (a chat template, a BOS token):
    (len(ids) - fixed_tokens) / tokens_per_word words, the id at every (tokens_per_word)-th position. A prefix
    two prompts share stays shared, and stays the same share of each prompt (both are sampled at the same
    positions)."""
    n = max(1, round((len(ids) - fixed_tokens) / tokens_per_word))
    last = len(ids) - 1
    return tuple(ids[min(int(j * tokens_per_word), last)] for j in range(n))


def thin_words(text: str, tokens_per_word: float, fixed_tokens: float = 0.0) -> str:
    """`words_for_tokens` for a text prompt of words: every (tokens_per_word)-th word, by position."""
    words = text.split(" ")
    return " ".join(words_for_tokens(words, tokens_per_word, fixed_tokens))


def sized_text(prompt: tuple[int, ...] | str, tokens_per_word: float, fixed_tokens: float = 0.0) -> str:
    """The text sent for a prompt of token ids or of words, sized for a server that counts `tokens_per_word`
    tokens a word and `fixed_tokens` more for any prompt, so that it counts about the asked length."""
    if type(prompt) is tuple:
        if tokens_per_word == 1.0 and fixed_tokens == 0:
            return ids_to_text(prompt)
        return ids_to_text(words_for_tokens(prompt, tokens_per_word, fixed_tokens))
    if tokens_per_word == 1.0 and fixed_tokens == 0:
        return str(prompt)
    return thin_words(str(prompt), tokens_per_word, fixed_tokens)


class ExactText:
    """Text of an exact token count for one tokenizer. Thread-compatible; one per target."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tok = load_tokenizer(self.path)

    @property
    def vocab_size(self) -> int:
        """The ids the tokenizer knows, special tokens included: a token-id prompt's ids are below it."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def fit(self, text: str, n: int) -> str:
        """`text`, cut or padded at its end so that it encodes to exactly `n` tokens (n >= 1).

        The head of the text is kept (shared prefixes stay shared); only the tail changes. Cut at the
        character offset where token n starts, then pad with whichever short piece adds exactly one token
        here, trimming characters back when a merge overshoots."""
        n = max(1, n)
        enc = self._tok.encode(text, add_special_tokens=False)
        have = len(enc.ids)
        if have > n:
            text = text[: enc.offsets[n][0]].rstrip() or text[:1]
            have = self.count(text)
        for _ in range(4 * n + 16):
            if have == n:
                return text
            if have > n:
                text = text[:-1].rstrip() or text[:1]
            else:
                step = min(_PADS, key=lambda p: abs(self.count(text + p) - have - 1))
                text += step
            have = self.count(text)
        if have != n:
            raise UsageError(f"--tokenizer {self.path}: could not make a text of exactly {n} tokens (got {have})")
        return text


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json or a folder holding one; UsageError (exit 2) otherwise."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs the tokenizers package: pip install 'slobench[tokenizer]'") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        where = f"no tokenizer.json in folder {path}" if path.is_dir() else f"no such file: {path}"
        raise UsageError(f"--tokenizer: {where}")
    check_input(file, TOKENIZER)  # a regular file within its cap: the library reads whatever it is given
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the tokenizers library raises plain Exception subclasses with a message
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"--tokenizer {file}: not a readable tokenizer.json ({first})") from None
