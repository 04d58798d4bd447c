"""GPU specs and model configs that the roofline profiles are built from, each with its source.

GPU figures are the vendors' datasheet numbers for dense bf16 tensor math (not the 2x "with sparsity"
figure) and peak memory bandwidth, read from slobench/data/gpus.toml (each entry names its source and says
which figures are derived); memory is what the driver reports (an H100 80GB shows 81,559 MiB in nvidia-smi),
not the datasheet's "80GB". Any other GPU is given by the same numbers (`get_gpu`). Model shapes are the `config.json` values
published with each model on the Hugging Face hub.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_engine.model_config import CONFIGS as ENGINE_CONFIGS
from reference_engine.model_config import ModelConfig as EngineModelConfig
from slobench.errors import SpecError
from slobench.input_file import SETTINGS, read_input_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    bf16_tflops: float  # dense bf16 tensor-core peak, TFLOP/s (10^12)
    hbm_tb_s: float  # peak memory bandwidth, TB/s (10^12 bytes)
    link_gb_s: float  # GPU-to-GPU bandwidth per direction, GB/s (tensor-parallel all-reduce)
    source: str
    # device memory as its driver reports it (nvidia-smi's total, MiB): what an engine's memory utilisation
    # is a share of, and what the weights must fit in. A datasheet's "80GB" of HBM is 80 GiB (81,920 MiB on
    # an A100), 7% more than 80 x 10^9.
    memory_mib: float

    def __post_init__(self) -> None:
        for k in ("bf16_tflops", "hbm_tb_s", "link_gb_s", "memory_mib"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise SpecError(k, v, "must be a number > 0")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mib * 2**20)


# A GPU by its datasheet numbers: the names a spec is written with (`--gpu bf16_tflops=..,mem_gbs=..,..`, a spec
# file, the bundled slobench/data/gpus.toml), and the range each must lie in: past it a figure is a typo or a
# unit slip (TB/s written for GB/s, MiB for GiB), not a GPU.
GPU_KEYS = ("bf16_tflops", "mem_gbs", "mem_gib", "link_gbs")
GPU_RANGES = {"bf16_tflops": (1.0, 50_000.0), "mem_gbs": (50.0, 100_000.0), "mem_gib": (1.0, 4_096.0),
              "link_gbs": (0.1, 50_000.0)}
GPU_UNITS = {"bf16_tflops": "dense BF16 TFLOP/s", "mem_gbs": "memory bandwidth, GB/s", "mem_gib": "driver-visible "
             "memory, GiB", "link_gbs": "GPU-to-GPU bandwidth one way, GB/s"}
GPUS_FILE = Path(__file__).resolve().parent.parent / "data" / "gpus.toml"


def gpu_from_mapping(raw: dict[str, Any], where: str, *, named: bool = True) -> GpuSpec:
    """A GpuSpec from the datasheet keys (`GPU_KEYS`, plus `name` and `source` when `named`); a SpecError
    naming the key for one missing, unknown, not a number, not positive or out of its range."""
    allowed = (*GPU_KEYS, "name", "source") if named else GPU_KEYS
    unknown = [k for k in raw if k not in allowed]
    if unknown:
        raise SpecError(f"gpu {unknown[0]}", raw[unknown[0]], f"unknown key in {where}; a GPU spec has "
                                                              f"{', '.join(allowed)}")
    missing = [k for k in allowed if k not in raw]
    if missing:
        raise SpecError(f"gpu {missing[0]}", where, f"missing ({GPU_UNITS.get(missing[0], 'a string')})")
    values = {}
    for k in GPU_KEYS:
        v = raw[k]
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise SpecError(f"gpu {k}", raw[k], f"not a number ({GPU_UNITS[k]})") from None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise SpecError(f"gpu {k}", raw[k], f"must be a number > 0 ({GPU_UNITS[k]})")
        lo, hi = GPU_RANGES[k]
        if not lo <= v <= hi:
            raise SpecError(f"gpu {k}", raw[k], f"absurd for {GPU_UNITS[k]}: expected {lo:g} to {hi:g}")
        values[k] = float(v)
    name, source = (raw["name"], raw["source"]) if named else ("custom", f"given by its numbers: {where}")
    for k, v in (("name", name), ("source", source)):
        if not isinstance(v, str) or not v.strip():
            raise SpecError(f"gpu {k}", v, f"must be a non-empty string in {where}")
    mib = values["mem_gib"] * 1024
    return GpuSpec(name.lower(), values["bf16_tflops"], values["mem_gbs"] / 1000, values["link_gbs"], source,
                   int(mib) if mib.is_integer() else mib)


def gpu_from_numbers(text: str) -> GpuSpec:
    """`bf16_tflops=362,mem_gbs=864,mem_gib=44.5,link_gbs=32`: every key once, in any order."""
    raw: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise SpecError("gpu", text, f"{item!r} is not KEY=NUMBER; a GPU by its numbers is "
                                         f"{'=..,'.join(GPU_KEYS)}=..")
        if key in raw:
            raise SpecError(f"gpu {key}", text, "given twice")
        raw[key] = value
    return gpu_from_mapping(raw, text, named=False)


def gpu_from_file(path: str | Path) -> GpuSpec:
    """One GPU from a TOML or JSON file holding `name`, `source` and the datasheet keys at its top level."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        raw = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecError("gpu", str(p), f"cannot read it as a {p.suffix.lstrip('.').upper() or 'TOML'} GPU spec: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError("gpu", str(p), "must hold one object of name, source and the datasheet keys")
    return gpu_from_mapping(raw, str(p))


