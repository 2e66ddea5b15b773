"""Learner side: DeepSpeed learner ranks, the learner group, and weight transport to samplers.

- ``learner.Learner``: one DeepSpeed engine rank (a plain class; Ray is applied by the caller).
- ``group.LearnerGroup``: L learner actors in a placement group; splits batches, averages metrics.
- ``weight_sync``: object-store payloads (numpy) and the collective transport (bucketed broadcast).
"""
