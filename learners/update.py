"""The ExGRPO update as plain torch functions: an update engine (``learners/engine.py::UpdateEngine``), the batch's
groups and config values in; gradients, optimiser steps and ``learner/*`` metrics out. Nothing here imports Ray,
DeepSpeed or vLLM, so ``bench/learner/device_check.py`` runs the very update ``learners.learner.Learner`` runs.

One ``update``: rows and advantages (``build_rows``), the proximal log-probs (``old_logprobs``, skipped when
``reuses_proximal``), mini-batches of whole groups in micro-batches (``minibatch_backward``), then the metrics.
Invariant: gradient accumulation is exact, so the accumulated, rank-averaged gradient is exgrpo_loss's over the
whole mini-batch. The weights: docs/architecture.md ("The algorithm"); tests: tests/learners/test_update.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import Tensor

from exgrpo.core import metric_names as M
from exgrpo.core.algorithm import (
    LossStats,
    exgrpo_loss,
    kl_k3,
    masked_mean,
)
from exgrpo.core.config import LossConfig
from exgrpo.core.records import Group
from learners.batches import PADDING_ROW, Row, build_rows, encode, pad
from learners.engine import UpdateEngine
from learners.logits import per_token, response_stats


class Part(NamedTuple):
    """One non-empty micro-batch of an optimiser step: what its metrics are weighted by."""

    stats: LossStats  # exgrpo_loss's (with the KL penalty's k3 in `kl`)
    rows: int
    tokens: int  # response tokens


def weighted(pairs: Sequence[tuple[float, float]]) -> float:
    """Weighted mean of (value, weight) pairs, skipping zero weights and NaN values; NaN if none."""
    kept = [(v, w) for v, w in pairs if w > 0 and not math.isnan(v)]
    total = sum(w for _, w in kept)
    return sum(v * w for v, w in kept) / total if total > 0 else math.nan


def reuses_proximal(*, minibatches: int, tis_cap: float | None, reuse: bool = True) -> bool:
    """Whether the mini-batch's own forward supplies the proximal log-probs (the no-grad pass skipped):
    one mini-batch (no step before it) and no TIS weight (which needs them before the forward)."""
    return reuse and minibatches == 1 and tis_cap is None


def old_logprobs(
    rows: Sequence[Row], r_max: int, proximal: Tensor | None, *, tis_cap: float | None
) -> tuple[Tensor, Tensor | None]:
    """(old_logp (N, R), tis (N, R) or None) from the no-grad log-probs ``proximal`` (N, R) of the current
    weights. ``proximal=None`` (``reuses_proximal``): old_logp holds the behaviour log-probs, whose fresh
    rows ``minibatch_backward(..., proximal_is_current=True)`` replaces by the forward's detached log-probs."""
    behaviour = pad([r.behaviour for r in rows], r_max)  # (N, R)
    if proximal is None:
        return behaviour, None
    replayed = torch.tensor([r.replayed for r in rows])  # (N,)
    old_logp = torch.where(replayed.unsqueeze(1), behaviour, proximal)  # (N, R)
    tis = None
    if tis_cap is not None:
        tis = torch.exp(proximal - behaviour).clamp(max=tis_cap)  # (N, R)
    return old_logp, tis


def minibatch_slices(bounds: Sequence[int], minibatches: int) -> list[slice]:
    """Row slices of ``minibatches`` mini-batches of whole groups (``bounds``: the G + 1 group bounds)."""
    per = (len(bounds) - 1) // minibatches
    return [slice(bounds[m * per], bounds[(m + 1) * per]) for m in range(minibatches)]


def minibatch_totals(
    rows: Sequence[Row], *, device: torch.device, all_reduce: Callable[[Tensor], object] | None = None
) -> tuple[float, float]:
    """(N, T): rows and response tokens (at least 1) of the mini-batch, summed over ranks by ``all_reduce``."""
    totals = torch.tensor(
        [len(rows), sum(len(r.response_ids) for r in rows)], dtype=torch.float64, device=device
    )  # (2,)
    if all_reduce is not None:
        all_reduce(totals)
    return float(totals[0]), max(float(totals[1]), 1.0)


@dataclass(frozen=True)
class MiniBatch:
    """One optimiser step's rows and what their loss needs beside the model: ``old_logp`` / ``tis`` (n, R),
    ``totals`` (``minibatch_totals``: rows and response tokens over all ranks) and ``r_max``."""

    rows: Sequence[Row]
    old_logp: Tensor  # (n, R)
    tis: Tensor | None  # (n, R) or None
    r_max: int
    totals: tuple[float, float]


