"""The benchmarks: scripts that measure the project, each run from the repository root as
`python -m bench.<kind>.<script>`: `sampling/` (samplers, the verifier), `weights/` (weights into the samplers),
`replay/` (the pool, the shards), `learner/` (memory; on a GPU the device check), `system/` (whole runs, the
soak, the fault table, the simulated and elastic clusters), `models/` (base models and tasks), `peers/` (other
trainers), `analysis/` (finished compare sweeps), `sim/` (the simulated cluster). `common.py` holds what they
share; results go to `bench/out/` (git-ignored) and the figures to docs/benchmarks.md.
"""
