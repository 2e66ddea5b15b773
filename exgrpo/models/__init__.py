"""Models: tiny builtin models, supervised warm-up, SmolLM2 conversion, and `resolve_model` (off the training path)."""
