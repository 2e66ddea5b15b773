"""The supervised fine-tune the warm-ups and the cold start share (exgrpo/models/sft.py): labels on the response
and end-of-text only, the two learning-rate schedules and batch orders by hand, and `fit` against the AdamW loop
written out, with a loss that is not finite refused."""

from __future__ import annotations

import math

import pytest
import torch

from exgrpo.models.sft import (
    carried_batches,
    cosine_lr,
    encode_row,
    epoch_batches,
    fit,
    pad_rows,
    warm_then_constant_lr,
)
from exgrpo.models.tiny import build_char_tokenizer
from exgrpo.models.warmup import WarmupSpec

torch.set_num_threads(1)


def test_labels_cover_the_response_and_eos_only() -> None:
    padded = pad_rows([([5, 6, 7], [8, 1]), ([5], [9, 9, 1])], pad_id=0)
    batch = padded.model_inputs()
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 1], [5, 9, 9, 1, 0]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 8, 1], [-100, 9, 9, 1, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert padded.lengths.tolist() == [5, 4]
    assert pad_rows([([5], [1])], pad_id=0, width=3).input_ids.tolist() == [[5, 1, 0]]
    with pytest.raises(ValueError, match="no rows"):
        pad_rows([], pad_id=0)


def test_a_row_is_the_prompt_then_the_response_and_eos() -> None:
    tok = build_char_tokenizer()
    head, tail = encode_row(tok, "Q: 1+1\nA: ", "2")
    assert tok.decode(head) == "Q: 1+1\nA: " and tail == [
        *tok.encode("2", add_special_tokens=False),
        tok.eos_token_id,
    ]


def test_the_schedules_by_hand() -> None:
    spec = WarmupSpec(steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    # warm-up: (step + 1) / 10 * lr
    assert cosine_lr(0, spec=spec) == pytest.approx(1e-4)
    assert cosine_lr(9, spec=spec) == pytest.approx(1e-3)
    # cosine over the remaining 100 steps: step 60 is half-way -> lr * (0.1 + 0.9 * 0.5) = 5.5e-4
    assert cosine_lr(10, spec=spec) == pytest.approx(1e-3)
    assert cosine_lr(60, spec=spec) == pytest.approx(5.5e-4)
    assert cosine_lr(110, spec=spec) == pytest.approx(1e-4)
    # the cold start's: (step + 1) / (warmup_steps + 1) of lr, then lr
    assert [warm_then_constant_lr(s, lr=1.0, warmup_steps=3) for s in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    assert warm_then_constant_lr(0, lr=2.0, warmup_steps=0) == 2.0


def test_the_batch_orders() -> None:
    # the cold start's: every row once an epoch, an epoch's remainder opening the next batch
    batches = carried_batches(5, batch_size=3, steps=10, seed=7)
    flat = [i for b in batches for i in b]
    assert all(len(b) == 3 for b in batches) and len(flat) == 30
    assert all(sorted(flat[e * 5 : e * 5 + 5]) == list(range(5)) for e in range(6))
    assert batches == carried_batches(5, batch_size=3, steps=10, seed=7)
    assert batches != carried_batches(5, batch_size=3, steps=10, seed=8)
    # the warm-ups': min(batch_size, n) rows, an epoch's remainder dropped
    spec = WarmupSpec(steps=7, batch_size=3, seed=1)
    warm = [b.tolist() for b in epoch_batches(7, spec=spec)]
    assert len(warm) == 7 and all(len(b) == 3 for b in warm)
    for epoch in range(3):  # two batches an epoch, 6 distinct rows of 7
        assert len(set(warm[2 * epoch] + warm[2 * epoch + 1])) == 6
    assert [b.tolist() for b in epoch_batches(2, spec=spec)][0] in ([0, 1], [1, 0])


class _Regression(torch.nn.Module):
    """A model whose forward returns an object with `.loss`, as an HF causal LM's does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.nn.Module:
        out = torch.nn.Module()
        out.loss = ((self.linear(x).squeeze(-1) - y) ** 2).mean()
        return out


def _data(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 3, generator=g)
    return {"x": x, "y": x.sum(-1) * 3.0}


def test_fit_is_the_adamw_loop_written_out() -> None:
    torch.manual_seed(0)
    model, by_hand = _Regression(), _Regression()
    by_hand.load_state_dict(model.state_dict())
    seen: list[tuple[int, float]] = []
    losses = fit(
        model,
        steps=6,
        lr_at=lambda s: 0.1 * (s + 1),
        batch_at=_data,
        weight_decay=0.01,
        on_loss=lambda s, loss: seen.append((s, loss)),
    )
    optimizer = torch.optim.AdamW(by_hand.parameters(), lr=0.1, weight_decay=0.01)
    want = []
    for step in range(6):
        optimizer.param_groups[0]["lr"] = 0.1 * (step + 1)
        loss = by_hand(**_data(step)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(by_hand.parameters(), 1.0)
        optimizer.step()
        want.append(loss.item())
    assert losses == want and seen == list(enumerate(want))
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), by_hand.state_dict().values(), strict=True)
    )
    assert losses[-1] < losses[0]


def test_fit_refuses_a_loss_that_is_not_finite() -> None:
    def bad(step: int) -> dict[str, torch.Tensor]:
        batch = _data(step)
        batch["y"] = batch["y"] * (math.inf if step == 2 else 1.0)
        return batch

    with pytest.raises(FloatingPointError, match="warm-up step 2: loss is inf"):
        fit(_Regression(), steps=4, lr_at=lambda s: 0.01, batch_at=bad, weight_decay=0.0, what="warm-up")
