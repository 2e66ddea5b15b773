"""Hand-derived checks of the ExGRPO maths in exgrpo/core/algorithm.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from exgrpo.core.algorithm import (
    DelayedStart,
    exgrpo_loss,
    group_advantages,
    masked_mean,
    policy_shape,
    token_entropy,
    token_logprobs,
)
from exgrpo.core.config import LossConfig

torch.set_num_threads(1)

E_HALF = math.exp(0.5)  # 1.6487212707
E_MHALF = math.exp(-0.5)  # 0.6065306597
LOSS = LossConfig()  # clip eps 0.2, beta 0.1, shaping on: the values the hand derivations below use
BONUS = LossConfig(entropy_coef=0.01)  # the same with an entropy bonus of 0.01


# ---------------------------------------------------------------- advantages


def test_group_advantages_dr_grpo():
    # group 0: mean 0.5 -> [0.5, -0.5, -0.5, 0.5]; group 1: all solved, zero variance -> 0;
    # group 2: mean 0.25 -> [0.75, -0.25, -0.25, -0.25].
    r = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    a = group_advantages(r)
    want = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]])
    torch.testing.assert_close(a, want)


def test_group_advantages_std_normalize_uses_sample_std():
    # [1,0,0,1]: squared deviations 4 * 0.25 = 1, sample var 1/3, std 0.57735 -> 0.5 / 0.57735 = 0.866025.
    # [1,0,0,0]: squared deviations 0.5625 + 3 * 0.0625 = 0.75, var 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5].
    # [0,0,0,0]: zero variance -> 0 (not NaN).
    r = torch.tensor([[1.0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    a = group_advantages(r, std_normalize=True)
    s = 0.5 / (1 / math.sqrt(3) + 1e-6)
    want = torch.tensor([[s, -s, -s, s], [1.5, -0.5, -0.5, -0.5], [0, 0, 0, 0]])
    torch.testing.assert_close(a, want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(a).all()


def test_group_advantages_rejects_flat_rewards():
    with pytest.raises(ValueError, match=r"\(G, K\)"):
        group_advantages(torch.tensor([1.0, 0.0]))


# ---------------------------------------------------------------- policy shaping


def test_policy_shape_values_and_gradient():
    # f(w) = w / (w + 0.1): f(0) = 0, f(0.1) = 0.5, f(0.4) = 0.8, f(1) = 1/1.1 = 0.909091, f(0.9) = 0.9.
    # f'(w) = 0.1 / (w + 0.1)^2: 10, 2.5, 0.4, 0.0826446, 0.1.
    w = torch.tensor([0.0, 0.1, 0.4, 1.0, 0.9], requires_grad=True)
    f = policy_shape(w, beta=0.1)
    torch.testing.assert_close(f.detach(), torch.tensor([0.0, 0.5, 0.8, 1 / 1.1, 0.9]))
    f.sum().backward()
    torch.testing.assert_close(w.grad, torch.tensor([10.0, 2.5, 0.4, 0.1 / 1.21, 0.1]))


# ---------------------------------------------------------------- the loss on a 2 x 3 batch
#
# Row 0 fresh,    A = +1.0, log-ratio [0.5, 0, -0.5] -> w = [1.648721, 1, 0.606531], all 3 tokens real.
# Row 1 replayed, A = -0.5, log-ratio [0, ln 0.1, pad] -> w* = [1, 0.1, -], f(w*) = [0.909091, 0.5].
# Clip on (eps 0.2), A > 0 so per token -min(w, clip(w)) * A:
#   token 0: min(1.648721, 1.2) = 1.2 (clipped), token 1: 1, token 2: min(0.606531, 0.8) = 0.606531
#   -> row 0 sum -2.806531. Clip off: -(1.648721 + 1 + 0.606531) = -3.255252.
# Row 1: -A f = 0.5 * [0.909091, 0.5] = [0.454545, 0.25], sum 0.704545 (never clipped).
# norm_len = 4: mean over 2 rows of (row sum / 4)  -> clip on (-2.806531 + 0.704545) / 8 = -0.262748
#                                                    clip off (-3.255252 + 0.704545) / 8 = -0.318838
# token mean over 5 tokens:                        -> clip on -2.101985 / 5 = -0.420397
#                                                    clip off -2.550706 / 5 = -0.510141
ROW0 = {True: -(1.2 + 1 + E_MHALF), False: -(E_HALF + 1 + E_MHALF)}
ROW1 = 0.5 / 1.1 + 0.25


def _batch(garbage: float = 0.0):
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -7.0]])
    logp = old + torch.tensor([[0.5, 0.0, -0.5], [0.0, math.log(0.1), 0.0]])
    logp[1, 2] = garbage if garbage else logp[1, 2]
    return dict(
        logp=logp.clone().requires_grad_(True),
        old_logp=old,
        advantages=torch.tensor([1.0, -0.5]),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
        replayed=torch.tensor([False, True]),
    )


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("norm_len", [4, None])
def test_loss_hand_values(clip, norm_len):
    b = _batch()
    loss, m = exgrpo_loss(**b, clip=clip, norm_len=norm_len, cfg=LOSS)
    want = (ROW0[clip] + ROW1) / (8 if norm_len == 4 else 5)
    hand = {(True, 4): -0.262748, (False, 4): -0.318838, (True, None): -0.420397, (False, None): -0.510141}
    assert want == pytest.approx(hand[clip, norm_len], abs=1e-6)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert m.loss == m.pg_loss == pytest.approx(want, rel=1e-5)
    assert m.num_tokens == 5 and m.num_fresh_tokens == 3 and m.num_replay_tokens == 2
    # Only token 0 of the fresh row takes the clipped branch (token 2 is below 0.8 but A > 0 keeps w).
    assert m.clip_frac == pytest.approx(1 / 3 if clip else 0.0)
    assert m.ratio_fresh_mean == pytest.approx((E_HALF + 1 + E_MHALF) / 3)  # 1.085084
    assert m.ratio_replay_mean == pytest.approx(0.55)  # (1 + 0.1) / 2
    assert m.shaped_replay_mean == pytest.approx(ROW1)  # (0.909091 + 0.5) / 2 = 0.704545
    # k3 per fresh token (w - 1) - log w: 0.148721, 0, 0.106531 -> mean 0.085084.
    assert m.approx_kl == pytest.approx((E_HALF - 1.5 + E_MHALF - 0.5) / 3)
    assert math.isnan(m.entropy) and m.kl is None  # no entropies given; the KL is the learner's


def test_loss_gradients_clip_on_constant_normaliser():
    # d loss / d logp = d l / d log w, divided by N * norm_len = 8.
    # Fresh, clip on: token 0 clipped -> 0; token 1: -w A = -1 -> -0.125; token 2: -0.606531 / 8 = -0.075816.
    # Replayed: d(-A f(w))/d log w = -A w beta / (w + beta)^2:
    #   w = 1: 0.5 * 0.1 / 1.21 = 0.041322 -> 0.005165; w = 0.1: 0.5 * 0.1 * 0.1 / 0.04 = 0.125 -> 0.015625.
    b = _batch()
    loss, _ = exgrpo_loss(**b, clip=True, norm_len=4, cfg=LOSS)
    loss.backward()
    want = torch.tensor([[0.0, -1.0, -E_MHALF], [0.05 / 1.21, 0.125, 0.0]]) / 8
    torch.testing.assert_close(b["logp"].grad, want)


def test_padded_garbage_changes_nothing():
    clean, dirty = _batch(), _batch(garbage=1e4)
    ent = torch.full((2, 3), 0.7)
    ent_dirty = ent.clone()
    ent_dirty[1, 2] = float("nan")
    tis = torch.ones(2, 3)
    tis[1, 2] = float("inf")
    l0, m0 = exgrpo_loss(**clean, clip=True, norm_len=4, cfg=BONUS, entropy=ent)
    l1, m1 = exgrpo_loss(**dirty, clip=True, norm_len=4, cfg=BONUS, entropy=ent_dirty, tis_weight=tis)
    l0.backward()
    l1.backward()
    assert l1.item() == l0.item()
    assert torch.equal(dirty["logp"].grad, clean["logp"].grad)
    assert dirty["logp"].grad[1, 2] == 0.0
    assert all(math.isfinite(v) for v in dataclasses.astuple(m1) if v is not None)
    assert m1 == m0


def test_replayed_rows_never_clipped():
    # Replayed w* = e^3 = 20.0855, far above 1 + eps. With clip on it still gets gradient through f:
    # d(-A f(w))/d log w = -A w beta / (w + beta)^2 = 1 * 20.0855 * 0.1 / 20.1855^2 = 0.0049296 (A = -1),
    # normalised by 1 row * norm_len 1. Loss = -A f = 20.0855 / 20.1855 = 0.995046.
    logp = torch.tensor([[3.0]], requires_grad=True)
    kw = dict(
        old_logp=torch.zeros(1, 1),
        advantages=torch.tensor([-1.0]),
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        replayed=torch.tensor([True]),
        norm_len=1,
    )
    w = math.exp(3.0)
    loss, m = exgrpo_loss(logp=logp, **kw, clip=True, cfg=LOSS)
    loss.backward()
    assert loss.item() == pytest.approx(w / (w + 0.1), rel=1e-6)
    assert logp.grad.item() == pytest.approx(w * 0.1 / (w + 0.1) ** 2, rel=1e-5)
    assert math.isnan(m.clip_frac) and math.isnan(m.approx_kl)  # no fresh tokens
    # The no-shaping ablation: -A w* = 20.0855, gradient 20.0855, still unclipped.
    logp.grad = None
    loss, _ = exgrpo_loss(logp=logp, **kw, clip=True, cfg=LossConfig(policy_shaping=False))
    loss.backward()
    assert loss.item() == pytest.approx(w, rel=1e-6)
    assert logp.grad.item() == pytest.approx(w, rel=1e-6)


def test_clip_frac_counts_taken_clipped_branch_only():
    # eps 0.2, four fresh tokens in one row:
    #   A = +1, w = 1.5: min(1.5, 1.2) -> clipped (active)
    #   A = +1, w = 0.5: min(0.5, 0.8) = 0.5 -> unclipped branch, not active
    # second row A = -1: -min(-w, -clip(w)) = max(w, clip(w)):
    #   w = 0.5: max(0.5, 0.8) = 0.8 -> clipped (active); w = 1.5: max(1.5, 1.2) = 1.5 -> not active
    # -> 2 of 4 fresh tokens; the replayed row (w = 5) counts nowhere.
    logp = torch.log(torch.tensor([[1.5, 0.5], [0.5, 1.5], [5.0, 5.0]]))
    _, m = exgrpo_loss(
        logp=logp,
        old_logp=torch.zeros(3, 2),
        advantages=torch.tensor([1.0, -1.0, 1.0]),
        response_mask=torch.ones(3, 2, dtype=torch.bool),
        replayed=torch.tensor([False, False, True]),
        clip=True,
        norm_len=None,
        cfg=LOSS,
    )
    assert m.clip_frac == pytest.approx(0.5)
    assert m.ratio_replay_mean == pytest.approx(5.0)
    assert m.shaped_replay_mean == pytest.approx(5.0 / 5.1)


def test_entropy_bonus_lowers_loss_with_more_entropy():
    # Bonus: loss -= 0.01 * masked mean entropy. Entropy 0.7 on the 5 real tokens (the pad says 100):
    # loss shifts by -0.007; d loss / d H = -0.01 / 5 = -0.002 per real token, 0 at the pad.
    b = _batch()
    ent = torch.tensor([[0.7, 0.7, 0.7], [0.7, 0.7, 100.0]], requires_grad=True)
    base, _ = exgrpo_loss(**_batch(), clip=True, norm_len=4, cfg=LOSS)
    loss, m = exgrpo_loss(**b, clip=True, norm_len=4, cfg=BONUS, entropy=ent)
    assert m.entropy == pytest.approx(0.7)
    assert loss.item() == pytest.approx(base.item() - 0.007, rel=1e-6)
    assert m.pg_loss == pytest.approx(base.item())
    loss.backward()
    torch.testing.assert_close(ent.grad, torch.tensor([[-0.002, -0.002, -0.002], [-0.002, -0.002, 0.0]]))
    higher, _ = exgrpo_loss(**_batch(), clip=True, norm_len=4, cfg=BONUS, entropy=ent.detach() + 1)
    assert higher.item() < loss.item()


def test_tis_weight_scales_fresh_tokens_only():
    # tis = 0.5 everywhere, clip off: row 0 sum halves to -1.627626, row 1 stays 0.704545;
    # norm_len 4 -> (-1.627626 + 0.704545) / 8 = -0.115385.
    b = _batch()
    loss, _ = exgrpo_loss(**b, clip=False, norm_len=4, cfg=LOSS, tis_weight=torch.full((2, 3), 0.5))
    assert loss.item() == pytest.approx((0.5 * ROW0[False] + ROW1) / 8, rel=1e-6)


def test_loss_rejects_mismatched_shapes():
    b = _batch()
    b["advantages"] = torch.tensor([1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="advantages"):
        exgrpo_loss(**b, clip=True, norm_len=4, cfg=LOSS)


# ---------------------------------------------------------------- helpers


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 4.0]))
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0  # empty mask -> 0


def test_token_logprobs_matches_log_softmax_gather():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 30  # large logits exercise the stable path
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    want = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens), want)
    # bf16 logits take the row-wise float32 path; compare against the same bf16 values in float32.
    lb = logits.bfloat16()
    want_b = torch.log_softmax(lb.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    got_b = token_logprobs(lb, tokens)
    assert got_b.dtype == torch.float32
    torch.testing.assert_close(got_b, want_b)


def test_token_entropy():
    # Uniform logits over V = 7: entropy log 7 = 1.945910, whatever the shared offset (here 1000).
    assert token_entropy(torch.full((2, 3, 7), 1000.0)).sub(math.log(7)).abs().max() < 1e-5
    # One-hot-like logits: [100, 0, 0] -> almost certain, entropy ~ 0.
    assert token_entropy(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    # Two equal logits and one -30 apart: close to log 2 = 0.693147.
    assert token_entropy(torch.tensor([0.0, 0.0, -30.0])).item() == pytest.approx(math.log(2), abs=1e-6)
    z = torch.randn(4, 9, generator=torch.Generator().manual_seed(1))
    p = torch.softmax(z, -1)
    torch.testing.assert_close(token_entropy(z), -(p * p.log()).sum(-1))


# ---------------------------------------------------------------- delayed start


def test_delayed_start_latches_on_strictly_greater():
    ds = DelayedStart(0.35)
    assert not ds.started
    assert ds.update(solve_ratio=0.2) is False
    assert ds.update(solve_ratio=0.35) is False  # equal is not enough
    assert ds.update(solve_ratio=0.36) is True
    assert ds.update(solve_ratio=0.0) is True  # latched for good
    assert ds.started


def test_delayed_start_threshold_zero_is_on_from_the_start():
    ds = DelayedStart(0.0)
    assert ds.started
    assert ds.update(solve_ratio=0.0) is True


def test_delayed_start_state_dict_round_trip_and_validation():
    ds = DelayedStart(0.5)
    ds.update(solve_ratio=0.9)
    fresh = DelayedStart(0.5)
    fresh.load_state_dict(ds.state_dict())
    assert fresh.started
    not_started = DelayedStart(0.5)
    not_started.load_state_dict(DelayedStart(0.5).state_dict())
    assert not not_started.started
    with pytest.raises(ValueError, match="solve_ratio"):
        ds.update(solve_ratio=float("nan"))
