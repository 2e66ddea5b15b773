"""Sampler side of the actor-learner system.

- `engines`: the `GenerationEngine` protocol (generate / tokenize / load_weights / checksum, with a
  `version` tag) and `HFEngine` (transformers, small CPU runs); `factory.make_engine(kind, path)`;
  `vllm_engine`: `VLLMEngine` (vLLM in-process, CPU or GPU; vLLM's weight-transfer API); `vllm_load`: direct
  weight loads into a vLLM-CPU model runner.
- `sampling`: generate n, verify, and `build_groups`, the one place completions and rewards become `Group`s.
- `sampler`: `Sampler`, one engine plus the answer verifier; turns generation requests into
  verified `Group`s tagged with the policy version that sampled them and reports `RolloutResult`s.
- `sampler_common`: what both samplers share: `EngineSpec`, the request seeds, reward-failure counts.
- `continuous_engine`, `continuous_sampler`, `coalesce`: the continuous-batching sampler (`samplers.continuous`)
  with in-flight weight updates and coalesced pushes to replay.
- `pool`: `SamplerPool` (`exgrpo.core.roles.Rollouts`), the sampler actors, their in-flight requests and
  their number; it holds no weights (`exgrpo.transport.broadcast` moves them, `on_new` catches newcomers up).

Everything here is a plain class; Ray is applied where the actors are wired (`exgrpo.runtime.parts`, via `exgrpo.runtime.env.remote_actor`).
"""
