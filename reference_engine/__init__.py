"""A small, real LLM inference engine bundled with slobench: continuous batching, paged KV cache,
prefix caching, preemption by recompute. The scheduler and block manager import no torch."""
