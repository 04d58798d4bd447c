"""One codec per OpenAI API: the request body, the stream's events and the usage (`slobench.targets.openai` keeps
the target's lifecycle and the transport seam below them)."""
