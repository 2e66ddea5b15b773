"""Learner side: DeepSpeed learner ranks, the learner group, and weight transport to samplers.

- ``learner.Learner``: one DeepSpeed engine rank (a plain class; Ray is applied by the caller).
- ``optim``: ``GuardedAdamW`` (the grad-norm rule) and the DeepSpeed config.
- ``group.LearnerGroup``: L learner actors in a placement group (``exgrpo.core.roles.Learners``).
- ``weight_sync``: the weight transports, whole (``ObjectStoreTransport``, ``VLLMTransport``,
  ``make_transport``) and the object-store payload (``Packer``: one contiguous byte buffer).
- ``vllm_transfer``: vLLM's weight-transfer API from learner rank 0 (``WeightPusher``, ``SamplerClient``,
  ``LearnerSource`` with ZeRO-3 gathers).
- ``gloo_transfer``: the gloo backend of that API for CPU runs, registered in vLLM's factories.
"""
