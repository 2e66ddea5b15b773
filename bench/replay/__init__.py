"""Replay benches: `bench_pool` (the experience pool's draw time and bytes per stored trajectory, in memory and
in a parquet snapshot)."""
