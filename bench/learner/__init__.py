"""Learner benches: `bench_learner_memory` (one update's peak memory, whole against chunked logits, float32 or
bfloat16, beside the memory plan), `gpu_learner` (the project's DeepSpeed learner and HF generate on one GPU)
and the GPU device check: `device_check` (the command), `device_equality` (ZeRO stages x chunked logits x
dtypes against one float32 rank), `device_learner` (tokens/s, MFU and peak memory of the 1.5B shape),
`device_broadcast` (packed weights between two processes on one device) and `device_procs` (each part in
processes under a hard time limit)."""
