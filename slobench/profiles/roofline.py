"""A cost profile from first principles: a model's FLOPs and bytes per token against a GPU's peaks.

The efficiency factors are what fraction of a datasheet peak real kernels reach. Their defaults were fitted
to measured per-layer operator times of Llama-2/3 on H100 and A100 (Vidur, Agrawal et al., MLSys 2024,
MIT; `slobench.profiles.vidur.fit_efficiency` reproduces them from those files). `host_overhead_s` is an
assumption, not a measurement: an engine's CPU cost a step varies from ~0.3 ms (CUDA graphs, async
scheduling) to several ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from reference_engine.config import VLLM_GPU_MEMORY_UTILIZATION
from reference_engine.executor.kv_sizing import MemoryProfile, estimated_activation_peak_bytes, num_kv_blocks
from reference_engine.executor.modeled_executor import CostProfile
from slobench.errors import SpecError
from slobench.profiles.specs import GPU_ALIASES, GPUS, GpuSpec, ModelConfig, get_gpu, get_model


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fractions of the datasheet peaks that kernels reach, and the fixed costs."""

    compute: float = 0.74  # dense GEMMs, of bf16 TFLOP/s (Vidur, GEMMs at 4,096 tokens)
    memory: float = 0.73  # weights and KV reads, of HBM TB/s (Vidur, GEMMs at 1 token)
    elementwise: float = 0.47  # norms, rotary, activation, add, of HBM TB/s (Vidur: slope over tokens)
    attention: float = 0.50  # attention FLOPs, of bf16 TFLOP/s (FlashAttention-2 forward; not in Vidur's files)
    layer_floor_s: float = 22.3e-6  # per layer a step: the element-wise kernels at 1 token (Vidur: launch floor)
    host_overhead_s: float = 1.0e-3  # per step: scheduling, sampling, launches (assumed, not measured)
    link_latency_s: float = 8e-6  # per all-reduce with tp > 1 (assumed: NCCL small-message latency)

    def __post_init__(self) -> None:
        for k in ("compute", "memory", "elementwise", "attention"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                raise SpecError(f"efficiency.{k}", v, "must be a fraction in (0, 1]")
        for k in ("layer_floor_s", "host_overhead_s", "link_latency_s"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise SpecError(f"efficiency.{k}", v, "must be a number >= 0 (seconds)")


def elementwise_bytes_per_token(m: ModelConfig, tp: int = 1) -> float:
    """Activation bytes read and written by one layer's element-wise kernels for one token, on one GPU:
    two RMSNorms (read h, write h), a residual add (read 2h, write h), rotary on the local q and k heads
    (read and write), SiLU·mul on the local MLP width (read 2i, write i): the operators Vidur times."""
    norms_and_add = 2 * 2 * m.hidden_size + 3 * m.hidden_size
    rope = 2 * (m.num_heads + m.num_kv_heads) * m.head_dim / tp
    act = m.mlp_matrices * m.intermediate_size / tp  # gated: read 2i, write i; plain: read i, write i
    return m.bytes_per_param * (norms_and_add + rope + act)


def layer_dense_s(m: ModelConfig, g: GpuSpec, num_tokens: int, tp: int = 1, eff: Efficiency | None = None) -> float:
    """The roofline's time for one layer's dense (non-attention) operators over `num_tokens` tokens:
    what Vidur's per-layer `mlp.csv` measures."""
    e = eff or Efficiency()
    gemm = max(2 * m.layer_params / tp * num_tokens / (g.bf16_tflops * 1e12 * e.compute),
               m.layer_params / tp * m.bytes_per_param / (g.hbm_tb_s * 1e12 * e.memory))
    return gemm + num_tokens * elementwise_bytes_per_token(m, tp) / (g.hbm_tb_s * 1e12 * e.elementwise) + e.layer_floor_s


def roofline(model: str | ModelConfig, gpu: str | GpuSpec, tp: int = 1, eff: Efficiency | None = None) -> CostProfile:
    """The cost profile of `model` served on `tp` GPUs of kind `gpu` (tensor parallel), from peaks and
    efficiencies. Names: see `slobench.profiles.MODELS` and `GPUS`.

    One step of a served batch, on each of `tp` GPUs (weights, heads and MLP split evenly):

    - dense layers: max(FLOPs of the step's tokens / effective TFLOP/s, weights bytes / effective TB/s).
      2·params FLOPs per token; every weight read once a step. Below the ridge (~hundreds of tokens a step:
      decode) the step is bound by the weights read; above it (prefill chunks) by compute.
    - attention: max(4·layers·heads·head_dim FLOPs per (query, key) pair, K and V bytes per context token).
      Decode reads the KV of every token in context (memory-bound); long prefill chunks are compute-bound.
    - per token, beside the roof: element-wise kernels (norms, rotary, SiLU·mul, residual adds) read and write
      activations; with tp > 1, two all-reduces of the hidden state per layer over the GPU link.
    - per decoded sequence: the LM head's FLOPs for its one sampled position.
    - per step: host overhead (scheduling, sampling, launches) plus a per-layer kernel floor.
    """
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise SpecError("tp", tp, "must be an integer >= 1")
    if m.num_kv_heads % tp and tp % m.num_kv_heads:
        raise SpecError("tp", tp, f"must divide or be a multiple of {m.name}'s {m.num_kv_heads} KV heads")
    e = eff or Efficiency()
    flops = g.bf16_tflops * 1e12
    bw = g.hbm_tb_s * 1e12
    L, h, b = m.num_layers, m.hidden_size, m.bytes_per_param
    weights_bytes = (L * m.layer_params + m.vocab_size * h) * b / tp  # the LM head is read each step too
    kv_heads_per_gpu = max(1, m.num_kv_heads // tp)  # past tp = kv heads, KV heads are replicated
    kv_bytes = 2 * L * kv_heads_per_gpu * m.head_dim * b
    elementwise_s = L * elementwise_bytes_per_token(m, tp) / (bw * e.elementwise)
    allreduce_s = 0.0  # per token: two ring all-reduces of the hidden state per layer
    step_s = e.host_overhead_s + L * e.layer_floor_s
    if tp > 1:
        allreduce_s = L * 2 * (2 * (tp - 1) / tp) * h * b / (g.link_gb_s * 1e9)
        step_s += L * 2 * e.link_latency_s
    lm_head_s = 2 * m.vocab_size * h / tp / (flops * e.compute)
    if kv_capacity_tokens(m, g, tp) == 0:  # an engine with no room for one token of KV refuses to start
        raise SpecError("tp", tp, f"{m.name}'s weights need {m.params * b / tp / 2**30:.1f} GiB a GPU, leaving "
                                  f"no room for the KV cache in 90% of the {g.name}'s {g.memory_bytes / 2**30:.1f} "
                                  f"GiB: use a larger --tp")
    ridge_tokens = weights_bytes / bw / e.memory / (2 * L * m.layer_params / tp / (flops * e.compute))
    note = (
        f"ROOFLINE (not measured): {m.name} on {tp} x {g.name}, bf16. Dense layers bound by the weights read "
        f"({weights_bytes / 1e9:.1f} GB a GPU a step) below ~{ridge_tokens:.0f} tokens a step, by compute "
        f"above; decode attention bound by the KV read ({kv_bytes / 1024:.0f} KiB a token a GPU). "
        f"Efficiencies: compute {e.compute:.0%}, memory {e.memory:.0%}, element-wise {e.elementwise:.0%}, "
        f"attention {e.attention:.0%}; host overhead {e.host_overhead_s * 1e3:.2f} ms a step (assumed). "
        f"GPU: {g.source}. Model: {m.source}."
    )
    return CostProfile(
        name=f"roofline-{g.name}-{m.name}" + (f"-tp{tp}" if tp > 1 else ""),
        step_overhead_s=step_s,
        per_prefill_token_s=elementwise_s + allreduce_s,
        per_decode_seq_s=elementwise_s + allreduce_s + lm_head_s,
        per_context_token_s=0.0,
        note=note,
        compute_per_token_s=2 * L * m.layer_params / tp / (flops * e.compute),
        weights_read_s=weights_bytes / (bw * e.memory),
        attention_per_pair_s=4 * L * m.num_heads * m.head_dim / tp / (flops * e.attention),
        kv_read_per_context_token_s=kv_bytes / (bw * e.memory),
        provenance={
            "kind": "roofline", "gpu": asdict(g), "model": asdict(m), "tp": tp, "efficiency": asdict(e),
            "ridge_tokens_per_step": round(ridge_tokens, 1), "weights_gb_per_gpu": round(weights_bytes / 1e9, 3),
            "kv_bytes_per_token_per_gpu": kv_bytes,
            "kv_capacity_tokens": kv_capacity_tokens(m, g, tp),  # at 90% of memory: --kv-blocks = this / 16
        },
    )


def kv_capacity_tokens(model: str | ModelConfig, gpu: str | GpuSpec, tp: int = 1,
                       memory_utilization: float = 0.9, reserve_fraction: float = 0.0) -> int:
    """Tokens of KV cache an instance holds: each GPU's memory as its driver reports it x
    (`memory_utilization`, vLLM's share, less `reserve_fraction` the engine keeps for its own work), less the
    weights, over K and V bytes a token. Activations are not subtracted unless `reserve_fraction` holds them
    (a few GB at large step budgets). Divide by the block size for `--kv-blocks`."""
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if not 0 < memory_utilization <= 1:
        raise SpecError("memory_utilization", memory_utilization, "must be a fraction in (0, 1]")
    if not 0 <= reserve_fraction < memory_utilization:
        raise SpecError("reserve_fraction", reserve_fraction, "must be a fraction in [0, memory_utilization)")
    weights = m.params * m.bytes_per_param
    free = tp * g.memory_bytes * (memory_utilization - reserve_fraction) - weights
    replicas = max(1, tp // m.num_kv_heads)  # past tp = KV heads, each KV head is kept on several GPUs
    return max(0, int(free // (m.kv_bytes_per_token * replicas)))


def vllm_kv_blocks(model: str | ModelConfig, gpu: str | GpuSpec, tp: int = 1, *, block_size: int = 16,
                   max_num_batched_tokens: int, max_num_seqs: int,
                   gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> int:
    """KV blocks vLLM gives an instance of `tp` GPUs when --num-gpu-blocks-override is not given: on each
    GPU, its memory as the driver reports it x `gpu_memory_utilization`, less its share of the weights and
    the profiling pass's activation peak (`estimated_activation_peak_bytes`), over one block's K and V on
    that GPU. A ConfigError naming every term when not one block fits."""
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    peak = estimated_activation_peak_bytes(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, hidden_size=m.hidden_size,
        mlp_width=-(-m.intermediate_size // tp), mlp_matrices=m.mlp_matrices, vocab_size=m.vocab_size,
        dtype_bytes=m.bytes_per_param)
    kv_heads_per_gpu = max(1, m.num_kv_heads // tp)
    bytes_per_block = block_size * 2 * m.num_layers * kv_heads_per_gpu * m.head_dim * m.bytes_per_param
    memory = MemoryProfile(total_bytes=g.memory_bytes, used_bytes=-(-m.params * m.bytes_per_param // tp),
                           activation_peak_bytes=peak)
    return num_kv_blocks(memory, gpu_memory_utilization, bytes_per_block)


def vllm_kv_blocks_of(profile: CostProfile, *, block_size: int, max_num_batched_tokens: int, max_num_seqs: int,
                      gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> int | None:
    """`vllm_kv_blocks` for the model, GPU and TP degree a roofline profile was built from (its provenance);
    None for a profile that names no GPU (fitted, bundled)."""
    prov = profile.provenance or {}
    if prov.get("kind") != "roofline":
        return None
    return vllm_kv_blocks(ModelConfig(**prov["model"]), GpuSpec(**prov["gpu"]), int(prov.get("tp", 1)),
                          block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization)


def roofline_from_name(spec: str) -> CostProfile:
    """`roofline:GPU/MODEL[/tpN]`, e.g. `roofline:h100/llama-3.1-70b/tp4` (the `--profile` form). GPU is a
    name, a GPU by its numbers (`roofline:bf16_tflops=362,mem_gbs=864,mem_gib=44.5,link_gbs=32/llama-3.1-8b`)
    or a `.toml`/`.json` spec file path; MODEL a name or a config.json path."""
    body = spec.removeprefix("roofline:")
    parts = body.split("/")
    tp = 1
    if len(parts) >= 3 and parts[-1].startswith("tp") and parts[-1][2:].isascii() and parts[-1][2:].isdigit():
        tp = int(parts[-1][2:])
        parts = parts[:-1]
    # the GPU ends at its first part unless that is no name nor numbers: then at the spec file's name
    ends = [i for i, part in enumerate(parts[:-1]) if part.endswith((".toml", ".json"))]
    cut = 1 if "=" in parts[0] or parts[0].lower() in GPUS or parts[0].lower() in GPU_ALIASES or not ends else ends[0] + 1
    gpu, model = "/".join(parts[:cut]), "/".join(parts[cut:])
    if not gpu or not model or len(parts[cut:]) > 1 and not model.endswith(".json"):
        raise SpecError("profile", spec, "a roofline profile is roofline:GPU/MODEL[/tpN], e.g. roofline:h100/llama-3.1-8b")
    return roofline(model, gpu, tp)
