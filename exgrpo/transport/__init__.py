"""The weights' way from the learners to the samplers, below both: the packed byte buffer, the driver-side
transports and vLLM's weight-transfer API with its CPU engine (docs/architecture.md, "Weights")."""
