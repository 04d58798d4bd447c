"""What one OpenAI-compatible server accepts, settled with a few tiny requests before the run.

`find_model` reads `/models`; `negotiate` checks the server answers for the model and, with the "auto"
profile, probes each extension slobench relies on (token-id prompts, `ignore_eos`, `min_tokens`,
`stream_options.include_usage`) and measures how many tokens the server counts a word of the text prompts.
Each fallback is a note (see slobench.targets.capabilities). The probes go through a `ControlClient`,
never the load's transport; a probe that cannot reach the server raises `TargetUnreachable`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slobench.errors import TargetUnreachable
from slobench.targets.capabilities import HONOURS_IGNORE_EOS, Capabilities, is_refusal, with_length_evidence
from slobench.targets.sse import SSEDecodeError, SSEParser
from slobench.targets.transport import ControlClient, Reply, TransportError
from slobench.workload.text import ids_to_text

if TYPE_CHECKING:
    from slobench.targets.openai import OpenAITarget

PROBE_TRIES = 3
PROBE_BACKOFF_S = 0.2
PROBE_IDS = (72, 101, 108, 108, 111)  # "Hello" in bytes: inside every vocabulary, byte-level ones included
WORDS_PROBE = 200  # words of the prompt that measures the server's tokens a word (`_measure_words`)
WORD_IDS = tuple(range(1000, 1000 + WORDS_PROBE))  # ids standing for as many different prompt words
MAX_PLAUSIBLE_TOKENS = 10_000_000  # a count above this is not a token count


def usage_count(v: Any) -> int | None:
    """A token count from a usage object: a non-negative int (not a bool) no larger than any real request."""
    if type(v) is int and 0 <= v <= MAX_PLAUSIBLE_TOKENS:
        return v
    return None


async def find_model(target: OpenAITarget) -> str:
    """The first model the server lists at /models. A server that lists none is unreachable for this
    purpose: pass --model."""
    url = target.base_url + "/models"
    async with ControlClient(timeout_s=target.timeouts.preflight_s) as client:
        r = await _control(target, client, "GET", url, what=f"GET {url}")
    if r.status != 200:
        raise TargetUnreachable(f"GET {url}: HTTP {r.status}; pass --model NAME")
    served = _served_models(r.body)
    if not served:
        raise TargetUnreachable(f"GET {url}: no model listed; pass --model NAME")
    return served[0]


async def negotiate(target: OpenAITarget) -> tuple[Capabilities, str]:
    """Check the server answers for `target.model` and settle what it accepts: the capabilities, and a
    one-line description of what answered.

    `/models` is advisory: a listing that names other models only is an error (a typo in --model), but
    a missing, failing or empty one is a note, and one tiny request decides. Then, with the "auto"
    profile, one probe per extension; a fixed profile probes none.
    """
    model = target.model
    url = target.base_url + "/models"
    notes: list[str] = []
    async with ControlClient(timeout_s=target.timeouts.preflight_s) as client:
        r = await _control(target, client, "GET", url)
        served = _served_models(r.body) if r.status < 400 else None
        owner = _owner(r.body, model) if served else None
        if r.status in (401, 403):
            raise TargetUnreachable(f"{url}: {target.http_error(r.status, r.body)}{_auth_hint(r)}")
        if served and model not in served:
            listing = ", ".join(repr(m) for m in served[:20])
            raise TargetUnreachable(f"{url}: model {model!r} is not served; served: {listing}")
        if not served:
            why = (f"HTTP {r.status}" if r.status >= 400 else
                   "an empty list" if served == [] else "no model list")
            notes.append(f"GET /models gave {why}; a request to {model!r} decides instead")
        caps = await _probe_extensions(target, client, notes, honours_ignore_eos=owner in HONOURS_IGNORE_EOS)
        if caps.probed and target.exact_text is None and (target.api == "chat" or not caps.token_prompts):
            caps = await _measure_words(target, client, caps)
    if served:
        return caps, f"{model} served at {target.base_url}"
    return caps, f"{model} answers at {target.url}"


async def _probe_extensions(target: OpenAITarget, client: ControlClient, notes: list[str], *,
                            honours_ignore_eos: bool) -> Capabilities:
    """The plainest request first (it must succeed), then, with the "auto" profile, one probe per extension."""
    caps = target.caps
    is_chat = target.api == "chat"
    for attempt in range(PROBE_TRIES):  # a transient 5xx is tried again; a 4xx is an answer
        r = await _control(target, client, "POST", target.url, _probe_body(target))
        if r.status < 500 or attempt == PROBE_TRIES - 1:
            break
        await asyncio.sleep(PROBE_BACKOFF_S * (attempt + 1))
    if r.status >= 400:
        raise TargetUnreachable(
            f"{target.url}: the server refused the plainest request (text prompt, max_tokens=1, none of "
            f"slobench's extensions): {target.http_error(r.status, r.body)}{_auth_hint(r)}"
        )
    overhead = 0
    plain_usage = _usage_of(r.body)
    exact = target.exact_text
    if is_chat and plain_usage and exact is not None:
        prompt_tokens = usage_count(plain_usage.get("prompt_tokens"))
        if prompt_tokens is not None:
            overhead = max(0, prompt_tokens - exact.count("Hello"))
            notes.append(f"the chat template adds {overhead} prompt tokens (measured); text prompts are "
                         "shortened by that much")
    caps = replace(caps, template_overhead=overhead)
    if caps.profile != "auto":
        return replace(caps, notes=(*notes, *caps.notes))
    caps = Capabilities("auto", probed=True, template_overhead=overhead, notes=tuple(notes),
                        pair_min_tokens=not honours_ignore_eos)

    async def refused(field_name: str, **fields: Any) -> str | None:
        # a failure that is not a refusal (a 503, a flaky 500) is tried again before the run is given up
        message = ""
        for attempt in range(PROBE_TRIES):
            resp = await _control(target, client, "POST", target.url, _probe_body(target, **fields))
            if resp.status < 400:
                return None
            message = target.http_error(resp.status, resp.body)
            if is_refusal(resp.status, message, field_name):
                return message
            if attempt < PROBE_TRIES - 1:
                await asyncio.sleep(PROBE_BACKOFF_S * (attempt + 1))
        raise TargetUnreachable(f"{target.url}: probing {field_name} failed {PROBE_TRIES} times: {message}")

    if not is_chat:
        # The probe asks whether the server takes ids at all, so its ids must be in every vocabulary: ids
        # past a small vocabulary's end are refused too, and falling back to text for that would send a
        # byte-level model's 32-token prompts as ~150-token ones.
        why = await refused("prompt", prompt=list(PROBE_IDS))
        if why:
            caps = caps.with_note(f"token-id prompts refused ({why}); prompts sent as text "
                                  "(the server's usage counts their tokens)", token_prompts=False)
    why_eos = await refused("ignore_eos", ignore_eos=True)
    why_min = await refused("min_tokens", min_tokens=1)
    if why_eos and why_min:
        caps = caps.with_note(
            f"ignore_eos refused ({why_eos}) and min_tokens refused ({why_min}): output lengths cannot "
            "be enforced, the server may stop early (requested vs produced lengths are reported)",
            ignore_eos=False, min_tokens=False)
    elif why_eos:
        caps = caps.with_note(f"ignore_eos refused ({why_eos}); min_tokens = max_tokens enforces output "
                              "lengths instead", ignore_eos=False)
    elif why_min:
        caps = caps.with_note(f"min_tokens refused ({why_min}); ignore_eos alone enforces output lengths",
                              min_tokens=False)
    if target.stream:
        body = _probe_body(target, stream=True, stream_options={"include_usage": True}, max_tokens=2)
        resp = await _control(target, client, "POST", target.url, body)
        message = target.http_error(resp.status, resp.body) if resp.status >= 400 else ""
        if resp.status >= 400 and is_refusal(resp.status, message, "stream_options"):
            caps = caps.with_note(f"stream_options.include_usage refused ({message}); output tokens are "
                                  "counted from the stream", include_usage=False, usage_in_stream=False)
        elif resp.status >= 400:
            raise TargetUnreachable(f"{target.url}: a streamed request failed: {message}")
        elif not _stream_has_usage(resp.body):
            caps = caps.with_note("the server sends no usage in streams (include_usage asked); output "
                                  "tokens are counted from the stream's chunks", usage_in_stream=False)
        else:
            caps = replace(caps, usage_in_stream=True)
    return with_length_evidence(caps, honours_ignore_eos)


async def _measure_words(target: OpenAITarget, client: ControlClient, caps: Capabilities) -> Capabilities:
    """How many tokens the server counts a word of the text prompts (`ids_to_text`): the usage of
    WORDS_PROBE words less that of one word (a chat template's tokens cancel), over WORDS_PROBE - 1.
    The words are one token each in common BPE vocabularies; a character-level one counts several, and
    its prompts would be that many times the asked length. Off the 0.95-1.05 band, prompts are sent as
    length / ratio words (`words_for_tokens`), and a note says so. A server that reports no usage
    outside streams, or refuses the request, leaves prompts as they are."""
    counts = []
    for n in (1, WORDS_PROBE):
        text = ids_to_text(WORD_IDS[:n])
        fields = {"messages": [{"role": "user", "content": text}]} if target.api == "chat" else {"prompt": text}
        resp = await _control(target, client, "POST", target.url, _probe_body(target, **fields))
        usage = _usage_of(resp.body) if resp.status < 400 else None
        counted = None if usage is None else usage_count(usage.get("prompt_tokens"))
        if counted is None:
            return caps
        counts.append(counted)
    ratio = (counts[1] - counts[0]) / (WORDS_PROBE - 1)
    if ratio > 0 and not 0.95 <= ratio <= 1.05:
        return caps.with_note(
            f"the server counts {ratio:.2f} tokens a word of slobench's text prompts (measured): each prompt "
            f"is sent as its length / {ratio:.2f} words, so the server sees about the asked length "
            "(--tokenizer makes it exact)", tokens_per_word=round(ratio, 4))
    return caps


def _probe_body(target: OpenAITarget, **fields: Any) -> bytes:
    body: dict[str, Any] = {"model": target.model, "temperature": 0, "max_tokens": 1, "stream": False}
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello"
    body.update(target.extra_body)
    body.update(fields)
    return json.dumps(body).encode()


async def _control(target: OpenAITarget, client: ControlClient, method: str, url: str, body: bytes | None = None,
                   *, what: str | None = None) -> Reply:
    try:
        return await client.request(method, url, body, headers=target.control_headers())
    except TransportError as e:
        raise TargetUnreachable(target.scrub(f"{what or url}: {e}")) from None


def _usage_of(raw: bytes) -> dict[str, Any] | None:
    try:
        usage = json.loads(raw).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None


def _stream_has_usage(raw: bytes) -> bool:
    """Whether a whole streamed body holds a usage object with a non-zero count."""
    try:
        events = SSEParser().feed(raw + b"\n\n")
    except SSEDecodeError:
        return False
    for ev in events:
        try:
            obj = json.loads(ev.data)
        except ValueError:
            continue
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict) and (usage_count(usage.get("completion_tokens"))
                                        or usage_count(usage.get("prompt_tokens"))):
            return True
    return False


def _owner(raw: bytes, model: str) -> str | None:
    """The `owned_by` of `model` in a /models listing (vLLM says "vllm", SGLang "sglang")."""
    try:
        for m in json.loads(raw)["data"]:
            if str(m.get("id")) == model:
                return str(m.get("owned_by") or "") or None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def _served_models(raw: bytes) -> list[str] | None:
    try:
        data = json.loads(raw)["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return None


def _auth_hint(r: Reply) -> str:
    return " (check the API key)" if r.status in (401, 403) else ""
