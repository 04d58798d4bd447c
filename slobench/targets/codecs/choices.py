"""The SSE stream of the chat and completions APIs: `data:` events of `choices` (a chat `delta` or a
completion `text` each), a usage object, `data: [DONE]`. `ChoiceStream.take` applies each event to the
record; the chat codec says what a delta carries (`slobench.targets.codecs.chat`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slobench.run.records import RequestRecord
from slobench.targets.bounds import json_of
from slobench.targets.codecs.chat import chat_output, chat_text, is_reasoning
from slobench.targets.codecs.common import error_message, event_error_text, event_text, take_usage
from slobench.targets.sse import DONE


class ChoiceStream:
    """What one SSE stream has said so far: `take` applies each event to it and to the record."""

    __slots__ = ("record", "is_chat", "finish", "num_finished", "num_choices", "wants_usage", "error",
                 "is_done", "ended", "texts", "num_reasoning", "has_answer", "first_answer_s")
    missing_end = "a finish_reason or [DONE]"  # what a cut-off stream lacked, for its error

    def __init__(self, record: RequestRecord, is_chat: bool, num_choices: int = 1, wants_usage: bool = False) -> None:
        self.record = record
        self.is_chat = is_chat
        self.finish: str | None = None
        self.num_finished = 0  # events that carried a finish_reason (one a choice)
        self.num_choices = num_choices
        self.wants_usage = wants_usage  # usage was asked for and the server sends it: wait for it
        self.error: str | None = None
        self.is_done = False  # [DONE] came
        self.ended = False  # [DONE] came, or every choice finished and the usage asked for came
        self.texts: list[str] | None = None  # the generated text, gathered only when a tokenizer will count it
        self.num_reasoning = 0  # tokens counted in reasoning deltas
        self.has_answer = False  # an answer token (text or tool-call arguments) has come
        self.first_answer_s: float | None = None  # the read that brought the first (`_StreamReader.feed`)

    def _check_ended(self) -> None:
        if self.num_finished >= self.num_choices and (not self.wants_usage or
                                                      self.record.usage_output_tokens is not None):
            self.ended = True

    def take(self, kind: str, data: str) -> int:
        """Apply one event; the tokens it carried. After `[DONE]` (`is_done`) or an event that failed the
        stream (`error`) the rest of the read is ignored. A usage object is taken onto the record as it
        comes."""
        if data == DONE:
            self.is_done = self.ended = True
            return 0
        if kind == "error":
            self.error = "server error mid-stream: " + event_error_text(data)
            return 0
        try:
            obj = json_of(data)
        except ValueError as e:
            if "nested deeper" in str(e):
                self.error = f"SSE event JSON {e}"
                return 0
            obj = None
        if type(obj) is not dict:
            self.error = f"malformed JSON in SSE event: {data[:120]!r}"
            return 0
        return self.take_all((obj,), (data,))

    def take_all(self, objs: Sequence[dict[str, Any]], datas: Sequence[str | bytes], done: bool = False) -> int:
        """Apply events already parsed (`objs`, from `datas`; `done`: `[DONE]` followed them) as `take` applies
        each, up to one that fails the stream; the tokens they carried. A read's events go through here in
        one call, the common event (a choice with its text or delta content) taken inline: `is_token` and
        `tokens_in` for it."""
        is_chat = self.is_chat
        texts = self.texts
        num = 0
        for obj, data in zip(objs, datas, strict=False):  # datas: and [DONE]
            choices = obj.get("choices")
            if choices and type(choices) is list:
                c = choices[0]
                if type(c) is dict:
                    reason = c.get("finish_reason")
                    if reason and type(reason) is str:
                        self.finish = reason
                        self.num_finished += 1
                        self._check_ended()
                    else:
                        reason = None
                    if is_chat:
                        out = c.get("delta")
                        token = (type(out) is dict and out.get("content")) or is_token(out, reason, True)
                    else:
                        out = c.get("text")
                        token = type(out) is str and (out != "" or reason is None)
                    if token:
                        ids = c.get("token_ids")
                        if ids:
                            k = len(ids)
                        else:
                            logprobs = c.get("logprobs")
                            toks = logprobs.get("content" if is_chat else "tokens") if logprobs else None
                            k = len(toks) if toks else 1
                        num += k
                        if is_chat and is_reasoning(out):
                            self.num_reasoning += k
                        else:
                            self.has_answer = True
                        if texts is not None:
                            texts.append(chat_text(out) if is_chat else str(out))
            elif "error" in obj or obj.get("object") == "error":
                self.error = "server error mid-stream: " + error_message(obj, event_text(data))
                return num
            usage = obj.get("usage")
            if usage and type(usage) is dict:
                take_usage(self.record, usage)
                if self.finish is not None:
                    self._check_ended()
        if done:
            self.is_done = self.ended = True
        return num


def is_token(out: Any, finish: str | None, is_chat: bool) -> bool:
    """Whether a choice's `text` (completions) or `delta` (chat) carries a generated token, its text empty
    or not: vLLM streams a token with empty text where it splits a UTF-8 character or is a skipped special
    token, and that token's time is the one measured. Not tokens: a chat preamble (a delta with a `role`
    and no text: vLLM's and SGLang's first chunk, llama.cpp's `content: null`), a choice with no text
    field (LiteLLM's usage chunk, `delta: {}`), and a finish chunk with empty text (llama.cpp, Ollama,
    OpenAI and SGLang send the finish in a chunk of its own)."""
    if is_chat:
        if chat_output(out):
            return True
        if finish is not None or not isinstance(out, dict) or out.get("role"):
            return False
        return any(type(out.get(k)) is str for k in ("content", "reasoning_content", "reasoning"))
    return type(out) is str and (out != "" or finish is None)


def tokens_in(choice: dict[str, Any], is_chat: bool) -> int:
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    logprobs = choice.get("logprobs")
    if logprobs:
        toks = logprobs.get("content") if is_chat else logprobs.get("tokens")
        if toks:
            return len(toks)
    return 1
