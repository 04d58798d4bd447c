"""Seeded, deterministic workloads: arrival schedules, token lengths, prompts, and the TOML spec."""

from slobench.workload.arrivals import (
    ArrivalProcess,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    make_arrivals,
)
from slobench.workload.base import Workload
from slobench.workload.bundled import WORKLOADS_DIR, list_workloads
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
from slobench.workload.phases import CurveArrivals, DiurnalArrivals, Phase, RequestClass
from slobench.workload.prompts import (
    DEFAULT_TOKEN_ID_RANGE,
    WORDS,
    random_text,
    random_token_ids,
    text_prompts,
    token_prompts,
)
from slobench.workload.replay import TraceReplay, replay
from slobench.workload.sessions import SessionSpec, SystemPrompts, ThinkTime
from slobench.workload.spec import WorkloadSpec, generate, load_workload, phase_boundaries
from slobench.workload.traces import Trace, TraceEntry, detect_format, load_trace

__all__ = [
    "DEFAULT_TOKEN_ID_RANGE",
    "WORDS",
    "WORKLOADS_DIR",
    "ArrivalProcess",
    "ConstantArrivals",
    "CurveArrivals",
    "DiurnalArrivals",
    "EmpiricalLength",
    "FixedLength",
    "GammaArrivals",
    "LengthDist",
    "LogNormalLength",
    "ParetoLength",
    "Phase",
    "PoissonArrivals",
    "RequestClass",
    "SessionSpec",
    "SystemPrompts",
    "ThinkTime",
    "Trace",
    "TraceEntry",
    "TraceReplay",
    "UniformLength",
    "Workload",
    "WorkloadSpec",
    "ZipfLength",
    "detect_format",
    "generate",
    "length_from_dict",
    "list_workloads",
    "load_trace",
    "load_workload",
    "make_arrivals",
    "phase_boundaries",
    "random_text",
    "random_token_ids",
    "replay",
    "text_prompts",
    "token_prompts",
]
