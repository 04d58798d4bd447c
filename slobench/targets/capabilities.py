"""What a server accepts of the request extensions slobench relies on, and what to send instead.

slobench's defaults are vLLM-shaped: token-id prompts, `ignore_eos` and `min_tokens` (exact lengths),
`stream_options.include_usage` (the server's own counts). Many servers refuse some (400/422 to unknown
fields, or a 500 with a validation message), and some take a field and ignore it (llama.cpp's `ignore_eos`).
Unless a `--server-profile` fixes the choice, slobench.targets.preflight probes each, and a refusal turns it off:

    token-id prompts  ->  text prompts (the same ids map to the same words, so shared prefixes stay shared)
    ids past a small vocabulary's end  ->  mapped below it (`token_id_range`)
    ignore_eos        ->  min_tokens = max_tokens  ->  neither (the server may stop early: said, and measured)
    include_usage     ->  no stream_options (output tokens counted from the stream, and said so)

Each fallback is a note: printed once before the run, in `manifest.json` (`target.capabilities`), in the report.
A server may also take a field and drop it, so an accepted length field enforces output lengths only where
the server is known to honour it (`length_honoured`); elsewhere it is "accepted, not verified", said once.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from slobench.errors import SpecError

PROFILES = ("auto", "vllm", "sglang", "tgi", "llamacpp", "ollama", "openai", "generic")
# the profiles whose servers serve the Responses API (`--api responses`); "auto" and "generic" leave it to
# the server's answer (preflight's first request)
SERVES_RESPONSES = frozenset({"auto", "generic", "vllm", "sglang", "openai"})


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The extensions slobench sends to this server. `notes` say, once, what was given up and why."""

    profile: str = "vllm"
    token_prompts: bool = True
    ignore_eos: bool = True
    min_tokens: bool = True
    include_usage: bool = True
    usage_in_stream: bool | None = None  # None: not probed; False: asked for, none came (counted from chunks)
    template_overhead: int = 0  # prompt tokens the server adds to a text prompt's own (a chat template), measured
    # send min_tokens = max_tokens beside ignore_eos: for servers that take ignore_eos and ignore it
    # (llama.cpp); off for servers known to honour it (vLLM, SGLang, the bundled engine), whose benchmarks
    # should see the plain request
    pair_min_tokens: bool = True
    probed: bool = False
    # True: the server is known to honour the length fields it is sent (vLLM, SGLang, the bundled engine and
    # the token server, by profile or by `owned_by` in /models). None: accepted, not verified; a server may
    # drop unknown fields silently, and a run's records (`finish_reason` "stop" before max_tokens) show it
    length_honoured: bool | None = None
    # the server's tokens a word of slobench's text prompts (measured when it takes text and no --tokenizer
    # is given); a prompt of n ids is sent as about n / this many words, so the server sees about n tokens
    tokens_per_word: float = 1.0
    # how much words differ in that count (s.d. of one word's tokens), and how many words the measure saw:
    # a text prompt's margin below the context (`word_fit.WordFit.margin_tokens`)
    tokens_per_word_sd: float = 0.0
    probe_words: int = 0
    # token ids the server has accepted (probed, or the --tokenizer's vocabulary), half-open; None: ids are
    # not sent, or the workload's range stands. Ids outside are mapped into it (slobench.workload.limits)
    token_id_range: tuple[int, int] | None = None
    max_model_len: int | None = None  # prompt + output tokens the server takes, from its /models listing
    notes: tuple[str, ...] = field(default=())

    @property
    def sends_length_fields(self) -> bool:
        """Whether requests carry `ignore_eos` or `min_tokens` to force their output lengths."""
        return self.ignore_eos or self.min_tokens

    @property
    def enforces_output_length(self) -> bool:
        """Whether requested output lengths are known to hold (else the server may stop early at EOS)."""
        return self.sends_length_fields and self.length_honoured is True

    @property
    def output_length(self) -> str:
        """What the manifest says of output lengths: "enforced", "accepted, not verified" or "not enforced"."""
        if not self.sends_length_fields:
            return "not enforced"
        return "enforced" if self.length_honoured else "accepted, not verified"

    def sends_like(self, other: Capabilities) -> bool:
        """Whether requests built under `other` are the same as under these (workers need no restart)."""
        keys = ("token_prompts", "ignore_eos", "min_tokens", "include_usage", "template_overhead", "pair_min_tokens",
                "tokens_per_word")
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    def with_note(self, note: str, **changes: Any) -> Capabilities:
        return replace(self, notes=(*self.notes, note), **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["enforces_output_length"] = self.enforces_output_length
        d["output_length"] = self.output_length
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capabilities:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["notes"] = tuple(known.get("notes", ()))
        if known.get("token_id_range") is not None:
            known["token_id_range"] = tuple(known["token_id_range"])
        return cls(**known)


# What each server is known to accept, from its documentation and source (see docs/guide/servers.md). A fixed
# profile skips probing: for a server that must not see probe traffic, or whose refusals are ambiguous.
_KNOWN: dict[str, Capabilities] = {
    "vllm": Capabilities("vllm", pair_min_tokens=False, length_honoured=True),
    "sglang": Capabilities("sglang", pair_min_tokens=False, length_honoured=True),
    "tgi": Capabilities("tgi", token_prompts=False, ignore_eos=False, min_tokens=False),
    "llamacpp": Capabilities("llamacpp", token_prompts=False, ignore_eos=False, min_tokens=True, include_usage=False),
    "ollama": Capabilities("ollama", token_prompts=False, ignore_eos=False, min_tokens=False),
    "openai": Capabilities("openai", token_prompts=True, ignore_eos=False, min_tokens=False),
    "generic": Capabilities("generic", token_prompts=False, ignore_eos=False, min_tokens=False),
}


def profile_capabilities(name: str) -> Capabilities:
    """The fixed capabilities of a named server profile (not "auto", which is decided by probing)."""
    if name not in PROFILES:
        raise SpecError("server_profile", name, f"must be one of {', '.join(PROFILES)}")
    if name == "auto":
        return Capabilities("auto")
    caps = _KNOWN[name]
    notes = []
    if not caps.token_prompts:
        notes.append(f"server profile {name}: prompts sent as text (token-id prompts not used)")
    if not caps.ignore_eos:
        notes.append(
            f"server profile {name}: no ignore_eos"
            + ("; min_tokens = max_tokens sent (accepted, not verified: the server may stop early)"
               if caps.min_tokens else "; output lengths cannot be enforced, the server may stop early")
        )
    if not caps.include_usage:
        notes.append(f"server profile {name}: no stream_options.include_usage; output tokens counted from the stream")
    return replace(caps, notes=tuple(notes))


# `owned_by` in a /models listing that names a server known to honour ignore_eos
HONOURS_IGNORE_EOS = frozenset({"vllm", "sglang", "slobench"})


def with_length_evidence(caps: Capabilities, honours_ignore_eos: bool) -> Capabilities:
    """`caps` after probing, with what is known of its length fields: honoured where the server is one
    known to honour ignore_eos (and took it), else, where any was accepted, a note that it is not verified."""
    if caps.ignore_eos and honours_ignore_eos:
        return replace(caps, length_honoured=True)
    if not caps.sends_length_fields:
        return caps
    sent = " and ".join(f for f, on in (("ignore_eos", caps.ignore_eos), ("min_tokens", caps.min_tokens)) if on)
    return caps.with_note(f"{sent} accepted, not verified: a server may drop unknown fields, so output lengths "
                          "may not hold (requests that stop before max_tokens show in the summary)")

# Words in a refusal that say the server rejected a *field* (a validation error), not that it failed.
_REFUSAL_WORDS = ("unexpected", "unknown", "unrecognized", "unrecognised", "extra", "not permitted",
                  "not allowed", "not supported", "unsupported", "invalid", "validation", "must be", "field")


def is_refusal(status: int, message: str, field_name: str) -> bool:
    """Whether an error answer to a probe refuses the probed extension.

    Any 4xx is (OpenAI answers 400, FastAPI/pydantic servers 422). A 5xx only when the message names the
    field or reads as a validation error: llama-cpp-python answers a token-id prompt with 500 and pydantic's
    message, while a plain 500 or 503 is a failing server, which must not be mistaken for a refusal.
    """
    if 400 <= status < 500 and status not in (401, 403, 404, 408, 429):
        return True
    text = message.lower()
    return status >= 500 and (field_name.lower() in text or any(w in text for w in _REFUSAL_WORDS))


# How vLLM, SGLang, TGI and OpenAI word a request longer than the model's context
_TOO_LONG = re.compile(r"context length|context window|maximum model length|max_model_len|too long|longer than|"
                       r"max_total_tokens|must be <= \d+")
TOO_LONG = "too long"


def name_too_long(status: int, message: str) -> str:
    """A record's error for an HTTP error answer: `message`, headed "too long: " when the server refused the
    request for its length, so such refusals count as an error kind of their own (the workload asked more
    than the server's context), apart from the server failing."""
    if 400 <= status < 500 and _TOO_LONG.search(message.lower()):
        return f"{TOO_LONG}: {message}"
    return message
