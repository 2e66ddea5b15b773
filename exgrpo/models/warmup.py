"""Supervised warm-up: base models with partial competence on a builtin task (no Ray, vLLM or DeepSpeed).

RL from verifiable rewards needs a policy that is sometimes right. `warm_up` trains the tiny model of a
`WarmupSpec` on the task's train split only (teacher-forced cross-entropy of the response tokens, with seeded
format and label noise) and saves it with `warmup.json`. The same spec gives bit-identical weights (fixed seeds,
data order and thread count). `evaluate_solve_rate` measures a model as the RL samplers see it; `ARITH_BASE` and
`ARITH_WEAK` are the specs of `builtin:arith-base` / `-weak`. More: docs/base-model.md ("How they are made");
tests: tests/exgrpo/models/test_warmup.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.core.config import TemplateName
from exgrpo.core.fileio import atomic_write_text
from exgrpo.core.records import Prompt
from exgrpo.data.tasks import Task, builtin_task
from exgrpo.data.templates import render_prompt
from exgrpo.models.sft import Padded, encode_row, epoch_batches, fit_warm_up, pad_rows
from exgrpo.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from exgrpo.verify.answers import BOX_OPEN

_WARMUP_FORMAT = 1  # bump when the training procedure changes, so cached warmed models are rebuilt
BOX = BOX_OPEN  # `\\boxed{`, the format the task solutions write (exgrpo.verify.verifier)
MISSPELLED_BOX = "\\boxes{"  # same length and digit positions as BOX; the verifier finds no answer


def check_spec(spec: Any, extra: Sequence[tuple[bool, str]] = ()) -> None:
    """Validate the training fields every warm-up spec has (steps, lr, batch_size, num_train,
    warmup_steps, min_lr_ratio, threads) plus `extra` (ok, message) pairs; one ValueError lists all."""
    checks = [
        (spec.steps >= 1, f"steps={spec.steps} must be >= 1"),
        (spec.lr > 0, f"lr={spec.lr} must be > 0"),
        (spec.batch_size >= 1, f"batch_size={spec.batch_size} must be >= 1"),
        (spec.num_train >= 1, f"num_train={spec.num_train} must be >= 1"),
        (spec.warmup_steps >= 0, f"warmup_steps={spec.warmup_steps} must be >= 0"),
        (0.0 <= spec.min_lr_ratio <= 1.0, f"min_lr_ratio={spec.min_lr_ratio} must be in [0, 1]"),
        (spec.threads >= 1, f"threads={spec.threads} must be >= 1"),
        *extra,
    ]
    errors = [message for ok, message in checks if not ok]
    if errors:
        raise ValueError(f"invalid {type(spec).__name__}: " + "; ".join(errors))


@dataclass(frozen=True)
class WarmupSpec:
    """Everything that determines a warmed model's weights (the cache key is its fingerprint)."""

    model: TinyModelSpec = field(default_factory=TinyModelSpec)  # shape and init of the random start
    task: str = "arith"  # builtin task whose train split is learned
    template: TemplateName = "plain"  # prompt frame (must render without a tokenizer chat template)
    steps: int = 1000  # AdamW updates
    lr: float = 1e-3  # peak learning rate
    batch_size: int = 64  # sequences per update
    label_noise: float = 0.0  # probability that a training response has one answer digit changed
    format_noise: float = 0.0  # probability that a training response misspells the box (scores 0)
    seed: int = 0  # train-split draw, data order and noise
    num_train: int = 50_000  # distinct train-split questions drawn (before the pattern filter)
    question_pattern: str = ""  # keep only drawn questions that fully match this regex ("": all)
    warmup_steps: int = 50  # linear learning-rate warm-up
    min_lr_ratio: float = 0.1  # cosine decay ends at min_lr_ratio * lr
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    threads: int = 1  # torch threads while training (part of the spec: float sums depend on it)

    def __post_init__(self) -> None:
        check_spec(
            self,
            [
                (0.0 <= self.label_noise <= 1.0, f"label_noise={self.label_noise} must be in [0, 1]"),
                (0.0 <= self.format_noise <= 1.0, f"format_noise={self.format_noise} must be in [0, 1]"),
            ],
        )

    def fingerprint(self) -> str:
        return spec_fingerprint(self, _WARMUP_FORMAT)


