"""Whole-system benches: `bench_runtime` (steps/s, tokens/s and the step's split of the tiny config, per engine
and per eta), `bench_roundtrips` (the driver's blocking Ray round trips per step), `soak` (training under
random kills, every request accounted for) and `fault_table` (the fault matrix's rows as a markdown table), and `bench_sim_cluster` (the real driver on a
simulated cluster of sleeping samplers and learners, step time against the cost model's ideal)."""
