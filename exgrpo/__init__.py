"""ExGRPO (learning to reason from experience) as a Ray actor-learner system.

Packages: `exgrpo` (algorithm, config, rewards, data, driver, entry points), `actors` (samplers and
engines), `buffers` (experience pool and replay shards), `learners` (DeepSpeed learner group and
weight sync). See docs/architecture.md.
"""

__version__ = "0.1.0"
