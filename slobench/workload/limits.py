"""A workload held within what one server takes: token ids it has accepted, prompt + output within its context.

Both are applied to each request before it is sent, deterministically, so a seed still names one workload:
an id at or past the end of the accepted range is mapped into it (the same id always to the same id, so
shared prefixes stay shared), and a request longer than the server's `max_model_len` has its prompt cut at
the end (down to half the context), then its output. `BoundedSpecs.num_shortened` counts the latter. A
live run bounds by what preflight learnt; a simulated one by its engine's context (slobench.fleet.simulate).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from slobench.run.records import RequestSpec
from slobench.workload.word_fit import WordFit

# Tokens a text prompt keeps free of the context when how the server counts its words was not measured (a
# fixed server profile, or --tokenizer, whose count is exact but for the chat template's): a cut to the last
# token would still be refused.
TEXT_MARGIN_TOKENS = 16
TEXT_MARGIN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """`id_range`: the half-open range of ids the server takes (None: any the workload draws);
    `max_model_len`: its context, prompt + output (None: unknown); `as_text`: whether prompts reach it as text
    (chat, or a server that takes no ids), whose token counts are the server's; `template_overhead`: the
    prompt tokens a chat template adds to them; `word_fit`: how the server counts a text prompt's words,
    measured (the text is then sized to the asked count, and the margin below the context derived from how
    much words differ: `WordFit.margin_tokens`)."""

    id_range: tuple[int, int] | None = None
    max_model_len: int | None = None
    as_text: bool = False
    template_overhead: int = 0
    word_fit: WordFit | None = None

    @property
    def binds(self) -> bool:
        return self.id_range is not None or self.max_model_len is not None

    def text_margin_tokens(self, num_tokens: int) -> int:
        """Tokens a text prompt asked as `num_tokens` keeps free below the context."""
        if self.word_fit is not None:
            return self.word_fit.margin_tokens(num_tokens)
        assert self.max_model_len is not None
        return self.template_overhead + TEXT_MARGIN_TOKENS + int(TEXT_MARGIN_SHARE * self.max_model_len)

    def bound(self, spec: RequestSpec) -> RequestSpec:
        """`spec` within these limits (itself when it is already): ids mapped into `id_range`; prompt +
        output within `max_model_len`, less a text prompt's margin, by the prompt's end first (down to half
        the context: a client keeps the answer's room and trims the conversation's history, and the output
        lengths asked are what a decode benchmark measures), then the output."""
        prompt = spec.prompt
        id_range = self.id_range
        if id_range is not None and type(prompt) is tuple:
            lo, hi = id_range
            if prompt and max(prompt) >= hi:
                span = hi - lo
                prompt = tuple(t if t < hi else lo + (t - lo) % span for t in prompt)
        n, m = spec.input_tokens, spec.max_tokens
        max_len = self.max_model_len
        if max_len is not None and (self.as_text or type(prompt) is str):
            max_len = max(2, max_len - self.text_margin_tokens(min(n, max_len)))
        if max_len is not None and n + m > max_len:
            n = min(n, max(max_len - m, min(n, max_len // 2), 1))
            m = max(1, min(m, max_len - n))
            if type(prompt) is tuple:
                prompt = prompt[:n]
            else:
                prompt = " ".join(str(prompt).split()[:n])
        if prompt is spec.prompt and n == spec.input_tokens and m == spec.max_tokens:
            return spec
        min_tokens = None if spec.min_tokens is None else min(spec.min_tokens, m)
        return replace(spec, prompt=prompt, input_tokens=n, max_tokens=m, min_tokens=min_tokens)


class BoundedSpecs:
    """`specs` within `limits` (`ServerLimits.bound`), in order: a list when `specs` is a sequence (so the
    runner still knows the count), else made as they are read. `num_shortened`: how many lost length."""

    def __init__(self, specs: Iterable[RequestSpec], limits: ServerLimits) -> None:
        self.limits = limits
        self.num_shortened = 0
        self.specs: Iterable[RequestSpec] = list(self._bound(specs)) if isinstance(specs, Sequence) else \
            self._bound(specs)

    def _bound(self, specs: Iterable[RequestSpec]) -> Iterator[RequestSpec]:
        for spec in specs:
            yield self.bound(spec)

    def bound(self, spec: RequestSpec) -> RequestSpec:
        """`ServerLimits.bound`, counted in `num_shortened` when it cut the prompt or the output."""
        bounded = self.limits.bound(spec)
        if bounded.input_tokens != spec.input_tokens or bounded.max_tokens != spec.max_tokens:
            self.num_shortened += 1
        return bounded


def shortened_note(num_shortened: int, max_model_len: int | None) -> str:
    """What a run says of the requests `ServerLimits.bound` cut, live or simulated."""
    n = num_shortened
    return (f"{n} request{'s' * (n > 1)} shortened to fit the server's max_model_len {max_model_len} (prompt + "
            "max_tokens; the prompt's end cut first, down to half of it, then the output)")
