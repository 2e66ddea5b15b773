"""Replay benches: `bench_pool` (the experience pool's draw time and bytes per stored trajectory, in memory and
in a parquet snapshot) and `bench_replay_scale` (the sharded replay service at scale: push throughput, sampling
latency, snapshot, restore and restart; its workload, actors and measurements in `replay_workload`,
`replay_fleet` and `replay_modes`)."""
