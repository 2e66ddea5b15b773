"""Learner memory (issue 18): chunked log-probs/entropies, gradient checkpointing, token-budget micro-batches
and the chunked grad-norm guard give the same losses, gradients and entropies as the full-logits path."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tiny_qwen2 import SlicedEngine
from transformers import Qwen2Config, Qwen2ForCausalLM

import learners.update as U
from exgrpo.core.config import LossConfig
from learners import batches, logits
from learners.engine import ModelEngine
from learners.modeling import checkpointing_on, set_checkpointing
from learners.optim import squared_sum

torch.set_num_threads(1)
TOL = 1e-6
# per-token log-probs and entropies are ~4 in size, where a float32 ULP is 4.8e-7: the chunked lm_head sums in
# another order than the full one, and on some CPUs (AMD EPYC here) that moved an entropy by 3 ULPs (1.4e-6)
RTOL = 1e-6
MAX_LEN = 9


def _model(seed: int = 0, **extra) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).float()


def _rows(seed: int, n: int = 6) -> list[batches.Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, k = rng.randint(1, 5), rng.randint(1, MAX_LEN)
        rows.append(
            batches.Row(
                prompt_ids=tuple(rng.randrange(64) for _ in range(p)),
                response_ids=tuple(rng.randrange(64) for _ in range(k)),
                behaviour=tuple(-rng.uniform(0.5, 4.0) for _ in range(k)),
                replayed=i == 0,
                advantage=rng.uniform(-1, 1),
            )
        )
    return rows


def _backward(model, rows, slices, chunk_tokens, *, norm: str = "constant"):
    """(summed objective, [grads], (N, R) entropies) of one mini-batch through ``minibatch_backward``."""
    model.zero_grad(set_to_none=True)
    r_max = max(len(r.response_ids) for r in rows)
    old_logp, _ = U.old_logprobs(rows, r_max, None, tis_cap=None)
    total = []
    U.minibatch_backward(
        SlicedEngine(
            model,
            slices,
            lambda o: (total.append(float(o.detach())), o.backward()),
            chunk_tokens=chunk_tokens,
        ),
        U.MiniBatch(
            rows, old_logp, None, r_max=r_max, totals=U.minibatch_totals(rows, device=torch.device("cpu"))
        ),
        loss=LossConfig(entropy_coef=0.01, norm=norm),
        max_response_len=MAX_LEN,
        clip=True,
        proximal_is_current=True,
    )
    grads = [p.grad.detach().clone() for p in model.parameters()]
    ent = logits.per_token(
        model, rows, r_max, "entropy", slices=slices, device=torch.device("cpu"), chunk_tokens=chunk_tokens
    )
    logp = logits.per_token(
        model, rows, r_max, "logp", slices=slices, device=torch.device("cpu"), chunk_tokens=chunk_tokens
    )
    return sum(total), grads, ent, logp


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("norm", ["constant", "token_mean"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 4096])
@pytest.mark.parametrize("budget", [None, 20])
def test_chunked_checkpointed_path_equals_the_full_logits_path(chunk, budget, norm):
    rows = _rows(seed=chunk + (budget or 0))
    base = _model()
    base.eval()
    want = _backward(base, rows, batches.chunks(len(rows), 2), None, norm=norm)
    model = copy.deepcopy(base)
    set_checkpointing(model, True)
    assert model.is_gradient_checkpointing and model.training
    seq = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    slices = (
        batches.chunks(len(rows), 2) if budget is None else batches.budget_slices(seq, budget, max_rows=16)
    )
    got = _backward(model, rows, slices, chunk, norm=norm)
    assert abs(got[0] - want[0]) <= TOL
    assert _max_diff(got[1], want[1]) <= TOL
    torch.testing.assert_close(got[2], want[2], rtol=RTOL, atol=TOL)
    torch.testing.assert_close(got[3], want[3], rtol=RTOL, atol=TOL)


def test_reference_and_no_response_tokens_follow_the_chunked_path():
    model = _model().eval()
    enc = batches.encode(_rows(3), MAX_LEN, torch.device("cpu"))
    with torch.no_grad():
        full = logits.response_stats(model, enc)
        for chunk in (1, 5):
            got = logits.response_stats(model, enc, chunk_tokens=chunk)
            torch.testing.assert_close(got[0], full[0], rtol=RTOL, atol=TOL)
            torch.testing.assert_close(got[1], full[1], rtol=RTOL, atol=TOL)


def test_budget_slices_respect_the_budget_and_isolate_a_too_long_row():
    seq = [3, 5, 2, 9, 4, 4, 1, 30, 2]
    slices = batches.budget_slices(seq, 12, max_rows=3)
    assert [i for sl in slices for i in range(len(seq))[sl]] == list(range(len(seq)))  # in order, each once
    for sl in slices:
        part = seq[sl]
        assert len(part) <= 3
        assert len(part) * max(part) <= 12 or len(part) == 1  # a too-long row travels alone
    assert slice(7, 8) in slices  # the 30-token row: its own micro-batch
    assert batches.budget_slices([], 10, max_rows=4) == []


def test_checkpointing_setting_and_dropout_rule():
    assert checkpointing_on("auto", torch.device("cuda", 0)) and not checkpointing_on(
        "auto", torch.device("cpu")
    )
    assert checkpointing_on("on", torch.device("cpu")) and not checkpointing_on("off", torch.device("cuda"))
    model = _model(attention_dropout=0.5)
    set_checkpointing(model, True)
    assert model.config.attention_dropout == 0.0
    enc = batches.encode(_rows(1), MAX_LEN, torch.device("cpu"))
    a = logits.response_stats(model, enc, chunk_tokens=4)[0]
    b = logits.response_stats(model, enc, chunk_tokens=4)[0]
    assert torch.equal(a, b)  # train mode is deterministic: old_logp == logp at the first micro-batch
    off = _model()
    set_checkpointing(off, False)
    assert not off.training


def test_squared_sum_is_chunked_float32_with_the_same_semantics():
    g = torch.randn(1000, dtype=torch.float32)
    want = float(g.double().pow(2).sum())
    for chunk in (1, 7, 1000, 4096):
        assert abs(float(squared_sum(g, chunk)) - want) <= 1e-6 * want
    g[500] = float("inf")
    assert not torch.isfinite(squared_sum(g, 7))
    g[500] = float("nan")
    assert not torch.isfinite(squared_sum(g, 7))
    bf = torch.randn(33, 3, dtype=torch.bfloat16)
    assert abs(float(squared_sum(bf, 10)) - float(bf.double().pow(2).sum())) <= 1e-5 * float(
        bf.double().pow(2).sum()
    )


def test_update_with_token_budget_equals_plain_micro_batches():
    from exgrpo.core.records import Group, Trajectory

    rng = random.Random(5)
    groups = []
    for q in range(3):
        prompt = tuple(rng.randrange(64) for _ in range(rng.randint(1, 4)))
        trajs = []
        for _ in range(4):
            k = rng.randint(1, MAX_LEN)
            trajs.append(
                Trajectory(
                    response_ids=tuple(rng.randrange(64) for _ in range(k)),
                    logprobs=tuple(-rng.uniform(0.5, 3.0) for _ in range(k)),
                    reward=float(rng.random() < 0.5),
                    qid=f"q{q}",
                    policy_version=0,
                )
            )
        groups.append(Group(qid=f"q{q}", prompt_ids=prompt, trajectories=tuple(trajs)))
    results, grads = [], []
    # rows of 4 per micro-batch, full logits; token-budget micro-batches (at most 16 rows, 25 tokens), chunks of 3
    for size, max_tokens, chunk in ((4, None, None), (16, 25, 3)):
        model = _model()
        model.eval()
        seen = []

        def step(model: torch.nn.Module = model, seen: list = seen) -> tuple[float, bool]:
            seen.append([p.grad.detach().clone() for p in model.parameters()])
            model.zero_grad(set_to_none=True)
            return 0.0, False

        results.append(
            U.update(
                ModelEngine(
                    model,
                    micro_batch_size=size,
                    max_tokens_per_micro_batch=max_tokens,
                    step=step,
                    chunk_tokens=chunk,
                ),
                groups,
                loss=LossConfig(entropy_coef=0.01),
                minibatches=1,
                max_response_len=MAX_LEN,
                clip=True,
                reuse_proximal=False,
            )
        )
        grads.append(seen[0])
    for key in ("learner/loss", "learner/pg_loss", "learner/entropy"):
        assert abs(results[0][key] - results[1][key]) <= TOL, key
    assert _max_diff(grads[0], grads[1]) <= TOL