def minibatch_backward(
    engine: UpdateEngine,
    mb: MiniBatch,
    *,
    loss: LossConfig,
    max_response_len: int,
    clip: bool,
    proximal_is_current: bool = False,
    seen: Tensor | None = None,
) -> list[Part]:
    """Forward every micro-batch of one mini-batch (``engine.micro_batches``) and hand its weighted objective
    to ``engine.backward``.

    ``engine.boundary`` (is this the last micro-batch) runs before each forward. ``proximal_is_current``:
    ``mb.old_logp`` holds only the replayed rows' log-probs; fresh rows take this forward's detached log-probs
    (the weights have not moved since the update began). With ``engine.has_reference``, its
    ``reference_logprobs(enc)`` ((n, R), no grad) give the KL penalty ``loss.kl_coef * kl_k3`` (weighted like
    the policy loss; metric ``kl``). ``seen`` (n, R), when given, receives each forward's detached log-probs
    (the current weights' with ``proximal_is_current``). Returns the non-empty micro-batches' metrics, rows
    and tokens."""
    rows, old_logp, tis, r_max, totals = mb.rows, mb.old_logp, mb.tis, mb.r_max, mb.totals
    device, world_size, slices = engine.device, engine.world_size, engine.micro_batches(mb.rows)
    n_all, t_all = totals
    norm_len = max_response_len if loss.norm == "constant" else None
    lengths = [len(r.response_ids) for r in rows]
    parts: list[Part] = []
    for j, sl in enumerate(slices):
        engine.boundary(j == len(slices) - 1)
        chunk = rows[sl]
        n_j, t_j = len(chunk), sum(lengths[sl])
        enc = encode(chunk or [PADDING_ROW], r_max, device, pack=engine.pack)
        logp, ent = response_stats(
            engine.module, enc, chunk_tokens=engine.chunk_tokens
        )  # (n, R) each, 0 at padding
        replayed = torch.tensor([r.replayed for r in chunk] or [False], device=device)  # (n,)
        old = logp.detach()  # (n, R) the proximal log-probs when they are the current ones
        if seen is not None and n_j:
            seen[sl] = old.float().cpu()
        if n_j and proximal_is_current:
            old = torch.where(replayed.unsqueeze(1), old_logp[sl].to(device), old)  # (n, R)
        elif n_j:
            old = old_logp[sl].to(device)  # (n, R)
        value, stats = exgrpo_loss(
            logp=logp,
            old_logp=old,
            advantages=torch.tensor([r.advantage for r in chunk] or [0.0], device=device),  # (n,)
            response_mask=enc.mask,
            replayed=replayed,
            clip=clip,
            norm_len=norm_len,
            cfg=loss,
            entropy=ent,
            tis_weight=tis[sl].to(device) if tis is not None and n_j else None,  # (n, R)
        )
        w_pg = world_size * (n_j / n_all if norm_len is not None else t_j / t_all)
        w_h = world_size * t_j / t_all if loss.entropy_per == "minibatch" else 1.0
        objective = w_pg * value + loss.entropy_coef * (w_pg - w_h) * masked_mean(ent, enc.mask)  # ()
        if engine.has_reference:
            kl = kl_k3(logp, engine.reference_logprobs(enc), enc.mask, norm_len=norm_len)  # ()
            objective = objective + loss.kl_coef * w_pg * kl
            stats = replace(stats, kl=float(kl.detach()))
        engine.backward(objective)
        if n_j:
            parts.append(Part(stats, rows=n_j, tokens=t_j))
    return parts


def minibatch_metrics(
    parts: Sequence[Part],
    *,
    constant: bool,
    entropy_coef: float,
    grad_norm: float,
    skipped: bool,
    grad_clip: float | None = None,
    kl_coef: float = 0.0,
) -> dict[str, float]:
    """``learner/*`` metrics of one optimiser step from its micro-batches' (``constant``: the constant
    normaliser, so the policy loss and the KL are row means; else token means)."""
    by = [p.rows if constant else p.tokens for p in parts]  # the policy loss's and the KL's weights
    pg = weighted([(p.stats.pg_loss, w) for p, w in zip(parts, by, strict=True)])
    ent = weighted([(p.stats.entropy, p.tokens) for p in parts])
    fresh = [(p.stats, float(p.stats.num_fresh_tokens)) for p in parts]
    kl = {}
    if any(p.stats.kl is not None for p in parts):
        kl = {M.KL: weighted([(p.stats.kl or 0.0, w) for p, w in zip(parts, by, strict=True)])}
    return {
        **kl,
        M.LOSS: pg - entropy_coef * ent + kl_coef * kl.get(M.KL, 0.0),
        M.PG_LOSS: pg,
        M.ENTROPY: ent,
        M.CLIP_FRAC: weighted([(s.clip_frac, f) for s, f in fresh]),
        M.RATIO_FRESH: weighted([(s.ratio_fresh_mean, f) for s, f in fresh]),
        M.RATIO_REPLAY: weighted(
            [(p.stats.ratio_replay_mean, float(p.stats.num_replay_tokens)) for p in parts]
        ),
        M.APPROX_KL: weighted([(s.approx_kl, f) for s, f in fresh]),
        M.GRAD_NORM: grad_norm,
        M.SKIPPED_STEPS: float(skipped),
        M.CLIPPED_STEPS: float(grad_clip is not None and not skipped and grad_norm > grad_clip),
        M.LEARNER_TOKENS: float(sum(p.tokens for p in parts)),
    }


