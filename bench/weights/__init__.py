"""Weight benches: `bench_weight_sync` (a broadcast of ~100M fp32 weights to the samplers, per transport,
against the memory-bandwidth floor) and `bench_vllm_load` (one vLLM-CPU engine's load of those weights,
direct against vLLM's reload); `model_100m` registers the ~100M model both use."""
