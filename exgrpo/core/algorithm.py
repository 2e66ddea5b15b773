"""ExGRPO maths in pure torch: advantages, policy shaping, the token loss, the delayed-start switch.

No Ray, vLLM or DeepSpeed here; every function is unit-tested on tiny hand-written tensors.

Notation: N sequences (rows) of T response positions, G groups of K rollouts, V vocabulary size.

Advantage (Dr.GRPO)
    A_i = r_i - mean_{j in group} r_j                                   (no std division)
    optional GRPO variant: A_i = (r_i - mean) / (std + eps), std = sample std (unbiased, divisor K - 1,
    as torch.std and the GRPO reference implementations use). Zero-variance groups give A = 0 either way.

Loss per response token t of row i (``m_it`` = response mask, ``A_i`` = row advantage)
    fresh row:    w = exp(logp - old_logp)        old_logp = the learner's log-probs before this update
                  l = -min(w A, clip(w, 1-eps, 1+eps) A)     while clipping is on (before replay starts)
                  l = -w A                                   once clipping is removed (after replay starts)
                  l *= tis_it                                optional truncated importance weight (staleness)
    replayed row: w* = exp(logp - logp_behaviour)            logp_behaviour = log-probs stored with the trajectory
                  l = -A f(w*),  f(x) = x / (x + beta)       policy shaping, never clipped
                  (shaping off, the ablation: l = -A w*)
    pg_loss = (1/N) sum_i (sum_t m_it l_it) / L              constant normaliser L = max response length
            or  (sum_it m_it l_it) / (sum_it m_it)           token mean (norm_len=None)
    loss = pg_loss - c_H * (sum_it m_it H_it) / (sum_it m_it)   entropy bonus, H = token entropy at T=1

    Where shaping amplifies. A replayed token's gradient is -A f'(w*) grad w* = -A g(w*) grad logp with
    g(w) = w f'(w) = beta w / (w + beta)^2 (the factor on grad logp). Against plain importance weights
    (factor w) shaping scales by beta / (w + beta)^2, which exceeds 1 only for w < sqrt(beta) - beta
    (0.216 at beta = 0.1): it amplifies tokens the current policy now finds much less likely than the
    stored behaviour did, and damps every other one. Against a fresh on-policy token (factor w = 1) it
    never amplifies: g peaks at w = beta with g = 1/4, and g(1) = 0.083 at beta = 0.1. So a stored
    trajectory's own tokens weigh at most a quarter of a fresh token's; this bound is why replay needs no
    clipping. (A replay group also acts through the stored row's reward in the group mean: see
    docs/results.md, "Which channel".)

Deviations from the paper (arXiv 2510.02245) and its official code
    * Normaliser: the paper averages over the maximum response length; we use Dr.GRPO's constant
      normaliser ``norm_len`` (= ``model.max_response_len``) per sequence, then average over sequences.
      The official code divides each micro-batch's token sum by a fixed 8192 instead. ``norm_len=None``
      gives a plain token mean.
    * Weight of the entropy bonus. The official code adds, per micro-batch on each GPU,
          (sum of the micro-batch's token losses) / 8192 - 0.001 * (its mean token entropy)
      and averages the gradients over GPUs. Its recipe trains mini-batches of 64 prompts x 8 rollouts
      = 512 sequences on 8 GPUs, i.e. 64 sequences per GPU per optimiser step, with responses of up to
      8192 tokens. Writing S for the token-loss sum of those 64 sequences, its objective per GPU is
      S / 8192 - 0.001 H (one micro-batch; with gradient accumulation the same ratio holds per
      micro-batch). Ours with L = 8192 is (1/64) sum_i S_i / 8192 - c_H H = S / (64 * 8192) - c_H H.
      Equal relative weight therefore needs c_H = 0.001 / 64 = 1.5625e-5, the default of
      ``loss.entropy_coef`` (the knob stays; 0.001 reproduces the paper's text literally, which makes the
      entropy term 64x stronger relative to the policy gradient than in the official runs). That matching
      assumes one micro-batch per optimiser step; the official runs accumulate several (2-8 by its token
      budget), each adding its own bonus. ``loss.entropy_per: micro_batch`` does the same here
      (``learners/update.py``), so the bonus weighs the number of micro-batches times more.
    * Entropy follows the paper's definition (mean softmax entropy over response tokens only). The
      official code's entropy has a masking bug (its issue #57); we do not reproduce it.
    * Clipping is removed on all tokens once replay starts (the official ``loss_remove_clip``); the
      caller passes ``clip=False`` then. Before replay starts fresh tokens use the PPO clip (eps 0.2).
    * No KL term and no reference model, as in the official recipe. ``kl_k3`` is the optional penalty
      of ``loss.kl_coef`` (off by default; ``learners/reference.py``).
    * ``std_normalize`` (off by default) restores the GRPO std division.
    * ``tis_weight``: with asynchronous sampling, fresh tokens may be multiplied by a truncated importance
      weight min(exp(old_logp - sampler_logp), C) computed by the caller. It is detached here (a weight,
      not a path for gradients). Not in the paper.

Numerics: ratios are computed in float32; the log-ratio is zeroed at padded positions *before* exp, so
garbage there (e.g. logp = 1e4) can neither overflow nor leak NaN into values or gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from exgrpo.core.config import LossConfig

__all__ = [
    "DelayedStart",
    "LossStats",
    "exgrpo_loss",
    "group_advantages",
    "kl_k3",
    "masked_mean",
    "policy_shape",
    "token_entropy",
    "token_logprobs",
]


def group_advantages(rewards: Tensor, *, std_normalize: bool = False, eps: float = 1e-6) -> Tensor:
    """Per-group advantages: rewards (G, K) -> (G, K), A = r - mean_group(r) (Dr.GRPO).

    With ``std_normalize`` divide by (sample std + eps), std with divisor K - 1 (torch's default,
    as in GRPO reference code). A zero-variance group gives exactly 0 with or without it; K = 1 gives 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (G, K), got shape {tuple(rewards.shape)}")
    r = rewards.float()  # (G, K)
    centred = r - r.mean(dim=1, keepdim=True)  # (G, K)
    if not std_normalize or r.shape[1] < 2:
        return centred
    std = r.std(dim=1, keepdim=True, unbiased=True)  # (G, 1)
    return centred / (std + eps)  # (G, K)


