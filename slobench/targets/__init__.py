"""Targets: one class per kind of server, each turning a RequestSpec into a RequestRecord."""

from slobench.targets.base import Target
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions, Timeouts

__all__ = ["OpenAITarget", "Target", "TargetOptions", "Timeouts"]
