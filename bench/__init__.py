"""The benchmarks: scripts that measure the project, each run as a module from the repository root
(`python -m bench.<kind>.<script> --help`), grouped by what they measure:

- `sampling/`: a sampler's generation throughput and the verifier's;
- `weights/`: moving the learner's weights into the samplers;
- `replay/`: the experience pool and the replay shards;
- `learner/`: the learner's memory and, on a GPU, its speed, equality across ZeRO stages and dtypes (the device
  check);
- `system/`: whole runs (steps/s, driver round trips, a soak under kills, the fault matrix's table, the
  simulated cluster);
- `models/`: what a base model can do (solve rates, learnability, a pretrained model's step on CPU);
- `peers/`: the project against other trainers on the same work.
- `analysis/`: the tables and figures of docs/results.md, read from finished compare sweeps.

`common.py` holds what they share (environment defaults, a free port, output and JSON, timing). Results go
to `bench/out/` (ignored by git); docs/benchmarks.md records the figures.
"""