def policy_shape(w: Tensor, *, beta: float = 0.1) -> Tensor:
    """Policy shaping f(w) = w / (w + beta), with f'(w) = beta / (w + beta)^2. Elementwise."""
    return w / (w + beta)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is true (along ``dim``, or over everything).

    Masked-out positions contribute exactly nothing (selected with ``where``, so NaN/inf there is harmless).
    An empty mask gives 0 (safe inside a loss).
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = m.sum() if dim is None else m.sum(dim=dim)
    summed = total.sum() if dim is None else total.sum(dim=dim)
    return summed / count.clamp(min=1).to(summed.dtype)


def token_entropy(logits: Tensor) -> Tensor:
    """Softmax entropy at temperature 1: (..., V) -> (...), H = -sum_v p_v log p_v, p = softmax(z).

    Computed in float32 from log_softmax, which subtracts the max first: stable for large logits and
    free of the cancellation in logsumexp(z) - sum_v p_v z_v when all logits share a large offset.
    Logits must be finite (a -inf logit gives 0 * -inf).
    """
    logq = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    return -(logq.exp() * logq).sum(dim=-1)  # (...)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log softmax(logits)[token]: (B, T, V), (B, T) -> (B, T), float32.

    Computed as gathered logit minus logsumexp, without materialising a full log_softmax. For
    half-precision logits the float32 logsumexp runs one row at a time, so at most one (T, V)
    float32 copy exists at once.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree")
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1).float()  # (B, T)
    if logits.dtype in (torch.float32, torch.float64):
        lse = torch.logsumexp(logits, dim=-1).float()  # (B, T)
    else:
        lse = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in logits])  # (B, T)
    return picked - lse  # (B, T)


def _check_shapes(logp: Tensor, named: dict[str, Tensor | None], rows: dict[str, Tensor]) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be (N, T), got shape {tuple(logp.shape)}")
    for name, t in named.items():
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}")
    for name, t in rows.items():
        if t.shape != logp.shape[:1]:
            raise ValueError(f"{name} must be (N,) = ({logp.shape[0]},), got {tuple(t.shape)}")


def _mean_or_nan(x: Tensor, mask: Tensor) -> float:
    """Detached masked mean as a python float; NaN when the mask is empty (no such tokens)."""
    n = int(mask.sum())
    return float(torch.where(mask, x, 0.0).sum()) / n if n else math.nan


