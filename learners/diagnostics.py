"""Diagnostics of the ExGRPO update, off the training path: where its policy gradient comes from.

``gradient_shares`` splits one update's policy gradient by row origin (stored trajectories, fresh rollouts of
replay groups, fresh groups); ``learners.learner.Learner.update`` runs it every ``learners.grad_share_every``
steps, before the update, at the same weights. Torch only, like ``learners.update``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from exgrpo.core import metric_names as M
from exgrpo.core.algorithm import exgrpo_loss
from exgrpo.core.config import LossConfig
from exgrpo.core.records import Group
from learners.update import build_rows, encode, pad, response_stats

GRAD_PARTS = (
    ("stored", M.GRAD_NORM_STORED, M.GRAD_SHARE_STORED),
    ("replay_fresh", M.GRAD_NORM_REPLAY_FRESH, M.GRAD_SHARE_REPLAY_FRESH),
    ("fresh", M.GRAD_NORM_FRESH, M.GRAD_SHARE_FRESH),
)


def gradient_shares(
    model: torch.nn.Module,
    groups: Sequence[Group],
    *,
    loss: LossConfig,
    max_response_len: int,
    clip: bool,
    device: torch.device,
    chunk_tokens: int | None = None,
) -> dict[str, float]:
    """Where the update's policy gradient comes from (a diagnostic; no optimiser state or ``.grad`` touched).

    The rows split three ways: the stored trajectories in slot 0 of replay groups (``stored``), the fresh
    rollouts of replay groups (``replay_fresh``) and the rollouts of fresh groups (``fresh``). The policy
    loss is linear in the advantages token by token (the clipped and shaped surrogates too), so with the
    other rows' advantages set to 0 each part's gradient g_p is its exact contribution to the update's
    policy gradient g = sum_p g_p (the same normaliser; the entropy bonus left out). Returns each part's
    norm |g_p| and its share <g_p, g> / |g|^2 of the gradient along g (the shares sum to 1). One forward,
    three backwards (``torch.autograd.grad``), at the weights the update starts from."""
    rows, bounds = build_rows(groups, std_normalize=loss.std_normalize)
    in_replay_group = torch.zeros(len(rows), dtype=torch.bool)  # (N,)
    for g, lo, hi in zip(groups, bounds[:-1], bounds[1:], strict=True):
        in_replay_group[lo:hi] = g.kind == "replay"
    r_max = max(max(len(r.response_ids) for r in rows), 1)
    params = [p for p in model.parameters() if p.requires_grad]
    enc = encode(rows, r_max, device)
    logp = response_stats(model, enc, chunk_tokens=chunk_tokens, entropy=False)[0]  # (N, R), 0 at padding
    replayed = torch.tensor([r.replayed for r in rows], device=device)  # (N,)
    behaviour = pad([r.behaviour for r in rows], r_max).to(device)  # (N, R)
    old = torch.where(replayed.unsqueeze(1), behaviour, logp.detach())  # (N, R)
    advantages = torch.tensor([r.advantage for r in rows], device=device)  # (N,)
    masks = {
        "stored": replayed.cpu(),
        "replay_fresh": in_replay_group & ~replayed.cpu(),
        "fresh": ~in_replay_group,
    }
    flat: dict[str, Tensor] = {}
    for name, _, _ in GRAD_PARTS:
        value, _ = exgrpo_loss(
            logp=logp,
            old_logp=old,
            advantages=advantages * masks[name].to(device).float(),
            response_mask=enc.mask,
            replayed=replayed,
            clip=clip,
            norm_len=max_response_len if loss.norm == "constant" else None,
            cfg=loss,
        )
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        flat[name] = torch.cat(
            [
                (gr if gr is not None else torch.zeros_like(p)).reshape(-1).double()
                for gr, p in zip(grads, params, strict=True)
            ]
        )
    total = sum(flat.values())  # (P,)
    total_sq = float(total @ total)
    out = {M.GRAD_NORM_PG: total_sq**0.5}
    for name, norm_key, share_key in GRAD_PARTS:
        out[norm_key] = float(flat[name].norm())
        out[share_key] = float(flat[name] @ total) / total_sq if total_sq > 0 else math.nan
    return out
