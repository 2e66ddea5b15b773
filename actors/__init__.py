"""Sampler side of the actor-learner system: the generation engines, the samplers that turn requests into
verified `Group`s tagged with their weights' version, and `pool.SamplerPool` (`exgrpo.core.roles.Rollouts`),
which holds the sampler actors and their requests but no weights (`exgrpo.transport.broadcast` moves them).

Everything here is a plain class; Ray is applied where the actors are wired (`exgrpo.runtime.parts`, via
`exgrpo.runtime.env.remote_actor`). Each module's role: docs/architecture.md ("Packages and the import rule").
"""
