"""`loss.entropy_per`: the entropy bonus once per optimiser step (token mean over the mini-batch) or once per
micro-batch, as the official code adds it (each micro-batch's own token mean, summed)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_qwen2 import SlicedEngine
from transformers import Qwen2Config, Qwen2ForCausalLM

import learners.update as U
from exgrpo.core.config import LossConfig
from learners import batches, logits

torch.set_num_threads(1)
C, MAX_LEN = 0.01, 7


def _setup():
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).float().eval()
    rng = random.Random(0)
    rows = [
        batches.Row(
            prompt_ids=tuple(rng.randrange(32) for _ in range(3)),
            response_ids=tuple(rng.randrange(32) for _ in range(rng.randint(1, MAX_LEN))),
            behaviour=(),
            replayed=False,
            advantage=0.0,  # no policy gradient: the objective is the entropy bonus alone
        )
        for _ in range(6)
    ]
    return model, rows


def _objective(model, rows, slices, per: str) -> float:
    r_max = max(len(r.response_ids) for r in rows)
    old_logp, _ = U.old_logprobs(rows, r_max, None, tis_cap=None)
    total: list[float] = []
    U.minibatch_backward(
        SlicedEngine(model, slices, lambda o: total.append(float(o.detach()))),
        U.MiniBatch(
            rows, old_logp, None, r_max=r_max, totals=U.minibatch_totals(rows, device=torch.device("cpu"))
        ),
        loss=LossConfig(entropy_coef=C, entropy_per=per),  # type: ignore[arg-type]
        max_response_len=MAX_LEN,
        clip=True,
        proximal_is_current=True,
    )
    return sum(total)


@pytest.mark.parametrize("per", ["minibatch", "micro_batch"])
def test_the_bonus_is_one_token_mean_per_step_or_one_per_micro_batch(per):
    model, rows = _setup()
    slices = batches.chunks(len(rows), 2)  # 3 micro-batches
    r_max = max(len(r.response_ids) for r in rows)
    ent = logits.per_token(model, rows, r_max, "entropy", slices=slices, device=torch.device("cpu"))
    mask = batches.encode(rows, r_max, torch.device("cpu")).mask
    if per == "minibatch":
        want = -C * float(ent[mask].mean())
    else:
        want = -C * sum(float(ent[sl][mask[sl]].mean()) for sl in slices)
    assert _objective(model, rows, slices, per) == pytest.approx(want, rel=1e-5)


def test_per_micro_batch_weighs_the_bonus_by_the_number_of_micro_batches():
    model, rows = _setup()
    slices = batches.chunks(len(rows), 2)
    ratio = _objective(model, rows, slices, "micro_batch") / _objective(model, rows, slices, "minibatch")
    assert len(slices) == 3 and ratio == pytest.approx(3.0, rel=0.2)