def spec_fingerprint(spec: Any, warmup_format: int) -> str:
    """Short hash of a warm-up spec, its random start's fingerprint and its warm-up format (the cache key)."""
    payload = json.dumps(
        {"spec": dataclasses.asdict(spec), "model": spec.model.fingerprint(), "format": warmup_format},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


ARITH_MODEL = TinyModelSpec(
    hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256
)
# builtin:arith-base: two-operand questions with 1-2 digit operands learned to convergence, with
# 40% misspelled boxes; held-out solve rate at T=1 in the 15-40% band (docs/base-model.md).
ARITH_BASE = WarmupSpec(
    model=ARITH_MODEL,
    steps=1500,
    lr=1e-3,
    batch_size=64,
    format_noise=0.4,
    seed=1,
    question_pattern=r"\d{1,2}[+-]\d{1,2}",
    threads=2,
)
# builtin:arith-weak: the same recipe stopped after a third of the updates, before the model has
# learned to add: held-out solve rate ~2% at T=1.
ARITH_WEAK = dataclasses.replace(ARITH_BASE, steps=500)
WARMED_SPECS: dict[str, WarmupSpec] = {"arith-base": ARITH_BASE, "arith-weak": ARITH_WEAK}


@dataclass(frozen=True)
class WarmupResult:
    """What `warm_up` measured (also written to `warmup.json`)."""

    fingerprint: str
    final_loss: float  # mean response-token cross-entropy over the last 10% of the updates (nats)
    first_loss: float  # mean over the first 10% of the updates
    loss_curve: tuple[float, ...]  # mean loss of each block of max(1, steps // 20) updates
    train_questions_sha256: str  # hash of the training question texts, in draw order
    num_train_questions: int
    build_seconds: float


def training_prompts(spec: WarmupSpec) -> list[Prompt]:
    """The questions the warm-up learns: of `spec.num_train` questions drawn from the task's train
    split (so eval-part questions never occur), those that fully match `spec.question_pattern`."""
    drawn = _task(spec).make_split(split="train", n=spec.num_train, seed=spec.seed)
    if not spec.question_pattern:
        return drawn
    pattern = re.compile(spec.question_pattern)
    kept = [p for p in drawn if pattern.fullmatch(p.question)]
    if not kept:
        raise ValueError(f"no drawn train question matches question_pattern={spec.question_pattern!r}")
    return kept


def questions_sha256(prompts: Sequence[Prompt]) -> str:
    """Hash of the question texts in order (recorded in warmup.json, compared by the tests)."""
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.question.encode() + b"\n")
    return digest.hexdigest()


