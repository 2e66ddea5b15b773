"""``learners.batches.packed``: a group's rows in one sequence (its prompt once) give the padded layout's
log-probs, entropies and gradients; the choice (``learners.pack_prompts``) follows its rules."""

from __future__ import annotations

import pytest
import torch
from tiny_qwen2 import save_tiny_qwen2, tiny_groups
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import learners.update as U
from exgrpo.core.config import LossConfig
from learners import batches
from learners.engine import ModelEngine
from learners.logits import response_stats
from learners.modeling import packing_choice

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory, seed=5, name="tiny-qwen2-packing")


def _rows(groups) -> list[batches.Row]:
    return batches.build_rows(groups, std_normalize=False)[0]


def test_packed_layout_puts_each_prompt_once_and_masks_other_responses():
    rows = [
        batches.Row((1, 2), (3, 4), (0.0, 0.0)),
        batches.Row((1, 2), (5,), (0.0,)),
        batches.Row((7,), (8, 9, 6), (0.0, 0.0, 0.0)),
    ]
    enc = batches.encode(rows, 3, CPU, pack=True)
    assert enc.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 6, 0]]
    assert enc.position_ids is not None and enc.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 3, 0]]
    assert enc.seq.tolist() == [0, 0, 1]
    # the logit predicting a response's first token is its prompt's last position
    assert enc.positions.tolist() == [[1, 2, 0], [1, 0, 0], [0, 1, 2]]
    see = enc.attention_mask[0, 0]  # (S, S)
    assert see[4].tolist() == [True, True, False, False, True]  # response 2 sees the prompt and itself only
    assert see[3].tolist() == [True, True, True, True, False]
    assert enc.attention_mask[1, 0, 4].tolist() == [False, False, False, False, True]  # padding: itself
    assert batches.prompt_runs(rows) == [slice(0, 2), slice(2, 3)]


@pytest.mark.parametrize("chunk_tokens", [None, 5])
def test_packed_forward_and_gradients_equal_the_padded_ones(model_path, chunk_tokens):
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    rows = _rows(tiny_groups(1, stale=False))
    r_max = max(len(r.response_ids) for r in rows)
    results = []
    for pack in (False, True):
        model.zero_grad(set_to_none=True)
        enc = batches.encode(rows, r_max, CPU, pack=pack)
        logp, ent = response_stats(model, enc, chunk_tokens=chunk_tokens)
        (logp.sum() + ent.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((logp.detach(), ent.detach(), grads, enc.input_ids.numel()))
    (lp0, h0, g0, n0), (lp1, h1, g1, n1) = results
    assert n1 < n0  # the 4 groups' prompts once each, no padding to the longest row
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(h0, h1, atol=1e-5)
    assert float(lp0.abs().sum()) > 0
    for a, b in zip(g0, g1, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_an_update_packed_matches_the_padded_update(model_path):
    loss = LossConfig(norm="constant", entropy_coef=0.01)
    out = []
    for pack in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        engine = ModelEngine(model, micro_batch_size=4, pack=pack)
        metrics = U.update(
            engine, tiny_groups(2, stale=True), loss=loss, minibatches=1, max_response_len=8, clip=True
        )
        out.append((metrics, [p.grad.clone() for p in model.parameters()]))
    (m0, g0), (m1, g1) = out
    for key in ("learner/loss", "learner/entropy", "learner/ratio_fresh"):
        assert m0[key] == pytest.approx(m1[key], abs=1e-5), key
    for a, b in zip(g0, g1, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_packing_choice():
    sdpa = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    assert packing_choice("auto", device=CPU, model=sdpa)[0]
    assert not packing_choice("off", device=CPU, model=sdpa)[0]
    assert not packing_choice("auto", device=torch.device("cuda"), model=sdpa)[0]  # unmeasured there: padded
    assert packing_choice("on", device=torch.device("cuda"), model=sdpa)[0]
    sdpa.config._attn_implementation = "eager"
    on, why = packing_choice("auto", device=CPU, model=sdpa)
    assert not on and "eager" in why
    with pytest.raises(ValueError, match="pack_prompts=off"):
        packing_choice("on", device=CPU, model=sdpa)