@dataclass(frozen=True)
class LossStats:
    """What `exgrpo_loss` measured on one micro-batch (token means over the masks named; NaN where a mask is
    empty), read by the learner's per-step metrics (`learners.update.minibatch_metrics`)."""

    loss: float  # the returned loss: pg_loss minus the entropy bonus
    pg_loss: float
    clip_frac: float  # fresh tokens whose clipped term was active
    ratio_fresh_mean: float
    ratio_replay_mean: float
    shaped_replay_mean: float  # f(w*) on replayed tokens
    approx_kl: float  # (w - 1) - log w over fresh tokens
    num_tokens: int
    num_fresh_tokens: int
    num_replay_tokens: int
    entropy: float = math.nan  # mean token entropy, when the entropies were given
    kl: float | None = None  # the k3 KL to the reference, when the learner adds the penalty


def exgrpo_loss(
    *,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    replayed: Tensor,
    clip: bool,
    norm_len: int | None,
    cfg: LossConfig,
    entropy: Tensor | None = None,
    tis_weight: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """ExGRPO token loss over a batch of fresh and replayed rows (maths in the module docstring).

    Args:
        logp: (N, T) log-probs of the response tokens under the current weights (with grad).
        old_logp: (N, T) fresh rows: the learner's log-probs before this update; replayed rows: the
            behaviour log-probs stored with the trajectory.
        advantages: (N,) one advantage per row.
        response_mask: (N, T) true on response tokens, false on padding.
        replayed: (N,) bool, true for rows that are replayed trajectories.
        clip: PPO-clip fresh tokens (true before replay starts); replayed tokens are never clipped.
        norm_len: constant normaliser (max response length); None = mean over all response tokens.
        cfg: the loss settings; this function reads ``clip_eps``, ``beta``, ``policy_shaping`` (False = plain
            -A w* on replayed tokens, the "no policy shaping" ablation) and ``entropy_coef``. The caller turns
            the others into arguments: ``norm`` into ``norm_len``, ``remove_clip_after_replay`` into
            ``clip``, ``tis_cap`` into ``tis_weight``, ``std_normalize`` into ``advantages``.
        entropy: (N, T) token entropies under the current weights (with grad) for the bonus
            ``cfg.entropy_coef``; None = no bonus.
        tis_weight: (N, T) multiplier on fresh tokens' loss, already truncated by the caller.

    Returns:
        (loss, stats): ``LossStats`` of detached python numbers: ``loss``, ``pg_loss``, ``entropy`` (if
        given), ``clip_frac`` (share of fresh tokens whose clipped branch was taken, i.e. its gradient
        was zeroed), ``ratio_fresh_mean``, ``ratio_replay_mean`` (w*, before shaping),
        ``shaped_replay_mean``, ``approx_kl`` (k3 estimator (w - 1) - log w over fresh tokens),
        ``num_tokens``, ``num_fresh_tokens``, ``num_replay_tokens``. Token means over an empty set
        (e.g. no replayed rows) are NaN, not 0, so they cannot pass for real values; average them across
        micro-batches with a NaN-aware mean weighted by the token counts.
    """
    _check_shapes(
        logp,
        {"old_logp": old_logp, "response_mask": response_mask, "entropy": entropy, "tis_weight": tis_weight},
        {"advantages": advantages, "replayed": replayed},
    )
    if norm_len is not None and norm_len <= 0:
        raise ValueError(f"norm_len must be a positive token count or None, got {norm_len}")
    mask = response_mask.bool()  # (N, T)
    rep = replayed.bool().unsqueeze(1) & mask  # (N, T) replayed response tokens
    fresh = ~replayed.bool().unsqueeze(1) & mask  # (N, T) fresh response tokens
    adv = advantages.float().unsqueeze(1)  # (N, 1)

    # Zero the log-ratio at padding before exp: garbage there cannot overflow or produce NaN.
    log_ratio = torch.where(mask, logp.float() - old_logp.float(), 0.0)  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T), exactly 1 at padding

    # Fresh tokens: PPO-clip surrogate, or the plain surrogate -w A once clipping is removed.
    unclipped = -ratio * adv  # (N, T)
    if clip:
        clipped = -ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv  # (N, T)
        fresh_loss = torch.maximum(unclipped, clipped)  # (N, T) = -min(wA, clip(w)A)
        clip_active = fresh & (clipped > unclipped)  # (N, T)
    else:
        fresh_loss = unclipped  # (N, T)
        clip_active = torch.zeros_like(fresh)  # (N, T)
    if tis_weight is not None:
        fresh_loss = fresh_loss * torch.where(fresh, tis_weight.detach().float(), 1.0)  # (N, T)

    # Replayed tokens: shaped ratio f(w*), never clipped.
    shaped = policy_shape(ratio, beta=cfg.beta) if cfg.policy_shaping else ratio  # (N, T)
    replay_loss = -shaped * adv  # (N, T)

    token_loss = torch.where(rep, replay_loss, torch.where(fresh, fresh_loss, 0.0))  # (N, T)
    n_tokens = int(mask.sum())
    if norm_len is not None:
        pg_loss = (token_loss.sum(dim=1) / norm_len).mean()  # () mean over the N sequences
    else:
        pg_loss = token_loss.sum() / max(n_tokens, 1)  # () mean over response tokens

    loss = pg_loss
    mean_entropy = math.nan
    if entropy is not None:
        entropy_term = masked_mean(entropy.float(), mask)  # ()
        loss = loss - cfg.entropy_coef * entropy_term
        mean_entropy = float(entropy_term.detach())

    with torch.no_grad():
        r = ratio.detach()  # (N, T)
        stats = LossStats(
            loss=float(loss.detach()),
            pg_loss=float(pg_loss.detach()),
            clip_frac=_mean_or_nan(clip_active.float(), fresh),
            ratio_fresh_mean=_mean_or_nan(r, fresh),
            ratio_replay_mean=_mean_or_nan(r, rep),
            shaped_replay_mean=_mean_or_nan(shaped.detach(), rep),
            approx_kl=_mean_or_nan((r - 1.0) - log_ratio.detach(), fresh),
            num_tokens=n_tokens,
            num_fresh_tokens=int(fresh.sum()),
            num_replay_tokens=int(rep.sum()),
            entropy=mean_entropy,
        )
    return loss, stats


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor, *, norm_len: int | None) -> Tensor:
    """() the k3 estimate of KL(current || reference) from (n, R) log-probs of the sampled tokens.

    Per response token k3 = exp(ref - logp) - (ref - logp) - 1: never negative, exactly 0 where the two
    policies agree, with gradient 1 - exp(ref - logp) in logp. Normalised like ``exgrpo_loss``'s policy loss
    (per sequence over ``norm_len``, then the mean over sequences; or the token mean when None), so a
    caller's micro-batch weights for the policy loss apply to it unchanged. Padding contributes 0."""
    d = torch.where(mask, ref_logp.float() - logp.float(), 0.0)  # (n, R) 0 at padding: k3 = 0 there
    k3 = torch.exp(d) - d - 1.0  # (n, R)
    if norm_len is not None:
        return (k3.sum(dim=1) / norm_len).mean()
    return k3.sum() / mask.sum().clamp(min=1)


