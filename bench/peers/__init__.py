"""Peer baselines: `bench_trl` (the project against TRL's `GRPOTrainer` on the same work: s/step and tokens/s).
A peer's package is imported here only, never by the runtime packages (tests/exgrpo/test_layering.py)."""
