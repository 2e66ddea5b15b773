"""Supervised cold start: teach a real base model the answer format before RL, from a task's worked solutions.

`cold_start` fine-tunes an HF causal LM (every weight, AdamW, float32 weights under CPU bfloat16 autocast where
the CPU has the instructions) on teacher-forced worked solutions of the run's own train prompts: the loss covers
the response tokens and the end-of-text token, never the prompt. It writes a complete HF model directory (weights,
tokenizer, chat template) with `cold_start.json`. The CLI is `exgrpo/cold_start.py`; measured with and without in
docs/smollm2.md; tests: tests/exgrpo/models/test_cold_start.py. The loop is `exgrpo/models/sft.py`'s, the warm-ups'.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exgrpo.core.config import TemplateName
from exgrpo.core.fileio import atomic_path, atomic_write_text
from exgrpo.core.precision import autocast_choice
from exgrpo.core.records import Prompt
from exgrpo.data.templates import render_prompt
from exgrpo.models.sft import Row, carried_batches, encode_row, fit, pad_rows, warm_then_constant_lr


@dataclass(frozen=True)
class ColdStartSpec:
    """The fine-tune's settings (all of what determines the result besides the base and the prompts)."""

    steps: int = 30
    batch_size: int = 8
    lr: float = 2.0e-5
    warmup_steps: int = 3  # linear warm-up, then constant
    seed: int = 0
    autocast: str = "auto"  # off | auto | bfloat16, as learners.autocast (exgrpo.core.precision)

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
) -> list[Row]:
    """(prompt token ids, response token ids + end-of-text) per prompt, as the samplers would see the prompt."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the cold start needs a tokenizer with an end-of-text token (eos_token_id is None)")
    return [
        encode_row(tokenizer, render_prompt(p.question, template=template, tokenizer=tokenizer), solution(p))
        for p in prompts
    ]


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
    batches = carried_batches(len(rows), batch_size=spec.batch_size, steps=spec.steps, seed=spec.seed)

    def logged(step: int, loss: float) -> None:
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == spec.steps:
            log(f"[exgrpo] cold start step {step + 1}/{spec.steps}: loss {round(loss, 4):.4f}")

    start = time.monotonic()
    losses = fit(
        model,
        steps=spec.steps,
        lr_at=lambda step: warm_then_constant_lr(step, lr=spec.lr, warmup_steps=spec.warmup_steps),
        batch_at=lambda step: pad_rows([rows[i] for i in batches[step]], pad_id).model_inputs(),
        weight_decay=0.0,
        bf16=use_bf16,
        what="cold start",
        on_loss=logged,
    )
    seconds = round(time.monotonic() - start, 1)
    record = {
        "spec": dataclasses.asdict(spec),
        "base": str(base_dir),
        "template": template,
        "train_prompts": len(rows),
        "compute": compute,
        "losses": [round(loss, 4) for loss in losses],
        "seconds": seconds,
    }
    with atomic_path(Path(out_dir), directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_text(Path(tmp) / "cold_start.json", json.dumps(record, indent=1) + "\n")
    return record