class DelayedStart:
    """Latching switch for the delayed start of replay.

    ``update(solve_ratio=...)`` turns it on for good once a step's fresh solve ratio is strictly greater
    than ``threshold``. ``threshold <= 0`` means "on from the start": ``started`` is already true at
    construction (a strict comparison alone would never fire on a step that solves nothing).
    """

    def __init__(self, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"threshold must be finite, got {threshold}")
        self.threshold = float(threshold)
        self._started = self.threshold <= 0.0

    @property
    def started(self) -> bool:
        """Whether replay has started (never goes back to false)."""
        return self._started

    def update(self, *, solve_ratio: float) -> bool:
        """Record one step's fresh solve ratio in [0, 1]; returns ``started`` after the update."""
        if not 0.0 <= solve_ratio <= 1.0:  # also rejects NaN
            raise ValueError(f"solve_ratio must lie in [0, 1], got {solve_ratio}")
        if solve_ratio > self.threshold:
            self._started = True
        return self._started

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: the threshold and the latch."""
        return {"threshold": self.threshold, "started": self._started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the latch; the threshold stays the one this object was built with (from the config).

        A started run stays started. A not-yet-started run resumed under a threshold <= 0 starts at once.
        """
        self._started = bool(state["started"]) or self.threshold <= 0.0

    def __repr__(self) -> str:
        return f"DelayedStart(threshold={self.threshold}, started={self._started})"
