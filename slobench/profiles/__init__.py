"""Cost profiles that stand on something: a roofline from a GPU spec and a model config, and (in
`slobench.profiles.calibrate`) a fit from designed probes of a live endpoint."""

from reference_engine.executor.modeled_executor import PROFILE_BUILDERS
from slobench.profiles.roofline import Efficiency, kv_capacity_tokens, roofline, roofline_from_name
from slobench.profiles.specs import GPUS, MODELS, GpuSpec, ModelConfig, get_gpu, get_model

__all__ = ["GPUS", "MODELS", "Efficiency", "GpuSpec", "ModelConfig", "get_gpu", "get_model", "kv_capacity_tokens",
           "roofline", "roofline_from_name"]

# `--profile roofline:GPU/MODEL[/tpN]` anywhere a cost profile is named (the engine looks prefixes up here)
PROFILE_BUILDERS["roofline:"] = roofline_from_name