def update_metrics(history: Sequence[dict[str, float]]) -> dict[str, float]:
    """The update's metrics: the mean over its optimiser steps (NaN-aware); skipped steps and tokens summed."""
    out = {k: weighted([(h[k], 1.0) for h in history]) for k in history[0]}
    out[M.SKIPPED_STEPS] = sum(h[M.SKIPPED_STEPS] for h in history)
    out[M.CLIPPED_STEPS] = sum(h[M.CLIPPED_STEPS] for h in history)
    out[M.LEARNER_TOKENS] = sum(h[M.LEARNER_TOKENS] for h in history)
    return out


def update(
    engine: UpdateEngine,
    groups: Sequence[Group],
    *,
    loss: LossConfig,
    minibatches: int,
    max_response_len: int,
    clip: bool,
    reuse_proximal: bool = True,
    grad_clip: float | None = None,
    version: int | None = None,
    gap_bound: float | None = None,
    gaps: list[tuple[int, int, float, int]] | None = None,
) -> dict[str, float]:
    """One ExGRPO update of this process's whole groups; returns ``learner/*`` metrics.

    ``engine`` (``learners.engine.UpdateEngine``) is what differs between a DeepSpeed rank and a plain model:
    the forward module, the micro-batches of a mini-batch, the accumulation boundary, backward, the optimiser
    step (grad norm, skipped), the sum over ranks and, exactly when ``loss.kl_coef`` > 0, the reference's
    log-probs for the KL penalty (``minibatch_backward``). The proximal pass is ``per_token`` over the
    engine's module and micro-batches. ``reuse_proximal=False`` always runs that no-grad pass (tests compare
    the two paths). ``grad_clip``: the caller's clip threshold, to count the optimiser steps it scaled down
    (``learner/clipped_steps``). The accumulation weights stay exact whatever the micro-batches (row or
    token-budget ones): they are per micro-batch rows and tokens over the mini-batch's totals.

    ``gap_bound`` (with ``version``, the weights' version): the ``rollout/logprob_gap_*`` metrics of the fresh
    tokens sampled at ``version`` (``logprob_gap``), from the log-probs the update computes anyway at the
    current weights (the proximal pass, or the single mini-batch's forward), summed over ranks; ``gaps``
    receives the per-request rows."""
    start = time.perf_counter()
    if engine.has_reference != (loss.kl_coef > 0):
        raise ValueError(f"loss.kl_coef={loss.kl_coef} needs a reference policy exactly when it is > 0")
    if not groups or len(groups) % minibatches:
        raise ValueError(
            f"{len(groups)} groups cannot be split into learners.minibatches={minibatches} "
            "mini-batches of whole groups"
        )
    rows, bounds = build_rows(groups, std_normalize=loss.std_normalize)
    r_max = max(max(len(r.response_ids) for r in rows), 1)
    current = reuses_proximal(minibatches=minibatches, tis_cap=loss.tis_cap, reuse=reuse_proximal)
    proximal = None
    if not current:  # (N, R) current weights, no grad
        proximal = per_token(
            engine.module,
            rows,
            r_max,
            "logp",
            slices=engine.micro_batches(rows),
            device=engine.device,
            chunk_tokens=engine.chunk_tokens,
            pack=engine.pack,
        )
    old_logp, tis = old_logprobs(rows, r_max, proximal, tis_cap=loss.tis_cap)  # (N, R) each
    measure = gap_bound is not None and version is not None
    seen = torch.zeros(len(rows), r_max) if measure and current else None  # (N, R) the forward's log-probs
    history = []
    for sl in minibatch_slices(bounds, minibatches):
        mb = MiniBatch(
            rows[sl],
            old_logp[sl],
            tis[sl] if tis is not None else None,
            r_max=r_max,
            totals=minibatch_totals(rows[sl], device=engine.device, all_reduce=engine.all_reduce),
        )
        parts = minibatch_backward(
            engine,
            mb,
            loss=loss,
            max_response_len=max_response_len,
            clip=clip,
            proximal_is_current=current,
            seen=seen[sl] if seen is not None else None,
        )
        grad_norm, skipped = engine.step()
        history.append(
            minibatch_metrics(
                parts,
                constant=loss.norm == "constant",
                entropy_coef=loss.entropy_coef,
                grad_norm=grad_norm,
                skipped=skipped,
                grad_clip=grad_clip,
                kl_coef=loss.kl_coef,
            )
        )
    out = update_metrics(history)
    if measure:
        assert gap_bound is not None and version is not None
        current_logp = proximal if proximal is not None else seen
        assert current_logp is not None
        metrics, per_request = logprob_gap(
            groups,
            bounds,
            current_logp,
            pad([r.behaviour for r in rows], r_max),
            version=version,
            bound=gap_bound,
            all_reduce=engine.all_reduce,
            device=engine.device,
        )
        out.update(metrics)
        if gaps is not None:
            gaps.extend(per_request)
    out[M.LEARNER_UPDATE_TIME] = time.perf_counter() - start
    return out


