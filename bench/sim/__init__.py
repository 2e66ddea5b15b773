"""A simulated cluster: samplers and learners that sleep by a cost model, run under the real driver, replay
shards and sampler pool."""
