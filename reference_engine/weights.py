"""Hugging Face Llama checkpoints (config.json + *.safetensors in a local folder) to and from our model.

Our layout fuses q/k/v into `wqkv` and gate/up into `w13`; everything else maps one to one. Shapes are
checked from the safetensors headers before any data is read, and every error names the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from reference_engine.errors import CheckpointError
from reference_engine.model import ModelConfig, RopeScaling, Transformer, empty_model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Saved by some exporters, recomputed by us from the config.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)



def load_config(path: str | Path) -> ModelConfig:
    folder = Path(path)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no such file (a HF checkpoint folder needs {CONFIG_FILE})")
    hf = json.loads(config_path.read_text())
    if hf.get("model_type", "llama") != "llama":
        raise CheckpointError(
            f"{config_path}: model_type {hf['model_type']!r} is not supported, only 'llama'"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{config_path}: hidden_act {hf['hidden_act']!r} is not supported, only 'silu'")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError(f"{config_path}: attention_bias/mlp_bias are not supported")
    try:
        dim, n_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        if hf.get("head_dim") not in (None, dim // n_heads):
            raise CheckpointError(
                f"{config_path}: head_dim {hf['head_dim']} != hidden_size / num_attention_heads"
            )
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]),
            dim=dim,
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads", n_heads)),
            ffn_dim=int(hf["intermediate_size"]),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=_rope_scaling(hf.get("rope_scaling"), config_path),
        )
    except KeyError as e:
        raise CheckpointError(f"{config_path}: missing key {e.args[0]!r}") from e


def _rope_scaling(raw: dict[str, Any] | None, config_path: Path) -> RopeScaling | None:
    if raw is None:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{config_path}: rope_scaling type {kind!r} is not supported, only 'llama3'")
    return RopeScaling(
        factor=float(raw["factor"]),
        low_freq_factor=float(raw["low_freq_factor"]),
        high_freq_factor=float(raw["high_freq_factor"]),
        original_max_seq_len=int(raw["original_max_position_embeddings"]),
    )


def _hf_parts(cfg: ModelConfig) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Our parameter name -> the HF tensors (name, shape) concatenated along dim 0 to make it."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    parts: dict[str, list[tuple[str, tuple[int, ...]]]] = {
        "tok_embeddings.weight": [("model.embed_tokens.weight", (cfg.vocab_size, cfg.dim))],
        "norm.weight": [("model.norm.weight", (cfg.dim,))],
    }
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        parts[f"{ours}.attention.wqkv.weight"] = [
            (f"{hf}.self_attn.q_proj.weight", (q, cfg.dim)),
            (f"{hf}.self_attn.k_proj.weight", (kv, cfg.dim)),
            (f"{hf}.self_attn.v_proj.weight", (kv, cfg.dim)),
        ]
        parts[f"{ours}.attention.wo.weight"] = [(f"{hf}.self_attn.o_proj.weight", (cfg.dim, q))]
        parts[f"{ours}.feed_forward.w13.weight"] = [
            (f"{hf}.mlp.gate_proj.weight", (cfg.ffn_dim, cfg.dim)),
            (f"{hf}.mlp.up_proj.weight", (cfg.ffn_dim, cfg.dim)),
        ]
        parts[f"{ours}.feed_forward.w2.weight"] = [(f"{hf}.mlp.down_proj.weight", (cfg.dim, cfg.ffn_dim))]
        parts[f"{ours}.attention_norm.weight"] = [(f"{hf}.input_layernorm.weight", (cfg.dim,))]
        parts[f"{ours}.ffn_norm.weight"] = [(f"{hf}.post_attention_layernorm.weight", (cfg.dim,))]
    if not cfg.tie_embeddings:
        parts["output.weight"] = [("lm_head.weight", (cfg.vocab_size, cfg.dim))]
    return parts


def load_model(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Transformer:
    from safetensors import safe_open

    folder = Path(path)
    cfg = load_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {name: h for h in handles for name in h.keys()}

    parts = _hf_parts(cfg)
    expected = {name: shape for specs in parts.values() for name, shape in specs}
    if cfg.tie_embeddings:
        expected.pop("lm_head.weight", None)  # some tied checkpoints still store a copy: allow and ignore it
    for name, shape in expected.items():
        if name not in where:
            raise CheckpointError(f"{folder}: tensor {name!r} is missing (expected shape {list(shape)})")
        got = tuple(where[name].get_slice(name).get_shape())
        if got != shape:
            raise CheckpointError(f"{folder}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
    for name in where:
        tied_copy = cfg.tie_embeddings and name == "lm_head.weight"
        if name not in expected and not tied_copy and not name.endswith(_IGNORED_SUFFIXES):
            raise CheckpointError(f"{folder}: unexpected tensor {name!r} (not part of a Llama model)")

    model = empty_model(cfg, dtype=dtype, device=device)
    params = dict(model.named_parameters())  # a tied output shares the embedding's entry
    with torch.no_grad():
        for ours, specs in parts.items():
            row = 0
            for name, shape in specs:
                params[ours][row : row + shape[0]].copy_(where[name].get_tensor(name))
                row += shape[0]
    return model


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights under HF Llama names (fused matrices split back), e.g. to export a dummy model."""
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    for ours, specs in _hf_parts(model.config).items():
        row = 0
        for name, shape in specs:
            out[name] = params[ours][row : row + shape[0]].contiguous()
            row += shape[0]
    return out


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.ffn_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_scaling": None,
    }
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        raw["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_seq_len,
        }
    return raw


def save_hf_checkpoint(model: Transformer, path: str | Path) -> None:
    """Write config.json + model.safetensors that `load_model` (and HF transformers) can read."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config(model.config), indent=2))
    tensors = {k: v.detach().cpu() for k, v in hf_state_dict(model).items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
