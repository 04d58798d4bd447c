"""An executor with no model: each step takes the time a cost model gives for the step's composition.

    step_s = a + b * prefill_tokens + c * decode_seqs + d * context_tokens
             + max(k * (prefill_tokens + decode_seqs), w)          # dense layers: compute or weights read
             + max(f * attention_pairs, v * context_tokens)        # attention: FLOPs or KV read
             + h + g * (decode_seqs + first_tokens)                # host work of the serving loop

The two max() terms are a roofline (slobench.profiles.roofline fills them from a GPU spec and a model
config); they are zero in a fitted linear profile, which then reads as the first line alone. A profile with
`phases` (reference_engine.executor.phase_fit: DistServe's per-phase fits) takes its step times from those
instead. The host terms h and g (`host_step_s`, `host_per_seq_s`) are added to every form; 0 unless calibrated
from measured requests.

It lets the real scheduler and block manager run at GPU-like speed on any machine (the engine waits until
step start + step_s on its clock). Sampled tokens are deterministic pseudo-random ids from (seq_id, position),
so runs repeat exactly; EOS is never produced unless `eos_probability` > 0, nor before a request's min_tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceABC
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.config import VLLM_V1
from reference_engine.errors import ConfigError
from reference_engine.executor.base import StepBatch, StepResult
from reference_engine.executor.phase_fit import PhaseFit, read_distserve
from reference_engine.splitmix import splitmix64, splitmix64_array

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
# Profiles built by a function rather than read from a file, by name prefix: slobench.profiles registers
# "roofline:" (a GPU spec and a model config). The engine imports nothing from slobench: whoever offers
# such profiles registers them here before a name reaches `CostProfile.load`.
PROFILE_BUILDERS: dict[str, Callable[[str], CostProfile]] = {}
_COEFFICIENTS = ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s",
                 "compute_per_token_s", "weights_read_s", "attention_per_pair_s", "kv_read_per_context_token_s",
                 "per_request_s")


@dataclass(frozen=True, slots=True)
class CostProfile:
    name: str
    step_overhead_s: float  # a: fixed cost of a step (weights read once, launch and Python overhead)
    per_prefill_token_s: float  # b: compute per prompt token
    per_decode_seq_s: float  # c: per decoding sequence (sampling, its share of the batch)
    per_context_token_s: float  # d: attention reads of the KV of every token in context
    note: str = ""
    # the roofline terms (0 in a linear profile): a step is bound by compute or by memory, not their sum
    compute_per_token_s: float = 0.0  # k: dense FLOPs of one token at the effective peak
    weights_read_s: float = 0.0  # w: all weights read once at the effective bandwidth
    attention_per_pair_s: float = 0.0  # f: attention FLOPs of one (query, key) pair
    kv_read_per_context_token_s: float = 0.0  # v: one token's K and V read, all layers
    # r: a request's own work inside the server (tokenizing, setting up its sampling), charged to the step
    # that samples its first token; 0 unless a refinement fits it (slobench.profiles.refine, fit_inside)
    per_request_s: float = 0.0
    # host work of the serving loop around the forward pass (scheduling, sampling, detokenising, RPC to the
    # workers), added to every step whatever form the rest takes (phases included): a fixed cost a step and a
    # cost per sequence that samples a token in it (decodes and first tokens); 0 unless calibrated from
    # measured requests (slobench.profiles.from_runs)
    host_step_s: float = 0.0
    host_per_seq_s: float = 0.0
    # where the numbers come from (written to JSON, not used in the model)
    provenance: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    # per-phase fits (prefill and decode formulas) that replace the terms above when given
    phases: PhaseFit | None = None
    # the engine overlaps the host work of one step with the next step's forward pass (vLLM's async
    # scheduling, the vllm-v1 policy): a step costs max(forward, host terms), not their sum (`overlapped_step_s`)
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for name in (*_COEFFICIENTS, "host_step_s", "host_per_seq_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigError(name, value, "must be a number >= 0 (seconds)")
        if not isinstance(self.async_scheduling, bool):
            raise ConfigError("async_scheduling", self.async_scheduling, "must be true or false")

    @property
    def is_roofline(self) -> bool:
        return bool(self.compute_per_token_s or self.weights_read_s or self.attention_per_pair_s
                    or self.kv_read_per_context_token_s)

    @property
    def uses_pairs(self) -> bool:
        """Whether a step's time depends on its attention pairs (else the context tokens stand for them)."""
        return self.phases is not None or self.is_roofline

    def step_s(
        self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
        num_attention_pairs: int | None = None, num_first_tokens: int = 0,
    ) -> float:
        """`num_attention_pairs` counts (query, key) pairs: a chunk of n tokens after `start` cached ones has
        n*start + n*(n+1)/2; a decode token has its context. None: the context tokens (exact for a step of
        decodes only).
        `num_first_tokens`: requests sampling their first token in the step (each costs `per_request_s`)."""
        if self.host_step_s or self.host_per_seq_s:
            return overlapped_step_s(
                self._device_step_s(num_prefill_tokens, num_decode_seqs, num_context_tokens, num_attention_pairs,
                                    num_first_tokens),
                self.host_step_s + self.host_per_seq_s * (num_decode_seqs + num_first_tokens),
                async_scheduling=self.async_scheduling)
        return self._device_step_s(num_prefill_tokens, num_decode_seqs, num_context_tokens, num_attention_pairs,
                                   num_first_tokens)

    def _device_step_s(self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int,
                       num_attention_pairs: int | None, num_first_tokens: int) -> float:
        if self.phases is not None:
            return (self.phases.step_s(num_prefill_tokens, num_decode_seqs, num_context_tokens, num_attention_pairs)
                    + self.per_request_s * num_first_tokens)
        t = (
            self.step_overhead_s
            + self.per_prefill_token_s * num_prefill_tokens
            + self.per_decode_seq_s * num_decode_seqs
            + self.per_context_token_s * num_context_tokens
        )
        if self.per_request_s and num_first_tokens:
            t += self.per_request_s * num_first_tokens
        if not self.is_roofline:
            return t
        pairs = num_context_tokens if num_attention_pairs is None else num_attention_pairs
        return (
            t
            + max(self.compute_per_token_s * (num_prefill_tokens + num_decode_seqs), self.weights_read_s)
            + max(self.attention_per_pair_s * pairs, self.kv_read_per_context_token_s * num_context_tokens)
        )

    def scaled(self, factor: float) -> CostProfile:
        """Every coefficient times `factor` (a slower or faster device of the same shape)."""
        return replace(self, **{k: getattr(self, k) * factor for k in _COEFFICIENTS},
                       phases=None if self.phases is None else self.phases.scaled(factor))

    def with_prefill_scale(self, factor: float) -> CostProfile:
        """A prompt's price per token times `factor`, its step's fixed cost as it was: a phase fit's prefill
        token and squared-token terms, a linear profile's per prompt token, a roofline's compute terms (dense
        FLOPs a token and attention a pair: what bounds a prefill; a decode step is bound by its reads)."""
        if not 0 < factor < math.inf:
            raise ConfigError("prefill scale", factor, "must be a number > 0")
        if factor == 1:
            return self
        phases = self.phases
        if phases is not None:
            a, b, c = phases.prefill
            phases = replace(phases, prefill=(a, b * factor, c * factor))
        return replace(self, per_prefill_token_s=self.per_prefill_token_s * factor,
                       compute_per_token_s=self.compute_per_token_s * factor,
                       attention_per_pair_s=self.attention_per_pair_s * factor, phases=phases)

    def with_host_costs(self, step_s: float, per_seq_s: float) -> CostProfile:
        """The serving loop's host work set to `step_s` a step plus `per_seq_s` per sequence sampling a token."""
        return replace(self, host_step_s=step_s, host_per_seq_s=per_seq_s)

    def with_step_overhead(self, extra_s: float) -> CostProfile:
        """Every step `extra_s` longer: a fixed host cost (scheduling, sampling, streaming) the profile lacks."""
        if not extra_s:
            return self
        return replace(self, step_overhead_s=self.step_overhead_s + extra_s,
                       phases=None if self.phases is None else self.phases.with_step_overhead(extra_s))

    def under_policy(self, scheduler: str) -> CostProfile:
        """The profile as an engine with scheduling policy `scheduler` runs it: vllm-v1 schedules
        asynchronously (its host work hidden behind the forward pass), the others do not."""
        is_async = scheduler == VLLM_V1
        return self if is_async == self.async_scheduling else replace(self, async_scheduling=is_async)

    @classmethod
    def load(cls, name_or_path: str | Path) -> CostProfile:
        """A bundled profile by name (`h100-llama-1b`, `cpu-tiny`), a JSON file by path, or DistServe's fit of a
        model at a TP degree from its profiler file: `distserve:PATH@MODEL/tpN`."""
        if isinstance(name_or_path, str) and name_or_path.startswith("distserve:"):
            return cls.from_distserve(name_or_path)
        if isinstance(name_or_path, str) and ":" in name_or_path:
            prefix = name_or_path.split(":", 1)[0] + ":"
            if prefix in PROFILE_BUILDERS:
                return PROFILE_BUILDERS[prefix](name_or_path)
            if prefix == "roofline:":
                raise ConfigError("profile", name_or_path, "roofline profiles are built by slobench.profiles: run "
                                  "through slobench, or write one with `slobench profile -o FILE` and pass the file")
        path = Path(name_or_path)
        if not path.suffix:
            path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.is_file():
            known = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
            raise ConfigError("profile", str(name_or_path), f"no such profile file; bundled ones: {known}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ConfigError("profile", str(path), f"not a readable JSON profile ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError("profile", str(path), "must hold a JSON object of coefficients")
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        fields.setdefault("name", path.stem)
        if "phases" in raw:
            fields["phases"] = PhaseFit.from_dict(raw["phases"])
            for k in ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
                fields.setdefault(k, 0.0)
        try:
            return cls(**fields)
        except TypeError as e:
            raise ConfigError("profile", str(path), f"missing coefficients: {e}") from e

    @classmethod
    def from_distserve(cls, spec: str) -> CostProfile:
        """`distserve:PATH@MODEL/tpN`: the per-phase fit of MODEL on N GPUs from a DistServe profiler file."""
        body = spec.removeprefix("distserve:")
        path, _, rest = body.rpartition("@")
        model, _, tp_text = rest.rpartition("/")
        if not path or not model or not tp_text.startswith("tp") or not (tp_text[2:].isascii() and tp_text[2:].isdigit()):
            raise ConfigError("profile", spec, "a DistServe fit is distserve:PATH@MODEL/tpN, e.g. "
                                               "distserve:profiler-a100-80g.vllm.json@facebook/opt-13b/tp1")
        tp = int(tp_text[2:])
        fit = read_distserve(path, model, tp)
        return cls(f"distserve-{model.rsplit('/', 1)[-1]}-tp{tp}", 0.0, 0.0, 0.0, 0.0,
                   note=f"DistServe's per-phase step-time fit for {model} at TP {tp} ({Path(path).name})",
                   phases=fit, provenance={"kind": "distserve-fit", "file": str(path), "model": model, "tp": tp})

    def to_json(self) -> str:
        doc = asdict(self)
        for k in ("compute_per_token_s", "weights_read_s", "attention_per_pair_s", "kv_read_per_context_token_s",
                  "per_request_s", "host_step_s", "host_per_seq_s"):
            if not doc[k]:
                del doc[k]  # a linear profile's JSON stays as it was
        if doc["provenance"] is None:
            del doc["provenance"]
        if self.phases is None:
            del doc["phases"]
        else:
            doc["phases"] = self.phases.to_dict()
        if not self.async_scheduling:
            del doc["async_scheduling"]
        return json.dumps(doc, indent=2)

    @classmethod
    def fit(cls, name: str, samples: Iterable[tuple[float, int, int, int]]) -> CostProfile:
        """Least-squares fit from measured steps: (step_s, prefill_tokens, decode_seqs, context_tokens).

        Calibrate by timing real steps (e.g. the torch executor with the device synchronised) over a mix of
        batch sizes, prompt chunks and context lengths; negative coefficients are clipped to zero.
        """
        rows = np.asarray(list(samples), dtype=float)
        if rows.ndim != 2 or rows.shape[0] < 4 or rows.shape[1] != 4:
            raise ConfigError("samples", rows.shape, "need at least 4 rows of (step_s, prefill, decode, context)")
        design = np.column_stack([np.ones(len(rows)), rows[:, 1:]])
        coef, *_ = np.linalg.lstsq(design, rows[:, 0], rcond=None)
        a, b, c, d = (max(float(x), 0.0) for x in coef)
        return cls(name, a, b, c, d, note=f"fitted by least squares on {len(rows)} measured steps")


_head = lru_cache(maxsize=1 << 14)(splitmix64)  # a sequence's first hash, the same for each of its tokens
_S32 = np.uint64(32)


class ModeledExecutor:
    def __init__(
        self,
        profile: CostProfile,
        *,
        block_size: int,
        num_blocks: int,
        vocab_size: int = 32000,
        eos_token_id: int | None = None,
        eos_probability: float = 0.0,
        token_id_range: tuple[int, int] | None = None,
        seed: int = 0,
    ) -> None:
        """`token_id_range` (lo, hi): sample ids in [lo, hi) only, e.g. a byte tokenizer's printable ASCII,
        so that every streamed token is visible text."""
        if not 0.0 <= eos_probability <= 1.0:
            raise ConfigError("eos_probability", eos_probability, "must be in [0, 1]")
        if eos_probability > 0 and eos_token_id is None:
            raise ConfigError("eos_token_id", None, "is needed when eos_probability > 0")
        lo, hi = token_id_range if token_id_range is not None else (0, vocab_size)
        if not 0 <= lo < hi <= vocab_size:
            raise ConfigError("token_id_range", token_id_range, f"must satisfy 0 <= lo < hi <= {vocab_size}")
        self.profile = profile
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._eos_threshold = int(eos_probability * (1 << 32))
        self._lo, self._span = lo, hi - lo
        self._seed = seed
        self.num_steps = 0
        self.total_modeled_s = 0.0

    @property
    def samples_eos(self) -> bool:
        """Whether a draw can be EOS (`eos_probability` > 0)."""
        return bool(self._eos_threshold)

    @property
    def token_id_range(self) -> tuple[int, int]:
        """(lo, hi): sampled ids lie in [lo, hi)."""
        return self._lo, self._lo + self._span

    def token_at(self, seq_id: int, position: int, *, allow_eos: bool = True) -> int:
        """The token sampled after `position` tokens of sequence `seq_id` (a pure function). With
        `allow_eos` False (a request short of its min_tokens) the draw that would be EOS gives the id the
        draw maps to otherwise, as if EOS were masked out."""
        r = splitmix64(splitmix64(seq_id ^ (self._seed << 32)) ^ position)
        if allow_eos and self._eos_threshold and (r & 0xFFFFFFFF) < self._eos_threshold:
            return self.eos_token_id  # type: ignore[return-value]
        token = self._lo + (r >> 32) % self._span
        if token == self.eos_token_id:
            token = self._lo + (token - self._lo + 1) % self._span
        return token

    def tokens_at(self, seq_ids: SequenceABC[int], starts: SequenceABC[int], ends: SequenceABC[int]) -> list[list[int]]:
        """`token_at(seq_ids[i], p)` for p from `starts[i]` up to `ends[i]`, for every i, in one vectorised
        pass (EOS never drawn: for a caller that has checked `samples_eos` is False)."""
        lens = [e - n for n, e in zip(starts, ends, strict=True)]
        seed = self._seed << 32
        heads = np.repeat(np.array([_head(sid ^ seed) for sid in seq_ids], dtype=np.uint64), lens)
        offsets = np.cumsum([0, *lens[:-1]], dtype=np.int64)
        pos = np.arange(len(heads), dtype=np.int64) + np.repeat(np.array(starts, dtype=np.int64) - offsets, lens)
        r = splitmix64_array(heads ^ pos.astype(np.uint64))
        lo, span = np.uint64(self._lo), np.uint64(self._span)
        tok = lo + (r >> _S32) % span
        if self.eos_token_id is not None and self._lo <= self.eos_token_id < self._lo + self._span:
            eos = np.uint64(self.eos_token_id)
            tok = np.where(tok == eos, lo + (tok - lo + np.uint64(1)) % span, tok)
        flat: list[int] = tok.tolist()
        return [flat[o : o + n] for o, n in zip(offsets.tolist(), lens, strict=True)]

    def execute(self, batch: StepBatch) -> StepResult:
        prefill, decode, context, pairs, firsts = batch.features()
        tokens: list[int | None] = [
            self.token_at(c.seq_id, c.start_pos + len(c.token_ids), allow_eos=c.num_generated >= c.sampling.min_tokens)
            if c.sample else None for c in batch.chunks]
        # the linear model reads context tokens where a roofline one reads pairs
        step_s = self.profile.step_s(prefill, decode, context, pairs if self.profile.uses_pairs else None, firsts)
        self.num_steps += 1
        self.total_modeled_s += step_s
        return StepResult(tokens, modeled_s=step_s)


def overlapped_step_s(forward_s: float, host_s: float, *, async_scheduling: bool) -> float:
    """A step's wall time from its forward pass (`forward_s`, the GPU's) and the serving loop's host work
    (`host_s`: scheduling, sampling, detokenising, RPC to the workers). Synchronous, the GPU waits for the
    host and the host for the GPU: the sum. With async scheduling (vLLM's --async-scheduling, the vllm-v1
    policy) the host work of step n runs while the GPU runs step n+1's forward pass: a step costs the
    longer of the two, the host's cost hidden until it exceeds the forward pass."""
    if forward_s < 0 or host_s < 0:
        raise ConfigError("step_s", (forward_s, host_s), "forward and host times must be >= 0 (seconds)")
    return max(forward_s, host_s) if async_scheduling else forward_s + host_s
