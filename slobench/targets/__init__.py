"""Targets: one class per kind of server, each turning a RequestSpec into a RequestRecord."""

from slobench.targets.base import Target
from slobench.targets.openai import OpenAITarget

__all__ = ["OpenAITarget", "Target"]
