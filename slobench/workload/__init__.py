"""Seeded, deterministic workloads: arrival schedules, token lengths, prompts, and the TOML spec."""

from slobench.workload.arrivals import (
    ArrivalProcess,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    make_arrivals,
)
from slobench.workload.lengths import (
    EmpiricalLength,
    FixedLength,
    LengthDist,
    LogNormalLength,
    ParetoLength,
    UniformLength,
    ZipfLength,
    length_from_dict,
)
from slobench.workload.prompts import (
    DEFAULT_TOKEN_ID_RANGE,
    WORDS,
    random_text,
    random_token_ids,
    text_prompts,
    token_prompts,
)
from slobench.workload.spec import WORKLOADS_DIR, WorkloadSpec, generate, list_workloads, load_workload

__all__ = [
    "DEFAULT_TOKEN_ID_RANGE",
    "WORDS",
    "WORKLOADS_DIR",
    "ArrivalProcess",
    "ConstantArrivals",
    "EmpiricalLength",
    "FixedLength",
    "GammaArrivals",
    "LengthDist",
    "LogNormalLength",
    "ParetoLength",
    "PoissonArrivals",
    "UniformLength",
    "WorkloadSpec",
    "ZipfLength",
    "generate",
    "length_from_dict",
    "list_workloads",
    "load_workload",
    "make_arrivals",
    "random_text",
    "random_token_ids",
    "text_prompts",
    "token_prompts",
]
