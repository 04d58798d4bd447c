"""The roofline's dense part against measured per-layer operator times (Vidur's profiling data).

Vidur (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024; MIT
License; microsoft/vidur `data/profiling/compute/<gpu>/<model>/mlp.csv`) timed each non-attention operator
of one transformer layer on H100 and A100 for 1 to 4,096 (or more) tokens at tensor-parallel degrees 1-8.
Nothing of those files is kept in this repository: this module reads them from a folder the user has
(`shared/profiling/vidur-gpu-ops/` in this project's workspace) to fit and check `Efficiency`.

A layer's measured dense time is the sum of its operators' medians (QKV, O, up, down projections; both
norms, rotary, SiLU·mul, the add), the embedding excluded (once a model, not a layer).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slobench.errors import SpecError
from slobench.input_file import PROFILE_TABLE, open_input
from slobench.profiles.roofline import Efficiency, elementwise_bytes_per_token, layer_dense_s
from slobench.profiles.specs import GpuSpec, ModelConfig, get_gpu

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
MAX_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One file at one TP degree: per-layer medians (seconds) against the number of tokens."""

    file: str
    gpu: GpuSpec
    model: ModelConfig
    tp: int
    num_tokens: np.ndarray
    gemm_s: np.ndarray
    elementwise_s: np.ndarray

    @property
    def dense_s(self) -> np.ndarray:
        return self.gemm_s + self.elementwise_s


def read_folder(folder: str | Path, max_tokens: int = MAX_TOKENS) -> list[LayerTimes]:
    """Every `<gpu>-<model>-mlp.csv` in `folder`, one LayerTimes per TP degree, tokens up to `max_tokens`."""
    paths = sorted(Path(folder).glob("*-mlp.csv"))
    if not paths:
        raise SpecError("vidur folder", str(folder), "holds no <gpu>-<model>-mlp.csv files")
    out = []
    for path in paths:
        gpu = get_gpu(path.name.split("-", 1)[0])
        rows: dict[int, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        shape: dict[str, str] = {}
        with io.TextIOWrapper(open_input(path, PROFILE_TABLE), encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f):
                n = int(r["num_tokens"])
                if n > max_tokens:
                    continue
                shape = r
                gemm = sum(float(r[f"time_stats.{op}.median"]) for op in GEMMS) * 1e-3
                elem = sum(float(r[f"time_stats.{op}.median"]) for op in ELEMENTWISE) * 1e-3
                rows[int(r["num_tensor_parallel_workers"])][n].append((gemm, elem))
        h, nh = int(shape["n_embd"]), int(shape["n_head"])
        model = ModelConfig(path.name.split("-", 1)[1].removesuffix("-mlp.csv"), 1, h, nh, int(shape["n_kv_head"]),
                            h // nh, int(shape["n_expanded_embd"]), int(shape["vocab_size"]), source=f"Vidur {path.name}")
        for tp, by_n in sorted(rows.items()):
            ns = np.array(sorted(by_n))
            med = np.array([np.median(np.asarray(by_n[n]), axis=0) for n in ns])  # repeated rows: their median
            out.append(LayerTimes(path.name, gpu, model, tp, ns, med[:, 0], med[:, 1]))
    return out


def fit_efficiency(tables: list[LayerTimes], base: Efficiency | None = None) -> Efficiency:
    """Efficiencies read off the measurements, each from where the roofline says it alone decides:
    memory from the GEMMs at 1 token (weights-bound), compute from the GEMMs at the most tokens
    (compute-bound), the element-wise efficiency from the slope of those kernels' time over tokens, the
    per-layer floor from their time at 1 token. Medians over files and TP degrees."""
    mem, comp, elem, floor = [], [], [], []
    for t in tables:
        m, g = t.model, t.gpu
        w_bytes = m.layer_params / t.tp * m.bytes_per_param
        mem.append(w_bytes / t.gemm_s[0] / (g.hbm_tb_s * 1e12))
        comp.append(2 * m.layer_params / t.tp * t.num_tokens[-1] / t.gemm_s[-1] / (g.bf16_tflops * 1e12))
        slope = np.polyfit(t.num_tokens.astype(float), t.elementwise_s, 1)[0]
        elem.append(elementwise_bytes_per_token(m, t.tp) / slope / (g.hbm_tb_s * 1e12))
        floor.append(float(t.elementwise_s[0]))
    b = base or Efficiency()
    return Efficiency(compute=round(float(np.median(comp)), 2), memory=round(float(np.median(mem)), 2),
                      elementwise=round(float(np.median(elem)), 2), attention=b.attention,
                      layer_floor_s=round(float(np.median(floor)), 7), host_overhead_s=b.host_overhead_s,
                      link_latency_s=b.link_latency_s)


@dataclass(frozen=True, slots=True)
class Comparison:
    file: str
    tp: int
    median_error: float  # |roofline - measured| / measured over the token counts
    p90_error: float
    max_error: float
    bias: float  # median of (roofline - measured) / measured: > 0 over-predicts


def compare(tables: list[LayerTimes], eff: Efficiency | None = None) -> list[Comparison]:
    out = []
    for t in tables:
        pred = np.array([layer_dense_s(t.model, t.gpu, int(n), t.tp, eff) for n in t.num_tokens])
        rel = (pred - t.dense_s) / t.dense_s
        a = np.abs(rel)
        out.append(Comparison(t.file, t.tp, float(np.median(a)), float(np.quantile(a, 0.9)), float(a.max()),
                              float(np.median(rel))))
    return out