def gpu_from_text(text: str) -> GpuSpec:
    """A GPU not among the built-in names: by its numbers, or from a `.toml`/`.json` spec file."""
    if "=" in text:
        return gpu_from_numbers(text)
    if text.endswith((".toml", ".json")):
        return gpu_from_file(text)
    raise SpecError("gpu", text, f"unknown; known: {', '.join(GPUS)}, a GPU by its numbers "
                                 f"({'=..,'.join(GPU_KEYS)}=..), or a .toml/.json spec file")


def gpus_from_file(path: Path) -> dict[str, GpuSpec]:
    """The bundled GPUs: a TOML file of `[[gpu]]` entries, each a spec file's keys."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("gpu", [])
    out: dict[str, GpuSpec] = {}
    for i, raw in enumerate(entries):
        g = gpu_from_mapping(raw, f"{path.name} entry {i + 1}")
        if g.name in out:
            raise SpecError("gpu name", g.name, f"given twice in {path.name}")
        out[g.name] = g
    return out


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the MLP's width: gated (gate, up, down) or plain (up, down)
    vocab_size: int
    source: str
    bytes_per_param: int = 2  # bf16 weights and KV cache
    mlp_matrices: int = 3  # 3: a gated MLP (SwiGLU: Llama, Mistral, Qwen); 2: up and down only (OPT's ReLU)
    tie_embeddings: bool = False  # the LM head is the embedding matrix (OPT, Llama-3.2-1B)
    max_positions: int = 0  # the context the model was trained for (0: not given)
    learned_positions: bool = False  # a position-embedding table of max_positions x hidden (OPT)

    def __post_init__(self) -> None:
        for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "bytes_per_param", "mlp_matrices"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(k, v, "must be an integer >= 1")
        if self.num_heads % self.num_kv_heads:
            raise SpecError("num_kv_heads", self.num_kv_heads, f"must divide num_heads ({self.num_heads})")

    @property
    def layer_params(self) -> int:
        """Weights of one transformer layer's matmuls (norm weights and biases are negligible)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h + self.mlp_matrices * h * self.intermediate_size

    @property
    def params(self) -> int:
        """All weights: the layers, the embedding, the LM head unless tied, learned positions if any."""
        heads = 1 if self.tie_embeddings else 2
        positions = self.max_positions * self.hidden_size if self.learned_positions else 0
        return self.num_layers * self.layer_params + heads * self.vocab_size * self.hidden_size + positions

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token, every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


GPUS: dict[str, GpuSpec] = gpus_from_file(GPUS_FILE)
GPU_ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-80gb-sxm": "a100",
               "rtx-6000-ada": "rtx6000-ada", "h100-sxm5": "h100"}

