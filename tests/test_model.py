"""The model (configs, dummy weights, dense oracle), HF checkpoint loading, and the byte tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch", reason="needs the engine extra (torch)")
from engine_helpers import greedy, one_torch_thread

from reference_engine.model import CONFIGS, ModelConfig, Transformer, build_model, get_config, rope_inv_freq
from reference_engine.tokenizer import BOS_ID, EOS_ID, ByteTokenizer, IncrementalDecoder
from reference_engine.weights import (
    CheckpointError,
    hf_state_dict,
    load_config,
    load_model,
    save_hf_checkpoint,
)
from slobench.errors import EngineConfigError

_one_torch_thread = pytest.fixture(autouse=True, scope="module")(one_torch_thread)


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    return build_model("tiny", seed=0)


# --- configs ---------------------------------------------------------------------------------------


def test_config_validation_names_the_field() -> None:
    with pytest.raises(EngineConfigError, match="n_kv_heads"):
        dataclasses.replace(CONFIGS["tiny"], n_kv_heads=3)
    with pytest.raises(EngineConfigError, match="dim"):
        dataclasses.replace(CONFIGS["tiny"], dim=250)
    with pytest.raises(EngineConfigError, match="vocab_size"):
        dataclasses.replace(CONFIGS["tiny"], vocab_size=0)
    with pytest.raises(EngineConfigError, match="unknown model config"):
        get_config("gpt-5")


def test_llama_1b_shape_has_the_published_parameter_count() -> None:
    with torch.device("meta"):  # no memory: only shapes
        model = Transformer(CONFIGS["llama-3.2-1b"])
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == 1_235_814_400


def test_llama3_rope_scaling_keeps_high_and_stretches_low_frequencies() -> None:
    cfg = CONFIGS["llama-3.2-1b"]
    plain = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
    scaled = rope_inv_freq(cfg)
    assert torch.equal(scaled[0], plain[0])  # wavelength 2*pi: far above the high-frequency cut
    assert torch.allclose(scaled[-1], plain[-1] / 32)  # longest wavelength: divided by factor
    assert (scaled <= plain).all()


# --- dummy weights and the dense oracle ---------------------------------------------------------------


def test_dummy_weights_are_seeded(tiny: Transformer) -> None:
    again = build_model("tiny", seed=0)
    other = build_model("tiny", seed=1)
    ids = [72, 105, 33]
    assert torch.equal(tiny.forward_dense(ids), again.forward_dense(ids))
    assert not torch.allclose(tiny.forward_dense(ids), other.forward_dense(ids))


@pytest.mark.parametrize("tie", [False, True])
def test_greedy_output_is_varied_and_depends_on_the_prompt(tie: bool) -> None:
    model = build_model(dataclasses.replace(CONFIGS["tiny"], tie_embeddings=tie), seed=0)
    outs = [greedy(model, prompt, 16) for prompt in ([1, 2, 3], [5], [100, 200, 300], [72, 101, 108])]
    assert len({tuple(o) for o in outs}) == len(outs)  # different prompts, different continuations
    assert all(len(set(o)) >= 4 for o in outs)  # not one token repeated
    logits = model.forward_dense([1, 2, 3])[-1]
    assert 1.0 < float(logits.std()) < 10.0  # well-conditioned: a spread of a few units


def test_dense_forward_is_causal(tiny: Transformer) -> None:
    full = tiny.forward_dense([10, 20, 30, 40, 50])
    prefix = tiny.forward_dense([10, 20, 30])
    torch.testing.assert_close(full[:3], prefix, rtol=1e-5, atol=1e-5)


# --- HF safetensors checkpoints -------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_checkpoint_round_trip_gives_equal_logits(tmp_path, tie: bool) -> None:
    cfg = dataclasses.replace(CONFIGS["tiny"], n_layers=2, tie_embeddings=tie)
    model = build_model(cfg, seed=3)
    save_hf_checkpoint(model, tmp_path)
    names = set(json.loads((tmp_path / "config.json").read_text()))
    assert {"hidden_size", "num_key_value_heads", "tie_word_embeddings"} <= names
    assert load_config(tmp_path) == cfg
    loaded = load_model(tmp_path)
    ids = [1, 50, 200, 7, 9]
    assert torch.equal(loaded.forward_dense(ids), model.forward_dense(ids))
    assert (loaded.output.weight is loaded.tok_embeddings.weight) == tie


def test_checkpoint_in_bf16_loads_with_the_rope_table_in_fp32(tmp_path) -> None:
    model = build_model(dataclasses.replace(CONFIGS["tiny"], n_layers=1), seed=0)
    save_hf_checkpoint(model, tmp_path)
    loaded = load_model(tmp_path, dtype=torch.bfloat16)
    assert loaded.tok_embeddings.weight.dtype == torch.bfloat16
    assert loaded.rope_cos.dtype == torch.float32
    assert loaded.forward_dense([1, 2, 3]).shape == (3, 512)


def test_sharded_checkpoint_loads(tmp_path) -> None:
    from safetensors.torch import save_file

    model = build_model(dataclasses.replace(CONFIGS["tiny"], n_layers=2), seed=5)
    save_hf_checkpoint(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    tensors = sorted(hf_state_dict(model).items())
    half = len(tensors) // 2
    save_file(dict(tensors[:half]), str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(dict(tensors[half:]), str(tmp_path / "model-00002-of-00002.safetensors"))
    assert torch.equal(load_model(tmp_path).forward_dense([3, 1, 4]), model.forward_dense([3, 1, 4]))


def _write_checkpoint(tmp_path, mutate) -> None:
    from safetensors.torch import save_file

    model = build_model(dataclasses.replace(CONFIGS["tiny"], n_layers=2), seed=0)
    save_hf_checkpoint(model, tmp_path)
    tensors = hf_state_dict(model)
    mutate(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))


def test_wrong_shape_names_the_tensor(tmp_path) -> None:
    def shrink(t: dict) -> None:
        t["model.layers.1.self_attn.k_proj.weight"] = t["model.layers.1.self_attn.k_proj.weight"][:32]

    _write_checkpoint(tmp_path, shrink)
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight.*\[32, 256\].*\[64, 256\]"
    ):
        load_model(tmp_path)


def test_missing_tensor_names_the_tensor(tmp_path) -> None:
    _write_checkpoint(tmp_path, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*missing"):
        load_model(tmp_path)


def test_unexpected_tensor_is_an_error_but_inv_freq_is_ignored(tmp_path) -> None:
    def add(t: dict) -> None:
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
        t["model.layers.0.self_attn.q_norm.weight"] = torch.ones(32)

    _write_checkpoint(tmp_path, add)
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_norm\.weight'"
    ):
        load_model(tmp_path)


def test_missing_config_and_unsupported_model_type(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="gpt2"):
        load_config(tmp_path)


def test_config_values_are_validated(tmp_path) -> None:
    model = build_model(dataclasses.replace(CONFIGS["tiny"], n_layers=1), seed=0)
    save_hf_checkpoint(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["num_key_value_heads"] = 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(EngineConfigError, match="n_kv_heads"):
        load_config(tmp_path)


# --- byte tokenizer ------------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_specials() -> None:
    tok = ByteTokenizer(512)
    text = "héllo, wörld — 你好 🙂"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode())
    assert tok.decode(ids) == text
    assert tok.encode("a", add_bos=True) == [BOS_ID, 97]
    assert tok.decode([BOS_ID, 104, 105, EOS_ID]) == "hi"
    assert tok.eos_token_id == EOS_ID
    with pytest.raises(EngineConfigError, match="vocab_size"):
        ByteTokenizer(100)


def test_incremental_decode_never_splits_a_character() -> None:
    text = "a€🙂b"  # 1-, 3- and 4-byte characters
    ids = ByteTokenizer().encode(text)
    dec = IncrementalDecoder()
    pieces = [dec.push([i]) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    # '€' is bytes 1..3: nothing until its last byte arrives, then the whole character.
    assert pieces[1:4] == ["", "", "€"]
    assert pieces[4:8] == ["", "", "", "🙂"]


def test_incremental_decode_of_invalid_and_truncated_bytes() -> None:
    dec = IncrementalDecoder()
    assert dec.push([0xFF, 104]) == "\ufffdh"
    assert dec.push([0xE2, 0x82]) == ""
    assert dec.flush() == "\ufffd"  # the stream ended mid-character
    assert dec.push([105]) == "i"  # and the decoder is usable after a flush


def test_big_vocab_ids_decode_to_placeholder_words() -> None:
    tok = ByteTokenizer(128256)
    assert tok.decode([300, 1000]) == " t300 t1000"
    dec = IncrementalDecoder()
    assert dec.push([0xE2]) == ""
    assert dec.push([5000]) == "\ufffd t5000"  # a placeholder ends the unfinished character


def test_model_config_is_frozen() -> None:
    cfg: ModelConfig = CONFIGS["tiny"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 1  # type: ignore[misc]
