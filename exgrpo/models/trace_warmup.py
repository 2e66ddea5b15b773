"""Supervised warm-up on noisy scratchpad traces: the base model of the `scratchpad` task.

`warm_up_traces(out_dir, spec=)` trains the tiny model of a `TraceWarmupSpec` on noisy traces of the task's train
split (`ScratchpadTask.noisy_solution`), so the policy writes well-formed traces and errs in its steps, not its
format. The same spec gives bit-identical weights on one machine; the bytes depend on the CPU's kernels, so
`SCRATCHPAD_BASE` and `SCRATCHPAD_WEAK` ship built (`exgrpo.models.shipped`). `measure_traces` samples a model as
the RL samplers do and checks each trace. More: docs/task.md ("Base models"); tests: tests/exgrpo/models/test_shipped.py.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from exgrpo.core.config import TemplateName
from exgrpo.core.records import Prompt
from exgrpo.data.scratchpad import ScratchpadTask
from exgrpo.data.templates import render_prompt
from exgrpo.models.sft import encode_row, epoch_batches, fit_warm_up, pad_rows
from exgrpo.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from exgrpo.models.warmup import WarmupResult, check_spec, fit_and_record, spec_fingerprint

_TRACE_WARMUP_FORMAT = 1  # bump when the training procedure changes, so cached models are rebuilt
RECORD_NAME = "trace_warmup.json"


@dataclass(frozen=True)
class TraceWarmupSpec:
    """Everything that determines the warmed model's weights (the cache key is its fingerprint)."""

    model: TinyModelSpec = field(default_factory=TinyModelSpec)  # shape and init of the random start
    task: ScratchpadTask = field(default_factory=ScratchpadTask)  # ranges of the train split
    template: TemplateName = "plain"  # prompt frame (must render without a tokenizer chat template)
    steps: int = 300  # AdamW updates
    lr: float = 3e-3  # peak learning rate
    batch_size: int = 32  # sequences per update
    p_propagating: float = 0.15  # share of traces with a wrong step that makes the answer wrong
    p_silent: float = 0.10  # share of traces with a wrong step and the right answer
    seed: int = 0  # train-split draw, data order and noise
    num_train: int = 20_000  # distinct train-split questions drawn
    warmup_steps: int = 20  # linear learning-rate warm-up
    min_lr_ratio: float = 0.1  # cosine decay ends at min_lr_ratio * lr
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    threads: int = 1  # torch threads while training (part of the spec: float sums depend on it)

    def __post_init__(self) -> None:
        check_spec(
            self,
            [
                (
                    self.p_propagating >= 0
                    and self.p_silent >= 0
                    and self.p_propagating + self.p_silent <= 1,
                    f"p_propagating={self.p_propagating}, p_silent={self.p_silent} must be >= 0 with sum <= 1",
                )
            ],
        )

    def fingerprint(self) -> str:
        return spec_fingerprint(self, _TRACE_WARMUP_FORMAT)


SCRATCHPAD_MODEL = TinyModelSpec(
    hidden_size=96, num_layers=2, num_heads=3, num_kv_heads=1, head_dim=32, intermediate_size=192
)
# builtin:scratchpad-base: 1000 updates of 24 noisy traces (15% propagating, 25% silent errors),
# chosen on the val splits for an ID solve rate at T=1 inside 20-50% with k spread over 1..7.
SCRATCHPAD_BASE = TraceWarmupSpec(
    model=SCRATCHPAD_MODEL, steps=1000, lr=4e-3, batch_size=24, p_propagating=0.15, p_silent=0.25
)
# builtin:scratchpad-weak: the same recipe stopped at 700 updates, before the model has learned to add
# reliably (the shipped weights: docs/task.md) - the analogue of the paper's weak Llama base.
SCRATCHPAD_WEAK = dataclasses.replace(SCRATCHPAD_BASE, steps=700)


def training_prompts(spec: TraceWarmupSpec) -> list[Prompt]:
    """The questions the warm-up learns: `spec.num_train` questions of the task's train split."""
    return spec.task.make_split(split="train", n=spec.num_train, seed=spec.seed)


def warm_up_traces(out_dir: Path, *, spec: TraceWarmupSpec = SCRATCHPAD_BASE) -> Path:
    """Build `spec.model`, train it on noisy traces of the train split, save it (float32) to `out_dir`.

    `out_dir` then holds `config.json`, `model.safetensors`, the tokenizer files and
    `trace_warmup.json` = {"spec": ..., "result": WarmupResult}. Deterministic in `spec`.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    build_tiny_model(out_dir, spec=spec.model)
    prompts = training_prompts(spec)
    return fit_and_record(
        out_dir,
        spec=spec,
        prompts=prompts,
        start=start,
        record_name=RECORD_NAME,
        train=lambda model: _train(model, prompts, spec=spec),
    )


def read_trace_warmup(model_dir: Path) -> WarmupResult:
    """The `WarmupResult` recorded in `model_dir/trace_warmup.json`."""
    record = json.loads((Path(model_dir) / RECORD_NAME).read_text())["result"]
    record["loss_curve"] = tuple(record["loss_curve"])
    return WarmupResult(**record)


# --------------------------------------------------------------------------------------- internals


def _train(model: torch.nn.Module, prompts: Sequence[Prompt], *, spec: TraceWarmupSpec) -> list[float]:
    """spec.steps AdamW updates (`fit`) on the warm-ups' batch order; each step draws fresh noisy traces of its
    questions."""
    tokenizer = build_char_tokenizer()
    batches = epoch_batches(len(prompts), spec=spec)
    noise_rng = np.random.default_rng([spec.seed, 3])  # its own stream: noise never shifts the data order

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        rows = []
        for i in batches[step]:
            prompt = prompts[int(i)]
            response = spec.task.noisy_solution(prompt, noise_rng, spec.p_propagating, spec.p_silent)
            rows.append(
                encode_row(tokenizer, render_prompt(prompt.question, template=spec.template), response)
            )
        padded = pad_rows(rows, tokenizer.pad_token_id)
        return {"input_ids": padded.input_ids, "labels": padded.labels}  # mean cross-entropy of the responses

    return fit_warm_up(model, spec=spec, batch_at=batch_at, what="trace warm-up")