_HF = "config.json of {} on the Hugging Face hub"
MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, _HF.format("meta-llama/Llama-3.1-8B")),
        ModelConfig("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, _HF.format("meta-llama/Llama-3.1-70B")),
        ModelConfig("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, _HF.format("Qwen/Qwen2.5-7B")),
        # the shapes Vidur measured (slobench.profiles.vidur compares against them); Llama-3-8B/70B have
        # the Llama-3.1 shapes above
        ModelConfig("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, _HF.format("meta-llama/Llama-2-7b-hf")),
        ModelConfig("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, _HF.format("meta-llama/Llama-2-70b-hf")),
    )
}



def _engine_model(name: str, cfg: EngineModelConfig) -> ModelConfig:
    """A bundled engine config's shapes under the same name, so every flag that takes a model name takes it."""
    return ModelConfig(name, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
                       cfg.vocab_size, "reference_engine.model_config.CONFIGS", tie_embeddings=cfg.tie_embeddings,
                       max_positions=cfg.max_seq_len)


# The one model-name vocabulary: --model of a simulated disaggregated fleet (its KV bytes per token),
# `--profile roofline:GPU/MODEL` and `slobench profile --model` all look names up here (`get_model`).
MODELS.update({name: _engine_model(name, cfg) for name, cfg in ENGINE_CONFIGS.items() if name not in MODELS})
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


def get_gpu(name: str) -> GpuSpec:
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        return gpu_from_text(name)
    return GPUS[key]


def get_model(name: str) -> ModelConfig:
    """A bundled model by name, or any model's shapes from a Hugging Face config.json path
    (`model_from_hf_config`)."""
    if name.endswith(".json"):
        return model_from_hf_config(name)
    key = name.lower()
    if key not in MODELS:
        raise SpecError("model", name, f"unknown; known: {', '.join(MODEL_NAMES)}, or a config.json path")
    return MODELS[key]


# model types whose MLP is up and down only (no gate); every other type is read as Llama-style (gated)
_PLAIN_MLP = ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "gpt_bigcode")
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float": 4, "half": 2}


def model_from_hf_config(path: str | Path) -> ModelConfig:
    """A model's shapes from its Hugging Face `config.json`: OPT (`ffn_dim`, learned positions, tied head)
    and Llama-style models (Llama, Mistral, Qwen2: `intermediate_size`, `num_key_value_heads`, an optional
    `head_dim`). Weights and KV are counted at 2 bytes (fp16/bf16) unless `torch_dtype` says float32."""
    p = Path(path)
    try:
        raw = json.loads(read_input_bytes(p, SETTINGS))
    except (OSError, ValueError) as e:
        raise SpecError("model config", str(p), f"cannot read it as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError("model config", str(p), "must hold a JSON object (a Hugging Face config.json)")
    model_type = str(raw.get("model_type", "")).lower()
    width_key = "ffn_dim" if model_type == "opt" or "ffn_dim" in raw and "intermediate_size" not in raw else \
        "intermediate_size"
    need = ["num_hidden_layers", "hidden_size", "num_attention_heads", width_key, "vocab_size"]
    missing = [k for k in need if k not in raw]
    if missing:
        raise SpecError("model config", str(p), f"lacks {', '.join(missing)} (model_type {model_type or '?'})")

    def integer(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"model config {p.name}: {key}", value, "must be an integer >= 1")
        return value

    heads = integer("num_attention_heads", raw["num_attention_heads"])
    hidden = integer("hidden_size", raw["hidden_size"])
    kv_heads = integer("num_key_value_heads", raw.get("num_key_value_heads") or heads)
    head_dim = integer("head_dim", raw.get("head_dim") or hidden // heads)
    plain = model_type in _PLAIN_MLP or width_key == "ffn_dim"
    name = str(raw.get("_name_or_path") or p.parent.name or p.stem).rsplit("/", 1)[-1].lower()
    return ModelConfig(
        name=name, num_layers=integer("num_hidden_layers", raw["num_hidden_layers"]), hidden_size=hidden,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=integer(width_key, raw[width_key]), vocab_size=integer("vocab_size", raw["vocab_size"]),
        source=f"{p} (Hugging Face config.json, model_type {model_type or '?'})",
        bytes_per_param=_DTYPE_BYTES.get(str(raw.get("torch_dtype", "float16")), 2),
        mlp_matrices=2 if plain else 3,
        tie_embeddings=bool(raw.get("tie_word_embeddings", model_type == "opt")),
        max_positions=int(raw.get("max_position_embeddings") or 0),
        learned_positions=model_type == "opt",
    )
