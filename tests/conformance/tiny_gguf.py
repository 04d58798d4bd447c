"""A tiny llama-architecture GGUF model with random weights, written from nothing with the `gguf` package.

The llama.cpp server loads it in well under a second and decodes hundreds of tokens/s on one CPU core.
Tokenizer: SentencePiece-style ("llama" in GGUF terms): <unk>, <s>, </s>, the 256 byte-fallback tokens
`<0x00>`..`<0xFF>` (so any text and any token id below the vocabulary size is a valid prompt), then the
95 printable ASCII characters (space as "▁") and a few common bigrams, 369 tokens in all.

The weights are random but shaped so that greedy decoding (slobench sends temperature 0) only ever
picks a lowercase-letter token: every token embedding carries a large constant in dimension 0, the
layers add little, so after the final norm dimension 0 dominates; the output rows of the letter tokens
have +5 there and every other row (EOS, bytes, punctuation, space) -5. So the model never stops early
(no EOS, whatever `ignore_eos` says), never emits a stop string such as "</s>", and every token is one
non-empty piece of valid UTF-8: a stream carries exactly `max_tokens` content events.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

# 4 heads of 16, 2 layers, FFN 128: about 60k parameters besides the embeddings.
N_EMBD = 64
N_HEAD = 4
N_LAYER = 2
N_FF = 128
N_CTX = 2048
SEED = 20261201

_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6  # gguf.TokenType values
_BIGRAMS = ("th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, token types). Scores rank merges: longer pieces first, as SentencePiece would."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    scores = [0.0] * len(pieces)
    for ch in string.printable[:95]:  # digits, letters, punctuation, space
        pieces.append("▁" if ch == " " else ch)
        types.append(_NORMAL)
        scores.append(-1.0)
    for bigram in _BIGRAMS:
        pieces.append(bigram)
        types.append(_NORMAL)
        scores.append(-0.5)
    return pieces, scores, types


def _is_output_token(piece: str, token_type: int) -> bool:
    return token_type == _NORMAL and piece.isalpha() and piece.islower() and piece.isascii()


def write_tiny_gguf(path: str | Path) -> Path:
    """Write the model to `path` (same bytes every time) and return the path."""
    import gguf  # the conformance extra; imported here so collecting this module never needs it

    path = Path(path)
    pieces, scores, types = vocabulary()
    n_vocab = len(pieces)
    rng = np.random.default_rng(SEED)

    def randn(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("slobench-tiny-random")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are ggml's dims reversed: token_embd is {n_embd, n_vocab} in ggml.
    embd = randn(n_vocab, N_EMBD, scale=0.1)
    embd[:, 0] = 1.0  # the constant that dominates the residual stream, see the module docstring
    w.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(p + name + ".weight", randn(N_EMBD, N_EMBD, scale=0.2))
        w.add_tensor(p + "attn_output.weight", randn(N_EMBD, N_EMBD, scale=0.02))
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(p + "ffn_gate.weight", randn(N_FF, N_EMBD, scale=0.2))
        w.add_tensor(p + "ffn_up.weight", randn(N_FF, N_EMBD, scale=0.2))
        w.add_tensor(p + "ffn_down.weight", randn(N_EMBD, N_FF, scale=0.02))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    out = randn(n_vocab, N_EMBD, scale=1.0)
    out[:, 0] = [5.0 if _is_output_token(p, t) else -5.0 for p, t in zip(pieces, types, strict=True)]
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
