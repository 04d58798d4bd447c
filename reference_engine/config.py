"""The engine's knobs: the ones that shape the latency cliff (KV blocks, batch limits, prefix caching)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reference_engine.errors import ConfigError


def require_positive_ints(obj: Any, names: Iterable[str]) -> None:
    """ConfigError naming the first of `obj`'s attributes `names` that is not an integer >= 1 (bools refused)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "must be an integer >= 1")


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

    def __post_init__(self) -> None:
        require_positive_ints(self, ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens",
                                     "max_model_len"))
        if self.prefix_hash_key is not None and not (
            isinstance(self.prefix_hash_key, bytes) and 1 <= len(self.prefix_hash_key) <= 64
        ):
            raise ConfigError("prefix_hash_key", self.prefix_hash_key, "must be 1..64 bytes (a blake2b key)")

    @property
    def num_kv_tokens(self) -> int:
        return self.block_size * self.num_blocks
