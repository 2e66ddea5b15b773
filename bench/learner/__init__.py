"""Learner benches: `bench_learner_memory` (peak memory of learner updates beside the memory plan: one update on
CPU, whole against chunked logits, and the device check's memory part on 7B layer shapes), `gpu_learner` (the
project's DeepSpeed learner and HF generate on one device; the device check's learner part: tokens/s, MFU and peak
memory of the 1.5B shape) and the GPU device check: `device_check` (the command), `device_equality` (ZeRO stages x
chunked logits x dtypes against one float32 rank), `device_broadcast` (packed weights between two processes on one
device) and `device_procs` (each part in processes under a hard time limit)."""
