"""slobench: SLO-aware open-loop load testing for LLM inference servers."""

__version__ = "0.1.0"
__all__ = ["__version__"]
