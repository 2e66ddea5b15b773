"""Model benches: `bench_scratchpad_base` (a scratchpad base model's solve rates and traces before RL),
`bench_learnability` (whether a base model's RL signal is learnable, per learning rate) and `bench_smollm2`
(one ExGRPO step of SmolLM2-135M on CPU, timed part by part, with both engines)."""
