"""Supervised cold start: teach a real base model the answer format before RL, from a task's worked solutions.

`cold_start` fine-tunes an HF causal LM (every weight, AdamW, float32 weights under CPU bfloat16 autocast where
the CPU has the instructions) on teacher-forced worked solutions of the run's own train prompts: the loss covers
the response tokens and the end-of-text token, never the prompt. It writes a complete HF model directory (weights,
tokenizer, chat template) with `cold_start.json`. The CLI is `exgrpo/cold_start.py`; measured with and without in
docs/smollm2.md; tests: tests/learners/test_cold_start.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exgrpo.core.config import TemplateName
from exgrpo.core.fileio import atomic_path, atomic_write_text
from exgrpo.core.records import Prompt
from exgrpo.data.templates import render_prompt


@dataclass(frozen=True)
class ColdStartSpec:
    """The fine-tune's settings (all of what determines the result besides the base and the prompts)."""

    steps: int = 30
    batch_size: int = 8
    lr: float = 2.0e-5
    warmup_steps: int = 3  # linear warm-up, then constant
    seed: int = 0
    autocast: str = "auto"  # off | auto | bfloat16, as learners.autocast

    def check(self) -> None:
        errors = [
            msg
            for ok, msg in (
                (self.steps >= 1, f"steps={self.steps} must be >= 1"),
                (self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1"),
                (self.lr > 0, f"lr={self.lr} must be > 0"),
                (self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be >= 0"),
                (
                    self.autocast in ("off", "auto", "bfloat16"),
                    f"autocast={self.autocast!r}: off|auto|bfloat16",
                ),
            )
            if not ok
        ]
        if errors:
            raise ValueError("invalid cold start: " + "; ".join(errors))


def training_rows(
    tokenizer: Any, prompts: Sequence[Prompt], solution: Callable[[Prompt], str], template: TemplateName
) -> list[tuple[list[int], list[int]]]:
    """(prompt token ids, response token ids + end-of-text) per prompt, as the samplers would see the prompt."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the cold start needs a tokenizer with an end-of-text token (eos_token_id is None)")
    rows = []
    for p in prompts:
        head = tokenizer.encode(
            render_prompt(p.question, template=template, tokenizer=tokenizer), add_special_tokens=False
        )
        tail = [*tokenizer.encode(solution(p), add_special_tokens=False), tokenizer.eos_token_id]
        rows.append((head, tail))
    return rows


def batch_tensors(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 on prompt and padding tokens)."""
    width = max(len(h) + len(t) for h, t in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (head, tail) in enumerate(rows):
        n = len(head) + len(tail)
        ids[i, :n] = torch.tensor(head + tail)
        labels[i, len(head) : n] = torch.tensor(tail)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def cold_start(
    base_dir: Path,
    out_dir: Path,
    *,
    prompts: Sequence[Prompt],
    solution: Callable[[Prompt], str],
    template: TemplateName,
    spec: ColdStartSpec = ColdStartSpec(),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fine-tune the model in `base_dir` on `solution(p)` for `prompts`; write it to `out_dir` (atomically).

    Returns the record also written as `out_dir/cold_start.json`: the spec, the base, the number of train
    prompts, the loss per step, the compute dtype and the seconds taken."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learners.modeling import autocast_choice

    spec.check()
    if not prompts:
        raise ValueError("the cold start needs at least one train prompt")
    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.eval()  # no dropout: the same seed gives the same weights (gradients flow in eval mode too)
    rows = training_rows(tokenizer, prompts, solution, template)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    use_bf16, compute = autocast_choice(
        spec.autocast, device=torch.device("cpu"), dtype="float32", chunked=False
    )
    log(
        f"[exgrpo] cold start: {len(rows)} train prompts, {spec.steps} steps of {spec.batch_size}, "
        f"lr {spec.lr:g}, computing in {compute}"
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    order: list[int] = []
    rng = random.Random(spec.seed)
    losses: list[float] = []
    start = time.monotonic()
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = spec.lr * min(1.0, (step + 1) / (spec.warmup_steps + 1))
        if len(order) < spec.batch_size:  # epochs in a seeded order
            epoch = list(range(len(rows)))
            rng.shuffle(epoch)
            order.extend(epoch)
        picked, order = order[: spec.batch_size], order[spec.batch_size :]
        batch = batch_tensors([rows[i] for i in picked], pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(**batch).loss
        if not math.isfinite(loss.item()):
            raise FloatingPointError(
                f"cold start step {step}: loss is {loss.item()}; lower the learning rate"
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == spec.steps:
            log(f"[exgrpo] cold start step {step + 1}/{spec.steps}: loss {losses[-1]:.4f}")
    seconds = round(time.monotonic() - start, 1)
    record = {
        "spec": dataclasses.asdict(spec),
        "base": str(base_dir),
        "template": template,
        "train_prompts": len(rows),
        "compute": compute,
        "losses": losses,
        "seconds": seconds,
    }
    with atomic_path(Path(out_dir), directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_text(Path(tmp) / "cold_start.json", json.dumps(record, indent=1) + "\n")
    return record
