"""Write a tiny random Llama model folder that vLLM can serve, with no model hub: config.json (2 layers,
hidden 64, one 64-wide attention head), random float32 safetensors weights, a byte-level BPE tokenizer.json
trained on text made here, and tokenizer_config.json with a chat template. Seeded, so the same folder
comes out each time. Random weights over a byte-level vocabulary sample tokens that split UTF-8
characters, which vLLM streams as chunks with empty text.

Usage (in a venv with torch, safetensors and tokenizers): `python tests/conformance/tiny_llama.py DIR`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 3000
HIDDEN = 64
LAYERS = 2
HEADS = 1
FFN = 128
SPECIALS = ["<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def corpus(seed: int = 0, words: int = 12000) -> list[str]:
    """Lines of made-up words (ASCII syllables, accented letters, CJK and emoji), enough for ~3,000 merges."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "tre", "sun", "bar", "qu", "ix", "zo", "pel", "an", "or", "ve", "dru", "ny"]
    multibyte = ["é", "ü", "ñ", "ø", "日", "本", "語", "中", "文", "🙂", "🚀", "ß", "ł", "ж", "λ"]
    lines, line = [], []
    for _ in range(words):
        w = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.3:
            w += "".join(rng.choice(multibyte) for _ in range(rng.randint(1, 2)))
        line.append(w)
        if len(line) >= 12:
            lines.append(" ".join(line) + ".")
            line = []
    return lines


def write_tokenizer(out: Path) -> int:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "add_bos_token": False, "model_max_length": 2048, "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    return tok.get_vocab_size()


def write_model(out: Path, vocab: int) -> None:
    head_dim = HIDDEN // HEADS
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": head_dim,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 0, "eos_token_id": 1,
    }, indent=2) + "\n")
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.5

    tensors = {"model.embed_tokens.weight": rand(vocab, HIDDEN), "model.norm.weight": torch.ones(HIDDEN),
               "lm_head.weight": rand(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": rand(HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": rand(HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": rand(HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": rand(FFN, HIDDEN),
            p + "mlp.up_proj.weight": rand(FFN, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, FFN),
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
        }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    write_model(out, vocab)
    print(f"tiny Llama in {out}: vocabulary {vocab}")


if __name__ == "__main__":
    main()
