"""Building an engine from CLI-style knobs, apart from the HTTP server: `slobench run --engine`, the
simulator and the GPU benchmark build engines here without importing FastAPI (the GPU machine's image
has torch and Triton but not the web stack).
"""

from __future__ import annotations

from typing import Any

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.errors import ConfigError
from reference_engine.protocol import TextTokenizer
from reference_engine.tokenizer import ByteTokenizer

PRINTABLE_ASCII = (32, 127)  # a modeled executor emits these byte ids, so every token is visible text

# A modeled engine stands for a real model on a GPU: it accepts token-id prompts over a Llama-3-sized
# vocabulary (text still goes through the byte tokenizer; ids past 257 decode to placeholder words).
MODELED_VOCAB_SIZE = 128_256


def modeled_executor(
    profile: Any, *, block_size: int, num_blocks: int, seed: int = 0
) -> tuple[Any, ByteTokenizer]:
    """The modeled executor and tokenizer that `serve --executor modeled` and the simulator share."""
    from reference_engine.executor.modeled_executor import ModeledExecutor

    tokenizer = ByteTokenizer(vocab_size=MODELED_VOCAB_SIZE)
    ex = ModeledExecutor(
        profile,
        block_size=block_size,
        num_blocks=num_blocks,
        vocab_size=tokenizer.vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        token_id_range=PRINTABLE_ASCII,
        seed=seed,
    )
    return ex, tokenizer


def build_engine(
    *,
    model: str = "tiny",
    executor: str = "modeled",
    profile: str = "cpu-tiny",
    kv_blocks: int | None = None,
    block_size: int = 16,
    max_num_seqs: int = 64,
    max_batched_tokens: int = 2048,
    max_model_len: int | None = None,
    enable_prefix_caching: bool = True,
    dtype: str = "auto",
    device: str = "cpu",
    seed: int = 0,
    weights: str | None = None,
    attention_backend: str | None = None,
    enforce_eager: bool = False,
    gpu_memory_utilization: float = 0.9,
) -> tuple[LLMEngine, TextTokenizer]:
    """An engine and its tokenizer from CLI-style knobs. The modeled path never imports torch.

    Torch executor: `device` "auto" is CUDA when present; `dtype` "auto" is bf16 on CUDA, fp32 on CPU;
    `kv_blocks` None is 1024 on CPU and sized from free GPU memory on CUDA (`gpu_memory_utilization`)."""
    if executor == "modeled":
        from reference_engine.executor.modeled_executor import CostProfile

        num_blocks = 2048 if kv_blocks is None else kv_blocks
        ex, tokenizer = modeled_executor(
            CostProfile.load(profile), block_size=block_size, num_blocks=num_blocks, seed=seed
        )
        model_len = min(4096 if max_model_len is None else max_model_len, 1 << 30)
    elif executor == "torch":
        import torch  # only the torch path pays for it

        from reference_engine.executor.torch_executor import TorchExecutor
        from reference_engine.model import get_config

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if weights is not None:
            from reference_engine.weights import load_config

            model_cfg = load_config(weights)  # the checkpoint decides the shape, so the length limit too
        else:
            model_cfg = get_config(model)
        model_len = min(4096 if max_model_len is None else max_model_len, model_cfg.max_seq_len)
        if kv_blocks is None and torch.device(device).type != "cuda":
            kv_blocks = 1024
        ex = TorchExecutor(
            model,
            kv_blocks,
            block_size,
            dtype=dtype,
            device=device,
            seed=seed,
            weights_path=weights,
            attention_backend=attention_backend,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_batched_tokens,
            max_model_len=model_len,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        num_blocks = ex.num_blocks
        tokenizer = ex.tokenizer
    else:
        raise ConfigError("executor", executor, "must be 'torch' or 'modeled'")
    config = EngineConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched_tokens,
        max_model_len=model_len,
        enable_prefix_caching=enable_prefix_caching,
    )
    return LLMEngine(config, ex), tokenizer
