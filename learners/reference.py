"""The initial policy on the learner: the reference of the optional KL penalty, and what a run resumes on.

``loss.kl_coef`` = c > 0 adds c * KL to each micro-batch's objective, KL the k3 estimator per response token
    k3 = exp(ref - logp) - (ref - logp) - 1        (>= 0, exactly 0 where logp = ref)
averaged with the policy loss's normaliser (``exgrpo.core.algorithm.kl_k3``), so the caller's mini-batch weights apply unchanged.
Its gradient in logp is 1 - exp(ref - logp): it pulls each token back toward the reference.

The reference is the initial policy. With LoRA it is the base model with its adapters switched off (PEFT's
``disable_adapter``): no second copy of the weights, one extra no-grad forward per micro-batch. Without
LoRA it is a frozen copy of the initial weights on the learner (one more copy of the model in memory).

Those frozen tensors (LoRA's base, or the copy) must be the same after a resume. A resumed run starts from
its checkpoint's merged weights, so ``Learner.save`` records where the initial weights came from and their
checksum, and ``restore_initial`` reloads them from there when the learner started elsewhere.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from learners.batches import Encoded
from learners.logits import response_stats


class Reference:
    """No-grad log-probs of the initial policy: the adapters off (``lora=True``) or a frozen copy."""

    def __init__(self, model: torch.nn.Module, *, lora: bool) -> None:
        """``model``: the (PEFT-wrapped, with LoRA) model before any update, so a copy is the initial one."""
        self.lora = lora
        self.frozen = None if lora else copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, enc: Encoded, *, chunk_tokens: int | None = None) -> Tensor:
        """(n, R) the reference's log-probs of ``enc``'s response tokens (0 at padding; ``chunk_tokens``:
        ``learners.update.response_stats``); ``model`` is the trained PEFT model."""
        if self.frozen is not None:
            return response_stats(self.frozen, enc, chunk_tokens=chunk_tokens, entropy=False)[0]
        with model.disable_adapter():
            return response_stats(model, enc, chunk_tokens=chunk_tokens, entropy=False)[0]


def checksum(tensors: Mapping[str, Tensor]) -> float:
    """float64 sum of the tensors, in order: the identity a checkpoint records for the initial weights."""
    return float(sum(t.detach().double().sum() for t in tensors.values()))


def restore_initial(tensors: Mapping[str, Tensor], recorded: Mapping[str, Any], *, dtype: torch.dtype) -> str:
    """Make ``tensors`` (HF names) the initial weights a checkpoint recorded (``{"path", "checksum"}``);
    returns their path. A no-op when they already are; else they are reloaded from the recorded path, and a
    base that changed on disk since (another checksum) is refused."""
    path, want = str(recorded["path"]), float(recorded["checksum"])
    if checksum(tensors) == want:
        return path
    from transformers import AutoModelForCausalLM

    source = dict(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).named_parameters())
    if missing := sorted(set(tensors) - set(source)):
        raise ValueError(
            f"the initial model at {path} lacks {missing[:3]}: not the model this run started from"
        )
    with torch.no_grad():
        for name, t in tensors.items():
            t.copy_(source[name])
    if (got := checksum(tensors)) != want:
        raise ValueError(
            f"the initial model at {path} changed since the checkpoint was written (checksum {got!r}, "
            f"recorded {want!r}); resume with the model this run started from"
        )
    return path
