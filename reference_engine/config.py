"""The engine's knobs: the ones that shape the latency cliff (KV blocks, batch limits, prefix caching)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reference_engine.errors import ConfigError


def require_positive_ints(obj: Any, names: Iterable[str]) -> None:
    """ConfigError naming the first of `obj`'s attributes `names` that is not an integer >= 1 (bools refused)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "must be an integer >= 1")


# chunked: mixed batches under one token budget, prompts cut into chunks (vLLM v1); vllm-v0: a step is whole
# prompts or decodes, never both, prompts first (vLLM before chunked prefill); vllm-v1: today's vLLM, whose
# steps are made exactly as chunked's (reference_engine.scheduler) and whose sizes left unset are vLLM's
# (`vllm_v1_defaults`, and the KV blocks from the GPU's memory), with async scheduling
SCHEDULERS = ("chunked", "vllm-v0", "vllm-v1")
VLLM_V1 = "vllm-v1"

# vLLM V1's sizes when its OpenAI server is given none (vllm/engine/arg_utils.py, EngineArgs's V1 defaults by
# usage context, vLLM 0.9-0.11): on a GPU of at least 70 GiB that is not an A100 (H100, H200, MI300X),
# max_num_batched_tokens 8192 and max_num_seqs 1024; on any other, 2048 and 256. (The offline `LLM` class
# takes 16384 / 8192 tokens; a server is what slobench measures.) gpu_memory_utilization is 0.9 either way.
VLLM_V1_LARGE_GPU_BYTES = 70 << 30
VLLM_V1_SERVER_DEFAULTS = {"large": (8192, 1024), "other": (2048, 256)}
VLLM_GPU_MEMORY_UTILIZATION = 0.9


def vllm_v1_defaults(memory_bytes: int | None, device_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM V1's server runs with on a GPU of `memory_bytes` (as the
    driver reports it) called `device_name`; an unknown GPU (None) gets the smaller pair."""
    large = memory_bytes is not None and memory_bytes >= VLLM_V1_LARGE_GPU_BYTES and "a100" not in device_name.lower()
    return VLLM_V1_SERVER_DEFAULTS["large" if large else "other"]


def vllm_v1_defaults_of(provenance: Mapping[str, Any] | None) -> tuple[int, int]:
    """`vllm_v1_defaults` on the GPU a roofline cost profile was built for (its provenance's `gpu`: name and
    the driver's memory in MiB); the smaller pair for a profile that names no GPU."""
    gpu = (provenance or {}).get("gpu")
    if not isinstance(gpu, Mapping) or not isinstance(gpu.get("memory_mib"), int | float):
        return vllm_v1_defaults(None)
    return vllm_v1_defaults(int(gpu["memory_mib"] * 2**20), str(gpu.get("name", "")))


def check_scheduler(name: Any) -> None:
    if name not in SCHEDULERS:
        raise ConfigError("scheduler", name, f"must be one of {list(SCHEDULERS)}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler and KV-cache limits. Model shape lives with the executor, not here.

    `prefix_hash_key`: key for the keyed block hash. None draws a random key per process, so the hashes of
    one server cannot be predicted (or probed) from outside; tests pass a fixed key for reproducibility.
    """

    block_size: int = 16
    num_blocks: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    prefix_hash_key: bytes | None = None
    scheduler: str = "chunked"  # SCHEDULERS: how a step's batch is made (reference_engine.scheduler)

    def __post_init__(self) -> None:
        require_positive_ints(self, ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens",
                                     "max_model_len"))
        check_scheduler(self.scheduler)
        if self.prefix_hash_key is not None and not (
            isinstance(self.prefix_hash_key, bytes) and 1 <= len(self.prefix_hash_key) <= 64
        ):
            raise ConfigError("prefix_hash_key", self.prefix_hash_key, "must be 1..64 bytes (a blake2b key)")

    @property
    def num_kv_tokens(self) -> int:
        return self.block_size * self.num_blocks


EXECUTORS = ("modeled", "torch")
ATTENTION_BACKENDS = ("sdpa", "kernels")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine, as `serve`, `run --engine`, `--simulate` and `builder.build_engine` all describe it, in
    the command line's names. None leaves a size to the builder: `kv_blocks` 2048 modeled, 1024 torch on CPU,
    from free memory on CUDA (`gpu_memory_utilization`); `max_model_len` 4096, capped by the model.
    `EngineConfig` is what the scheduler then runs with, every size settled (`num_blocks`, ...).

    `executor` "modeled" takes step times from the cost profile `profile` (no model, no torch); "torch" runs
    the model `model` (or the checkpoint `weights`) with `dtype` on `device` ("auto": CUDA when present).
    """

    model: str = "tiny"
    executor: str = "modeled"
    profile: str = "cpu-tiny"
    kv_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    device: str = "cpu"
    seed: int = 0
    weights: str | None = None
    attention_backend: str | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    scheduler: str = "chunked"

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ConfigError("executor", self.executor, "must be 'torch' or 'modeled'")
        check_scheduler(self.scheduler)
        require_positive_ints(self, ("block_size", "max_num_seqs", "max_batched_tokens"))
        require_positive_ints(self, [n for n in ("kv_blocks", "max_model_len") if getattr(self, n) is not None])
        if self.attention_backend not in (None, *ATTENTION_BACKENDS):
            raise ConfigError("attention_backend", self.attention_backend, f"must be one of {list(ATTENTION_BACKENDS)}")
        g = self.gpu_memory_utilization
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0 < g <= 1:
            raise ConfigError("gpu_memory_utilization", g, "must be a number in (0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError("seed", self.seed, "must be an integer")
        for name in ("model", "profile", "dtype", "device"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(name, getattr(self, name), "must be a string")

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any]) -> EngineSpec:
        """From a dict of the fields (a manifest's `knobs`, say): a name that is no field is refused."""
        unknown = sorted(set(knobs) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError("engine_knobs", unknown, f"unknown knobs; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**knobs)

    def to_knobs(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}
