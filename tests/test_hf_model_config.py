"""Model shapes from a Hugging Face config.json (slobench.profiles.specs.model_from_hf_config): OPT and
Llama-style models, for roofline profiles, KV bytes a token and KV room."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slobench.errors import SpecError
from slobench.profiles import MODELS, kv_capacity_tokens, roofline_from_name
from slobench.profiles.specs import get_model, model_from_hf_config

OPT_13B = {"model_type": "opt", "_name_or_path": "facebook/opt-13b", "num_hidden_layers": 40, "hidden_size": 5120,
           "num_attention_heads": 40, "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048,
           "torch_dtype": "float16"}
LLAMA_31_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def write(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_opt_shapes_weights_and_kv(tmp_path: Path) -> None:
    m = model_from_hf_config(write(tmp_path, OPT_13B))
    assert (m.name, m.num_layers, m.num_kv_heads, m.head_dim, m.mlp_matrices) == ("opt-13b", 40, 40, 128, 2)
    assert m.tie_embeddings and m.learned_positions and m.max_positions == 2048
    assert m.params * 2 / 1e9 == pytest.approx(25.7, abs=0.05)  # OPT-13B's fp16 weights
    assert m.kv_bytes_per_token == 2 * 40 * 40 * 128 * 2
    # 81,920 MiB x 0.95 less the weights, over 800 KiB a token
    assert kv_capacity_tokens(m, "a100", 1, 0.95) == int((81_920 * 2**20 * 0.95 - m.params * 2)
                                                         // m.kv_bytes_per_token)


def test_llama_config_gives_the_bundled_shapes(tmp_path: Path) -> None:
    m = model_from_hf_config(write(tmp_path, LLAMA_31_8B))
    ref = MODELS["llama-3.1-8b"]
    for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "vocab_size", "mlp_matrices", "bytes_per_param"):
        assert getattr(m, k) == getattr(ref, k), k
    assert m.params == ref.params and m.kv_bytes_per_token == ref.kv_bytes_per_token


def test_a_config_path_names_a_model_anywhere_a_name_does(tmp_path: Path) -> None:
    path = write(tmp_path, OPT_13B)
    assert get_model(str(path)).name == "opt-13b"
    prof = roofline_from_name(f"roofline:a100/{path}/tp2")
    assert prof.provenance is not None and prof.provenance["tp"] == 2
    assert prof.provenance["model"]["mlp_matrices"] == 2


def test_bad_configs_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="lacks intermediate_size"):
        model_from_hf_config(write(tmp_path, {k: v for k, v in LLAMA_31_8B.items() if k != "intermediate_size"}))
    with pytest.raises(SpecError, match="hidden_size"):
        model_from_hf_config(write(tmp_path, {**OPT_13B, "hidden_size": "big"}))
    with pytest.raises(SpecError, match="cannot read"):
        model_from_hf_config(tmp_path / "absent.json")