# |gap| histogram edges for the p99 that sums over ranks: 20 bins per decade from 1e-9 to 100 nats
GAP_EDGES = torch.logspace(-9, 2, 221, dtype=torch.float64)  # (E,)


def compared_tokens(groups: Sequence[Group], r_max: int, *, version: int) -> Tensor:
    """(N, R) bool, rows in ``build_rows`` order: the fresh (not replayed) response tokens sampled at
    ``version`` (a token of a response whose weights changed mid-way counts with its own version)."""
    mask = torch.zeros(sum(len(g.trajectories) for g in groups), r_max, dtype=torch.bool)  # (N, R)
    i = 0
    for g in groups:
        for t in g.trajectories:
            if not t.replayed:
                mask[i, : len(t.response_ids)] = torch.tensor(t.token_versions(), dtype=torch.long) == version
            i += 1
    return mask


def logprob_gap(
    groups: Sequence[Group],
    bounds: Sequence[int],
    current: Tensor,
    behaviour: Tensor,
    *,
    version: int,
    bound: float,
    all_reduce: Callable[[Tensor], object],
    device: torch.device,
) -> tuple[dict[str, float], list[tuple[int, int, float, int]]]:
    """The ``rollout/logprob_gap_*`` metrics and per-request rows (request id, tokens, sum of |gap|, tokens
    past ``bound``) of |current - behaviour| ((N, R) each: the learner's log-probs at the weights of
    ``version`` and the sampler's) over ``compared_tokens``. Counts, sums and a |gap| histogram are summed
    over ranks by ``all_reduce`` (every rank calls it), so the mean, the share past the bound and the p99
    (the upper edge of its histogram bin, within 12%) are the whole batch's."""
    mask = compared_tokens(groups, current.shape[1], version=version)  # (N, R)
    gap = torch.where(mask, (current.double() - behaviour.double()).abs(), 0.0)  # (N, R)
    over = mask & (gap > bound)  # (N, R)
    values = gap[mask]  # (T,)
    hist = torch.bincount(torch.bucketize(values, GAP_EDGES), minlength=len(GAP_EDGES) + 1)  # (E + 1,)
    totals = torch.cat(
        [torch.tensor([float(mask.sum()), float(values.sum()), float(over.sum())]), hist.double()]
    ).to(device)  # (3 + E + 1,)
    all_reduce(totals)
    totals = totals.cpu()
    tokens, total, past = float(totals[0]), float(totals[1]), float(totals[2])
    p99 = math.nan
    if tokens > 0:
        k = int(torch.searchsorted(totals[3:].cumsum(0), 0.99 * tokens))
        p99 = float(GAP_EDGES[k]) if k < len(GAP_EDGES) else math.inf
    metrics = {
        M.LOGPROB_GAP_TOKENS: tokens,
        M.LOGPROB_GAP_MEAN: total / tokens if tokens else math.nan,
        M.LOGPROB_GAP_P99: p99,
        M.LOGPROB_GAP_OVER: past / tokens if tokens else math.nan,
    }
    per_request = []
    for g, a, b in zip(groups, bounds[:-1], bounds[1:], strict=True):
        n = int(mask[a:b].sum())
        if n:
            per_request.append((g.request_id, n, float(gap[a:b].sum()), int(over[a:b].sum())))
    return metrics, per_request
