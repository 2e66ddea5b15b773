"""Learner side: DeepSpeed learner ranks and the learner group. The weights' way to the samplers lives in
``exgrpo.transport`` (packed buffers, the object store, vLLM's weight-transfer API and its gloo engine).

- ``learner.Learner``: one DeepSpeed engine rank (a plain class; Ray is applied by the caller).
- ``modeling``: dtype names, a rank's torch.distributed start, gradient checkpointing with dropout off.
- ``update``: the ExGRPO update as plain torch functions (rows -> advantages -> loss -> steps, metrics).
- ``engine``: ``engine.UpdateEngine``, the model calls the update needs (``engine.RankEngine``: a DeepSpeed
  rank's, ``engine.ModelEngine``: a bare model's).
- ``batches``: groups as training rows, padded model inputs, micro-batch slices.
- ``logits``: log-probs and entropies of response tokens, whole or with lm_head in chunks.
- ``optim``: ``GuardedAdamW`` (the grad-norm rule) and the DeepSpeed config.
- ``group.LearnerGroup``: L learner actors in a placement group (``exgrpo.core.roles.Learners``).
- ``split``: the batch split over ranks and the NaN-aware metric combine (also the simulated group's).
- ``lora``: LoRA through PEFT, read back as merged HF weights; ``reference``: the initial policy (KL penalty).
- ``diagnostics``: the gradient's split by row origin (``learners.grad_share_every``).
"""
