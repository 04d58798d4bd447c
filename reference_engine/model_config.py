"""Model shapes (`ModelConfig`) and the bundled configs, importable without torch: the simulator sizes KV
transfers from them (`slobench.fleet.disagg`) where no model runs. `reference_engine.model` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

from reference_engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3's frequency-dependent rotary scaling (HF `rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_seq_len: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "must be a positive integer")
        if self.dim % self.n_heads:
            raise ConfigError("dim", self.dim, f"must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError("n_kv_heads", self.n_kv_heads, f"must divide n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ConfigError("dim", self.dim, "dim / n_heads must be even for rotary embeddings")
        if self.rope_theta <= 0:
            raise ConfigError("rope_theta", self.rope_theta, "must be > 0")
        if self.norm_eps <= 0:
            raise ConfigError("norm_eps", self.norm_eps, "must be > 0")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


CONFIGS: dict[str, ModelConfig] = {
    # Runs well on 2 CPU cores; vocab covers the byte tokenizer (258 ids) with room to spare.
    "tiny": ModelConfig(
        vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=2, ffn_dim=768, max_seq_len=2048
    ),
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
        rope_theta=500000.0, norm_eps=1e-5, max_seq_len=8192, tie_embeddings=True,
        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_seq_len=8192),
    ),
}


def get_config(model_config: str | ModelConfig) -> ModelConfig:
    if isinstance(model_config, ModelConfig):
        return model_config
    if model_config not in CONFIGS:
        raise ConfigError("model", model_config, f"unknown model config; known: {sorted(CONFIGS)}")
    return CONFIGS[model_config]
