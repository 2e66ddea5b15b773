"""The supervised fine-tune shared by the cold start (`exgrpo/models/cold_start.py`) and the builtin bases'
warm-ups (`warmup.py`, `trace_warmup.py`): prompt + response rows with labels on the response and end-of-text
only, their batch orders and learning-rate schedules, and `fit`, the AdamW loop (clipped at norm 1) that runs
them. No Ray, vLLM or DeepSpeed. Each caller keeps its own recipe (data, noise, schedule, order, train or eval
mode); what runs is op for op what each ran before it was shared, so the warm-ups' cached weights keep their
fingerprints. Tests: tests/exgrpo/models/test_sft.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Row = tuple[list[int], list[int]]  # (prompt token ids, response token ids + end-of-text)


def encode_row(tokenizer: Any, prompt_text: str, response: str) -> Row:
    """One training row: the rendered prompt's tokens, then the response's and the end-of-text token."""
    head = tokenizer.encode(prompt_text, add_special_tokens=False)
    tail = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
    return head, tail


@dataclass(frozen=True)
class Padded:
    """Right-padded rows: what the model reads and the labels its loss scores."""

    input_ids: torch.Tensor  # (N, T)
    labels: torch.Tensor  # (N, T): the response tokens and end-of-text, -100 on the prompt and the padding
    attention_mask: torch.Tensor  # (N, T): 1 on the row's tokens, 0 on the padding
    lengths: torch.Tensor  # (N,): prompt + response tokens of each row

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of an HF causal LM's forward that returns the loss."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}


def pad_rows(rows: Sequence[Row], pad_id: int, *, width: int = 0) -> Padded:
    """`rows` right-padded with `pad_id` to the longest row, or to `width` tokens where that is longer."""
    if not rows:
        raise ValueError("no rows to pad")
    lengths = [len(head) + len(tail) for head, tail in rows]
    width = max(width, *lengths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (head, tail) in enumerate(rows):
        n = len(head) + len(tail)
        input_ids[i, :n] = torch.tensor(head + tail)
        labels[i, len(head) : n] = torch.tensor(tail)
        mask[i, :n] = 1
    return Padded(input_ids, labels, mask, torch.tensor(lengths))


def cosine_lr(step: int, *, spec: Any) -> float:
    """Linear warm-up to spec.lr over warmup_steps, then cosine decay to min_lr_ratio * lr (step from 0): the
    warm-ups' schedule."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def warm_then_constant_lr(step: int, *, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over the first warmup_steps + 1 steps, then constant `lr`: the cold start's schedule."""
    return lr * min(1.0, (step + 1) / (warmup_steps + 1))


def epoch_batches(n: int, *, spec: Any) -> list[torch.Tensor]:
    """The warm-ups' row indices of every update's batch: slices of one seeded permutation (numpy, stream
    [spec.seed, 2]) per epoch; batches are min(batch_size, n) rows and an epoch's remainder rows are dropped."""
    rng = np.random.default_rng([spec.seed, 2])
    size = min(spec.batch_size, n)
    batches: list[torch.Tensor] = []
    while len(batches) < spec.steps:
        order = torch.from_numpy(rng.permutation(n))
        batches.extend(order[i : i + size] for i in range(0, n - size + 1, size))
    return batches[: spec.steps]


def carried_batches(n: int, *, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The cold start's row indices of every step's batch: epochs shuffled by `random.Random(seed)`, one
    after the other; an epoch's remainder opens the next step's batch (every row is seen once an epoch)."""
    rng = random.Random(seed)
    order: list[int] = []
    batches = []
    for _ in range(steps):
        if len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order.extend(epoch)
        batches.append(order[:batch_size])
        order = order[batch_size:]
    return batches


def fit(
    model: torch.nn.Module,
    *,
    steps: int,
    lr_at: Callable[[int], float],
    batch_at: Callable[[int], Mapping[str, torch.Tensor]],
    weight_decay: float,
    bf16: bool = False,
    what: str = "fine-tune",
    on_loss: Callable[[int, float], None] = lambda step, loss: None,
) -> list[float]:
    """`steps` AdamW updates of every weight of `model`; returns each update's loss.

    Step s sets the learning rate `lr_at(s)`, builds the batch `batch_at(s)` (the forward's keyword arguments,
    labels included: its mean cross-entropy is the loss), runs the forward (under CPU bfloat16 autocast when
    `bf16`), clips the gradient at norm 1 and steps; `on_loss(s, loss)` follows. A loss that is not finite
    stops it (FloatingPointError naming `what`). The model's train or eval mode is the caller's."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr_at(0), weight_decay=weight_decay)
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        batch = batch_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"{what} step {step}: loss is {value}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(value)
        on_loss(step, value)
    return losses


def fit_warm_up(
    model: torch.nn.Module, *, spec: Any, batch_at: Callable[[int], Mapping[str, torch.Tensor]], what: str
) -> list[float]:
    """A warm-up's `fit` in train mode: `spec.steps` updates on the cosine schedule (`cosine_lr`) with
    `spec.weight_decay`; the model is left in eval mode. Each update's loss."""
    model.train()
    losses = fit(
        model,
        steps=spec.steps,
        lr_at=lambda step: cosine_lr(step, spec=spec),
        batch_at=batch_at,
        weight_decay=spec.weight_decay,
        what=what,
    )
    model.eval()
    return losses