def warm_up(out_dir: Path, *, spec: WarmupSpec) -> Path:
    """Build `spec.model`, train it on the task's train split, save it (float32) to `out_dir`.

    `out_dir` then holds `config.json`, `model.safetensors`, the tokenizer files and
    `warmup.json` = {"spec": ..., "result": WarmupResult}. Deterministic in `spec`.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    build_tiny_model(out_dir, spec=spec.model)
    prompts = training_prompts(spec)
    boxed = _encode(prompts, spec=spec, misspelled=False, width=0)
    misspelled = _encode(prompts, spec=spec, misspelled=True, width=boxed.input_ids.shape[1])
    return fit_and_record(
        out_dir,
        spec=spec,
        prompts=prompts,
        start=start,
        record_name="warmup.json",
        train=lambda model: _train(model, boxed, misspelled, spec=spec),
    )


def fit_and_record(
    out_dir: Path,
    *,
    spec: Any,
    prompts: Sequence[Prompt],
    start: float,
    record_name: str,
    train: Callable[[Any], list[float]],
) -> Path:
    """The shared end of every warm-up: load the random start in `out_dir`, run `train(model)` (which
    returns one loss per update) with `spec.threads` torch threads from seed `spec.seed`, save the float32
    weights next to the tokenizer and record `{"spec", "result": WarmupResult}` in `out_dir/record_name`."""
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
        losses = train(model)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir, safe_serialization=True)
    block = max(1, spec.steps // 20)
    tail = max(1, spec.steps // 10)
    result = WarmupResult(
        fingerprint=spec.fingerprint(),
        final_loss=float(np.mean(losses[-tail:])),
        first_loss=float(np.mean(losses[:tail])),
        loss_curve=tuple(float(np.mean(losses[i : i + block])) for i in range(0, len(losses), block)),
        train_questions_sha256=questions_sha256(prompts),
        num_train_questions=len(prompts),
        build_seconds=time.perf_counter() - start,
    )
    record = {"spec": dataclasses.asdict(spec), "result": dataclasses.asdict(result)}
    atomic_write_text(out_dir / record_name, json.dumps(record, indent=2) + "\n")
    return out_dir


def read_warmup(model_dir: Path) -> WarmupResult:
    """The `WarmupResult` recorded in `model_dir/warmup.json`."""
    record = json.loads((Path(model_dir) / "warmup.json").read_text())["result"]
    record["loss_curve"] = tuple(record["loss_curve"])
    return WarmupResult(**record)


# --------------------------------------------------------------------------------------- internals


def _task(spec: WarmupSpec) -> Task:
    return builtin_task(spec.task)


def _encode(prompts: Sequence[Prompt], *, spec: WarmupSpec, misspelled: bool, width: int) -> Padded:
    """The training sequences, one row per question, padded to at least `width` tokens; `misspelled` writes the
    response with `MISSPELLED_BOX` in place of `BOX`."""
    tokenizer = build_char_tokenizer()
    task = _task(spec)
    rows = []
    for prompt in prompts:
        response = task.solution_text(prompt)
        if misspelled:
            response = response.replace(BOX, MISSPELLED_BOX)
        rows.append(encode_row(tokenizer, render_prompt(prompt.question, template=spec.template), response))
    return pad_rows(rows, tokenizer.pad_token_id, width=width)


def _add_label_noise(
    input_ids: torch.Tensor, labels: torch.Tensor, *, share: float, rng: np.random.Generator
) -> None:
    """In place: in each row with probability `share`, one response digit (uniform over the row's
    response digits) becomes another digit, in the input and the label alike (a leading digit of
    a multi-digit number never becomes 0)."""
    digits = _digit_ids()
    is_digit = torch.isin(labels, torch.tensor(digits))  # (B, T)
    for row in np.flatnonzero(rng.random(len(labels)) < share):
        positions = torch.nonzero(is_digit[row]).flatten().tolist()
        if not positions:
            continue
        t = positions[int(rng.integers(len(positions)))]
        leading = not bool(is_digit[row, t - 1]) and t + 1 < labels.shape[1] and bool(is_digit[row, t + 1])
        choices = [d for i, d in enumerate(digits) if d != int(labels[row, t]) and not (leading and i == 0)]
        new = choices[int(rng.integers(len(choices)))]
        labels[row, t] = new
        input_ids[row, t] = new


def _digit_ids() -> list[int]:
    """Token ids of "0".."9" in the char tokenizer."""
    return build_char_tokenizer().encode("0123456789", add_special_tokens=False)


def _train(model: torch.nn.Module, boxed: Padded, misspelled: Padded, *, spec: WarmupSpec) -> list[float]:
    """spec.steps AdamW updates (`fit`) on consecutive slices of seeded permutations of the questions
    (a fresh permutation each epoch); each row is the misspelled variant with probability
    spec.format_noise and gets a changed digit with probability spec.label_noise."""
    batches = epoch_batches(len(boxed.lengths), spec=spec)
    noise_rng = np.random.default_rng([spec.seed, 3])  # its own stream: noise never shifts the data order

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        index = batches[step]  # (B,)
        swap = torch.from_numpy(noise_rng.random(len(index)) < spec.format_noise)  # (B,)
        ids = torch.where(swap[:, None], misspelled.input_ids[index], boxed.input_ids[index])  # (B, T)
        target = torch.where(swap[:, None], misspelled.labels[index], boxed.labels[index])  # (B, T)
        width = int(torch.where(swap, misspelled.lengths[index], boxed.lengths[index]).max())
        ids, target = ids[:, :width].contiguous(), target[:, :width].contiguous()  # (B, T')
        if spec.label_noise > 0:
            _add_label_noise(ids, target, share=spec.label_noise, rng=noise_rng)
        return {"input_ids": ids, "labels": target}  # the loss: mean cross-entropy over the response tokens

    return fit_warm_up(model, spec=spec, batch_at=batch_at, what="warm-up")
