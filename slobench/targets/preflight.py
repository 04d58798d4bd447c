"""What one OpenAI-compatible server accepts, settled with a few tiny requests before the run.

`find_model` reads `/models`; `negotiate` checks the server answers for the model (waiting for a first
answer that comes late: a model loaded on demand), reads its `max_model_len` where the listing gives it and,
with the "auto" profile, probes each extension slobench relies on (token-id prompts and which ids,
`ignore_eos`, `min_tokens`, `stream_options.include_usage`) and measures how many tokens the server counts
a word of the text prompts. Each fallback is a note (see slobench.targets.capabilities). The probes go
through a `ControlClient`, never the load's transport; a probe that cannot reach the server raises
`TargetUnreachable`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slobench.errors import TargetUnreachable
from slobench.targets.bounds import brief, json_of
from slobench.targets.capabilities import HONOURS_IGNORE_EOS, Capabilities, is_refusal, with_length_evidence
from slobench.targets.sse import SSEDecodeError, SSEParser
from slobench.targets.transport import ControlClient, Reply, TransportError, endpoint_url
from slobench.workload.prompts import DEFAULT_TOKEN_ID_RANGE, WORDS
from slobench.workload.word_fit import fit_words, probe_lengths, probe_text

if TYPE_CHECKING:
    from slobench.targets.openai import OpenAITarget

PROBE_TRIES = 3
PROBE_BACKOFF_S = 0.2
PROBE_IDS = (72, 101, 108, 108, 111)  # "Hello" in bytes: inside every vocabulary, byte-level ones included
WORDS_PROBE = len(WORDS) + 1  # the most words of the probes that measure the server's tokens a word (`_measure_words`)
SCOUT_WORDS = 9  # the probe that sizes the others within a known context
CONTEXT_ROOM = 1.5  # how many times the scout's tokens a word the longest probe leaves room for
MAX_PLAUSIBLE_TOKENS = 10_000_000  # a count above this is not a token count
# How long preflight waits for the server's first answer: a server may load its model on the first request
# (Ollama: tens of seconds). The preflight timeout applies again from the next request on.
FIRST_ANSWER_S = 300.0
# Said when the server answered but refused what preflight sent
TRY_PLAINER = " (a server that takes none of slobench's extensions: try --api chat or --server-profile generic)"


def usage_count(v: Any) -> int | None:
    """A token count from a usage object: a non-negative int (not a bool) no larger than any real request."""
    if type(v) is int and 0 <= v <= MAX_PLAUSIBLE_TOKENS:
        return v
    return None


async def find_model(target: OpenAITarget) -> str:
    """The first model the server lists at /models. A server that lists none is unreachable for this
    purpose: pass --model."""
    url = endpoint_url(target.base_url, "/models")
    async with ControlClient(timeout_s=target.timeouts.preflight_s, max_body_bytes=target.max_body_bytes) as client:
        r = await _control(target, client, "GET", url, what=f"GET {url}")
    if r.status != 200:
        raise TargetUnreachable(f"GET {url}: HTTP {r.status}; pass --model NAME")
    served = _served_models(r.body)
    if not served:
        raise TargetUnreachable(f"GET {url}: no model listed{_unparsable(r.body)}; pass --model NAME")
    return served[0]


async def negotiate(target: OpenAITarget) -> tuple[Capabilities, str]:
    """Check the server answers for `target.model` and settle what it accepts: the capabilities, and a
    one-line description of what answered.

    `/models` is advisory: a listing that names other models only is an error (a typo in --model), but
    a missing, failing or empty one is a note, and one tiny request decides. Then, with the "auto"
    profile, one probe per extension; a fixed profile probes none.
    """
    model = target.model
    url = endpoint_url(target.base_url, "/models")
    notes: list[str] = []
    async with ControlClient(timeout_s=target.timeouts.preflight_s, max_body_bytes=target.max_body_bytes) as client:
        r = await _control(target, client, "GET", url)
        served = _served_models(r.body) if r.status < 400 else None
        entry = _listing_entry(r.body, model) if served else {}
        owner = str(entry.get("owned_by") or "") or None
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
        max_len = usage_count(entry.get("max_model_len"))  # vLLM and SGLang list it
        if max_len:
            caps = replace(caps, max_model_len=max_len)
        if caps.probed and target.exact_text is None and (target.api != "completions" or not caps.token_prompts):
            caps = await _measure_words(target, client, caps)
    if served:
        return caps, f"{model} served at {target.base_url}"
    return caps, f"{model} answers at {target.url}"


async def _probe_extensions(target: OpenAITarget, client: ControlClient, notes: list[str], *,
                            honours_ignore_eos: bool) -> Capabilities:
    """The plainest request first (it must succeed), then, with the "auto" profile, one probe per extension."""
    caps = target.caps
    is_chat = target.api != "completions"  # (chat, responses: text prompts, a template)
    r = await _first_answer(target)
    for attempt in range(PROBE_TRIES - 1):  # a transient 5xx is tried again; a 4xx is an answer
        if r.status < 500:
            break
        await asyncio.sleep(PROBE_BACKOFF_S * (attempt + 1))
        r = await _control(target, client, "POST", target.url, _probe_body(target))
    if r.status >= 400:
        raise TargetUnreachable(
            f"{target.url}: the server refused the plainest request (text prompt, max_tokens=1, none of "
            f"slobench's extensions): {target.http_error(r.status, r.body)}{_auth_hint(r) or TRY_PLAINER}"
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
    vocab = target.exact_text.vocab_size if target.exact_text is not None else None
    if caps.profile != "auto":
        if vocab and caps.token_prompts and not is_chat:  # not probed: the tokenizer's word stands
            caps = replace(caps, token_id_range=(_low_id(vocab), vocab))
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
        raise TargetUnreachable(f"{target.url}: probing {field_name} failed {PROBE_TRIES} times: "
                                f"{message}{TRY_PLAINER}")

    if not is_chat:
        caps = await _probe_token_ids(target, client, caps, vocab)
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
    if target.stream and target.api != "responses":  # (a Responses stream ends with its usage unasked)
        body = _probe_body(target, stream=True, stream_options={"include_usage": True}, max_tokens=2)
        resp = await _control(target, client, "POST", target.url, body)
        message = target.http_error(resp.status, resp.body) if resp.status >= 400 else ""
        if resp.status >= 400 and is_refusal(resp.status, message, "stream_options"):
            caps = caps.with_note(f"stream_options.include_usage refused ({message}); output tokens are "
                                  "counted from the stream", include_usage=False, usage_in_stream=False)
        elif resp.status >= 400:
            raise TargetUnreachable(f"{target.url}: a streamed request failed: {message}{TRY_PLAINER}")
        elif not _stream_has_usage(resp.body):
            caps = caps.with_note("the server sends no usage in streams (include_usage asked); output "
                                  "tokens are counted from the stream's chunks", usage_in_stream=False)
        else:
            caps = replace(caps, usage_in_stream=True)
    return with_length_evidence(caps, honours_ignore_eos)


async def _probe_token_ids(target: OpenAITarget, client: ControlClient, caps: Capabilities,
                           vocab: int | None) -> Capabilities:
    """Whether the server takes token-id prompts, and which ids. Any failed answer to ids (a refusal, a bare
    500, an error event) after a plain text request succeeded means text prompts. Then the top id of the
    range the prompts will use (the workload's `token_ids`, `TargetOptions.token_ids`; the --tokenizer's
    vocabulary's when given, ids past it being mapped below it) is tried; a server that
    refuses it has a smaller vocabulary, whose end is found by bisection, and prompt ids are mapped below it
    (`Capabilities.token_id_range`), so the load sends only ids the server has accepted."""
    # The first probe's ids are in every vocabulary, byte-level ones included: it asks whether the server
    # takes ids at all (falling back to text for a small vocabulary would send a byte-level model's 32-token
    # prompts as ~150-token ones).
    why = await _ids_fail(target, client, PROBE_IDS, tries=PROBE_TRIES)
    if why:
        return caps.with_note(f"token-id prompts failed ({why}); prompts sent as text (the server's usage "
                              "counts their tokens)", token_prompts=False)
    hi = vocab or (target.options.token_ids or DEFAULT_TOKEN_ID_RANGE)[1]
    why = await _ids_fail(target, client, (hi - 1,))
    if not why:
        return replace(caps, token_id_range=(_low_id(hi), hi)) if vocab else caps
    ok, bad = max(PROBE_IDS), hi - 1
    while bad - ok > 1:
        mid = (ok + bad) // 2
        if await _ids_fail(target, client, (mid,)):
            bad = mid
        else:
            ok = mid
    lo = _low_id(ok + 1)
    return caps.with_note(
        f"token id {hi - 1} refused ({why}); the server takes ids up to {ok} (probed): prompt ids are mapped "
        f"into [{lo}, {ok + 1}) (--tokenizer with the model's tokenizer.json bounds them by its vocabulary)",
        token_id_range=(lo, ok + 1))


def _low_id(hi: int) -> int:
    """The lowest id prompts use below a vocabulary end `hi`: the workloads' usual low end, clear of special
    and control tokens, unless the vocabulary is small."""
    lo = DEFAULT_TOKEN_ID_RANGE[0]
    return lo if hi >= 2 * lo else hi // 4


async def _ids_fail(target: OpenAITarget, client: ControlClient, ids: tuple[int, ...], *, tries: int = 1) -> str | None:
    """What went wrong with a token-id prompt of `ids` (an error status, or an error in a 200 answer or
    stream, a connection dropped in answer), or None when it was answered. A 5xx, a 429 or a dropped
    connection is tried again, up to `tries` times in all."""
    why = None
    for attempt in range(tries):
        body = _probe_body(target, prompt=list(ids), stream=target.stream)
        try:
            resp = await _control(target, client, "POST", target.url, body)
        except TargetUnreachable as e:  # the connection dropped in answer to ids: a failure, as a bare 500 is
            why = str(e)
        else:
            if resp.status >= 400:
                why = target.http_error(resp.status, resp.body)
            else:
                error = _error_in(resp.body)
                return None if error is None else target.scrub(error)
            if resp.status < 500 and resp.status != 429:  # an answer; a failing or busy server is tried again
                break
        if attempt < tries - 1:
            await asyncio.sleep(PROBE_BACKOFF_S * (attempt + 1))
    return why


async def _first_answer(target: OpenAITarget) -> Reply:
    """The plainest request, waited for up to FIRST_ANSWER_S, and said on screen when it takes longer than
    the preflight timeout."""
    async with ControlClient(timeout_s=max(FIRST_ANSWER_S, target.timeouts.preflight_s),
                             max_body_bytes=target.max_body_bytes) as patient:
        answer = asyncio.ensure_future(_control(target, patient, "POST", target.url, _probe_body(target)))
        try:
            return await asyncio.wait_for(asyncio.shield(answer), target.timeouts.preflight_s)
        except TimeoutError:
            print(f"slobench: waiting for the server's first answer (up to {FIRST_ANSWER_S:.0f} s: a server may "
                  "load its model on the first request)…", file=sys.stderr, flush=True)
            return await answer
        finally:
            answer.cancel()  # a no-op once answered; else the request goes with the caller


async def _measure_words(target: OpenAITarget, client: ControlClient, caps: Capabilities) -> Capabilities:
    """How many tokens the server counts for a text prompt on the API the run uses: `word_fit.fit_words` over
    the usage of probe texts of 1 word up to every word of `prompts.WORDS` (fewer within a short context
    `max_model_len`, where a character-level vocabulary's words would not fit), each a prefix of the next.
    The longest less the shortest, over their words, is the tokens a word (`tokens_per_word`); the shortest
    less its words is what the server adds to every prompt (`template_overhead`: a chat template's role
    markers and preamble, a BOS token), counted once; the groups of words between probes give the words'
    spread (`tokens_per_word_sd`), from which a prompt's margin below the context is derived. Prompts are
    then sent as (length - overhead) / tokens-a-word words (`text.sized_text`), so the server counts about
    the asked length. A server that reports no usage outside streams, or refuses a probe, leaves prompts as
    they are."""
    async def count(num_words: int) -> int | None:
        text = probe_text(num_words)
        fields: dict[str, Any] = {}
        target.codec.put_prompt(fields, text)
        resp = await _control(target, client, "POST", target.url, _probe_body(target, **fields))
        usage = _usage_of(resp.body) if resp.status < 400 else None
        return None if usage is None else usage_count(usage.get("prompt_tokens"))

    # a scout of SCOUT_WORDS words sizes the longest probe to fit a known context (a byte-level vocabulary
    # counts ~5 tokens a word), with room for its words to count more than the scout's did
    first, scout = await count(1), await count(SCOUT_WORDS)
    if first is None or scout is None or scout <= first:
        return caps
    max_words = WORDS_PROBE
    if caps.max_model_len is not None:
        max_words = int((caps.max_model_len - 1 - first) / (CONTEXT_ROOM * (scout - first) / (SCOUT_WORDS - 1)))
    lengths = probe_lengths(max_words)
    counts = [first]
    for n in lengths[1:]:
        counted = await count(n)
        if counted is None:
            return caps
        counts.append(counted)
    try:
        fit = fit_words(lengths, counts)
    except ValueError:  # counts that do not grow with the words: not a count of these prompts
        return caps
    overhead = fit.overhead_tokens
    caps = replace(caps, tokens_per_word=round(fit.tokens_per_word, 4), template_overhead=overhead,
                   tokens_per_word_sd=round(fit.sd_per_word, 4), probe_words=fit.probe_words)
    if not 0.95 <= fit.tokens_per_word <= 1.05 or overhead:
        what = f"the {target.api} API adds {overhead} tokens to every prompt and " if overhead else ""
        caps = caps.with_note(
            f"{what}the server counts {fit.tokens_per_word:.2f} tokens a word of slobench's text prompts "
            f"(measured): each prompt is sent as (length - {overhead}) / {fit.tokens_per_word:.2f} words, so the "
            "server sees about the asked length (--tokenizer makes it exact)")
    return caps


def _probe_body(target: OpenAITarget, **fields: Any) -> bytes:
    body: dict[str, Any] = {"model": target.model, "temperature": 0, target.codec.MAX_TOKENS_FIELD: 1, "stream": False}
    target.codec.put_prompt(body, "Hello")
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
        usage = json_of(raw).get("usage")
    except (ValueError, AttributeError):
        return None
    if isinstance(usage, dict) and "input_tokens" in usage and "prompt_tokens" not in usage:  # a Responses usage
        usage = {**usage, "prompt_tokens": usage["input_tokens"], "completion_tokens": usage.get("output_tokens")}
    return usage if isinstance(usage, dict) else None


def _stream_has_usage(raw: bytes) -> bool:
    """Whether a whole streamed body holds a usage object with a non-zero count."""
    try:
        events = SSEParser().feed(raw + b"\n\n")
    except SSEDecodeError:
        return False
    for ev in events:
        try:
            obj = json_of(ev.data)
        except ValueError:
            continue
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if isinstance(usage, dict) and (usage_count(usage.get("completion_tokens"))
                                        or usage_count(usage.get("prompt_tokens"))):
            return True
    return False


def _error_in(raw: bytes) -> str | None:
    """The server's message when a 200 answer holds an error: a JSON error body, or an SSE error event."""
    try:
        objs = [json_of(raw)]
    except ValueError:
        try:
            objs = [json_of(ev.data) for ev in SSEParser().feed(raw + b"\n\n") if ev.data != "[DONE]"]
        except (SSEDecodeError, ValueError):
            return None
    for obj in objs:
        if isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error"):
            err = obj.get("error")
            message = err.get("message") if isinstance(err, dict) else err or obj.get("message")
            return brief(message or "an error in the answer")
    return None


def _listing_entry(raw: bytes, model: str) -> dict[str, Any]:
    """The entry of `model` in a /models listing (its `owned_by`: vLLM says "vllm", SGLang "sglang"; its
    `max_model_len`, where vLLM and SGLang give it), or {}."""
    try:
        for m in json_of(raw)["data"]:
            if isinstance(m, dict) and brief(m.get("id")) == model:
                return m
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {}


def _served_models(raw: bytes) -> list[str] | None:
    try:
        data = json_of(raw)["data"]
        return [brief(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return None


def _unparsable(raw: bytes) -> str:
    """Why a listing is no JSON at all, where the reason is worth saying (its nesting), else ""."""
    try:
        json_of(raw)
    except ValueError as e:
        return f" ({e})" if "nested deeper" in str(e) else ""
    return ""


def _auth_hint(r: Reply) -> str:
    return " (check the API key)" if r.status in (401, 403) else ""
