"""Sampler side of the actor-learner system.

- `engines`: the `GenerationEngine` protocol (generate / tokenize / load_weights / checksum, with a
  `version` tag), `HFEngine` (transformers, small CPU runs) and `make_engine(kind, path)`;
  `vllm_engine`: `VLLMEngine` (vLLM in-process, CPU or GPU; vLLM's weight-transfer API).
- `sampler`: `Sampler`, one engine plus the answer verifier; turns generation requests into
  verified `Group`s tagged with the policy version that sampled them and reports `RolloutResult`s.
- `pool`: `SamplerPool` (`exgrpo.core.roles.Rollouts`), the sampler actors, their in-flight requests and
  their number; it holds no weights (`exgrpo.transport.broadcast` moves them, `on_new` catches newcomers up).

Everything here is a plain class; Ray is applied where the actors are wired (`exgrpo.runtime.recipe`).
"""
