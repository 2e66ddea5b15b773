"""Learner side: DeepSpeed learner ranks, the learner group, and weight transport to samplers.

- ``learner.Learner``: one DeepSpeed engine rank (a plain class; Ray is applied by the caller).
- ``optim``: ``GuardedAdamW`` (the grad-norm rule) and the DeepSpeed config.
- ``group.LearnerGroup``: L learner actors in a placement group (``exgrpo.core.Learners``).
- ``weight_sync``: the weight transports, whole (``ObjectStoreTransport``, ``CollectiveTransport``,
  ``make_transport``) and their endpoints (numpy payloads, the bucketed gloo sender/receiver).
"""
