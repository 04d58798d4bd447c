"""Building the engine an `EngineSpec` describes, apart from the HTTP server: `slobench run --engine`, the
simulator and the GPU benchmark build engines here without importing FastAPI (the GPU machine's image
has torch and Triton but not the web stack).
"""

from __future__ import annotations

from typing import Any

from reference_engine.config import EngineConfig, EngineSpec
from reference_engine.engine import LLMEngine
from reference_engine.executor.modeled_executor import CostProfile, ModeledExecutor
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


def build_engine(spec: EngineSpec) -> tuple[LLMEngine, TextTokenizer]:
    """The engine `spec` describes, and its tokenizer. The modeled path never imports torch.

    Torch executor: `device` "auto" is CUDA when present; `dtype` "auto" is bf16 on CUDA, fp32 on CPU;
    `kv_blocks` None is 1024 on CPU and sized from free GPU memory on CUDA (`gpu_memory_utilization`)."""
    s = spec
    if s.executor == "modeled":
        num_blocks = 2048 if s.kv_blocks is None else s.kv_blocks
        ex, tokenizer = modeled_executor(
            CostProfile.load(s.profile).under_policy(s.scheduler), block_size=s.block_size, num_blocks=num_blocks,
            seed=s.seed
        )
        model_len = min(4096 if s.max_model_len is None else s.max_model_len, 1 << 30)
    else:  # torch (EngineSpec knows no third)
        import torch  # only the torch path pays for it

        from reference_engine.executor.torch_executor import TorchExecutor
        from reference_engine.model import get_config

        device = s.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if s.weights is not None:
            from reference_engine.weights import load_config

            model_cfg = load_config(s.weights)  # the checkpoint decides the shape, so the length limit too
        else:
            model_cfg = get_config(s.model)
        model_len = min(4096 if s.max_model_len is None else s.max_model_len, model_cfg.max_seq_len)
        kv_blocks = s.kv_blocks
        if kv_blocks is None and torch.device(device).type != "cuda":
            kv_blocks = 1024
        ex = TorchExecutor(
            s.model,
            kv_blocks,
            s.block_size,
            dtype=s.dtype,
            device=device,
            seed=s.seed,
            weights_path=s.weights,
            attention_backend=s.attention_backend,
            enforce_eager=s.enforce_eager,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_batched_tokens,
            max_model_len=model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
        )
        num_blocks = ex.num_blocks
        tokenizer = ex.tokenizer
    config = EngineConfig(
        block_size=s.block_size,
        num_blocks=num_blocks,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_batched_tokens,
        max_model_len=model_len,
        enable_prefix_caching=s.enable_prefix_caching,
        scheduler=s.scheduler,
    )
    return LLMEngine(config, ex), tokenizer
