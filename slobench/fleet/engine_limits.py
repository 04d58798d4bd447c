"""A simulated run's requests shaped and bounded as a live run's are, by what the engine itself says.

A live run learns at preflight how the server counts slobench's text prompts and how long its context is,
then bounds each request (`workload.limits.ServerLimits.bound`: prompt + output within `max_model_len`, the
prompt's end cut first) and sends a text prompt as the words the server counts as the asked length
(`workload.text.sized_text`). A simulated run knows both without asking: the engine's `max_model_len`, and
its count of a text prompt, fitted from the same probe texts (`workload.word_fit.fit_counter`) through the
request parser the run uses (the chat template included). So `--simulate` and a live run of the bundled
engine shorten the same requests, where the simulator used to refuse them as too long.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slobench.run.records import RequestSpec
from slobench.targets.options import Api
from slobench.workload.limits import BoundedSpecs, ServerLimits
from slobench.workload.text import sized_text
from slobench.workload.word_fit import WordFit, fit_counter


class EngineLimits:
    """`bound(spec)`: the request as a live run would send it to an engine of context `max_model_len` whose
    parse is `parse` (`replica.request_parser`'s); `num_shortened` counts those cut to fit. Text prompts on
    the chat API are sized by the parse's count (a live run fits it at preflight only there)."""

    def __init__(self, max_model_len: int, parse: Any, api: Api) -> None:
        self.word_fit: WordFit | None = None
        if api == "chat":
            def count(text: str) -> int:
                return len(parse(RequestSpec(0, 0.0, text, 1, 1)).prompt_token_ids)

            self.word_fit = fit_counter(count)
        limits = ServerLimits(max_model_len=max_model_len, as_text=api == "chat", word_fit=self.word_fit,
                              template_overhead=0 if self.word_fit is None else self.word_fit.overhead_tokens)
        self.limits = limits
        self._bounded = BoundedSpecs((), limits)

    @property
    def num_shortened(self) -> int:
        return self._bounded.num_shortened

    def bound(self, spec: RequestSpec) -> RequestSpec:
        spec = self._bounded.bound(spec)
        fit = self.word_fit
        if fit is not None and type(spec.prompt) is str:
            spec = replace(spec, prompt=sized_text(spec.prompt, fit.tokens_per_word, fit.overhead_tokens))
        return spec
