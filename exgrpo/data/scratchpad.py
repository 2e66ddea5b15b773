"""`scratchpad`: column addition written digit by digit, a reasoning task whose trace has a ground truth.

This module draws each split's questions and writes their traces (`noisy_solution`: propagating and silent
errors, the warm-up's material); the response format and `check_trace` are `exgrpo.data.scratchpad_trace`'s,
re-exported here. Invariant: a keyed hash of the question text puts it in the train, val or eval part whatever the
seeds, so no val or eval question occurs in any train split, and OOD questions (longer carry chains, or longer
operands) only in the OOD splits. More: docs/task.md ("Splits"); tests: tests/exgrpo/data/test_scratchpad.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from exgrpo.core.records import Prompt
from exgrpo.data.scratchpad_trace import (
    Step,
    TraceCheck,
    answer_from_steps,
    carry_chain,
    check_trace,
    parse_question,
    render,
    solution_steps,
    trace_valid,
)

__all__ = [
    "ID_SOURCE",
    "OOD_SOURCE",
    "SCRATCHPAD_TASKS",
    "SPLITS",
    "ScratchpadHeldOut",
    "ScratchpadTask",
    "ScratchpadView",
    "Step",
    "TraceCheck",
    "answer_from_steps",
    "carry_chain",
    "check_trace",
    "parse_question",
    "question_part",
    "render",
    "solution_steps",
    "trace_valid",
]

OodKind = Literal["longer", "carry-chain"]
ScratchpadSplit = Literal["train", "val", "eval", "ood-val", "ood-eval"]
SPLITS: tuple[str, ...] = ("train", "val", "eval", "ood-val", "ood-eval")
ID_SOURCE = "scratchpad-id"
OOD_SOURCE = "scratchpad-ood"

PARTS = 8  # the question space in eighths: part 0 = eval, part 1 = val, parts 2..7 = train
_HASH_KEY = b"exgrpo-scratchpad-v1"  # fixed: changing it re-partitions the question space
_PART_OF_SPLIT = {"train": "train", "val": "val", "eval": "eval", "ood-val": "val", "ood-eval": "eval"}
_STREAM = {"train": 0, "val": 1, "eval": 2, "ood-val": 3, "ood-eval": 4}  # one random stream per split
_PROPAGATING_DELTAS = (-2, -1, 1, 2)  # how far a propagating error's written result is off


def question_part(question: str) -> Literal["train", "val", "eval"]:
    """The part of the question space `question` belongs to (by a keyed hash of its text)."""
    digest = hashlib.blake2b(question.encode("utf-8"), digest_size=8, key=_HASH_KEY).digest()
    part = int.from_bytes(digest, "big") % PARTS
    return "eval" if part == 0 else "val" if part == 1 else "train"


@dataclass(frozen=True)
class ScratchpadTask:
    """Two-operand column addition with a digit-by-digit trace (docs/task.md).

    Sampling per question: the longer operand's digit count L uniform over the split's range
    (`id_digits`; `ood_digits` for ood="longer"; for ood="carry-chain" OOD splits, L >=
    id_max_chain + 1), the other operand's uniform in 1..L, the order of the two uniform; a d-digit
    operand is uniform in 10^(d-1)..10^d - 1 (0-9 for one digit); a draw on the wrong side of the
    ID/OOD line (`is_ood`) or in another part of the hash partition is discarded. Questions are
    unique within a split.
    """

    seed: int = 0  # default seed of make_split
    id_digits: tuple[int, int] = (1, 4)  # in-distribution range of the longer operand's digits
    ood: OodKind = "carry-chain"  # what makes a question out of distribution
    ood_digits: tuple[int, int] = (5, 5)  # ood="longer": the OOD range (disjoint from id_digits)
    id_max_chain: int = 2  # ood="carry-chain": ID questions' longest run of carries; OOD ones' is longer
    name: str = "scratchpad"

    def __post_init__(self) -> None:
        (lo, hi), (olo, ohi) = self.id_digits, self.ood_digits
        if self.ood not in ("longer", "carry-chain"):
            raise ValueError(f"ood={self.ood!r} must be 'longer' or 'carry-chain'")
        if self.ood == "longer" and (not (1 <= lo <= hi and 1 <= olo <= ohi) or not (ohi < lo or olo > hi)):
            raise ValueError(
                f"id_digits={self.id_digits} and ood_digits={self.ood_digits} must be disjoint ranges >= 1"
            )
        if self.ood == "carry-chain" and not (1 <= lo <= hi and 0 <= self.id_max_chain < hi):
            raise ValueError(
                f"id_max_chain={self.id_max_chain} must be in 0..{hi - 1} (id_digits={self.id_digits})"
            )

    def is_ood(self, question: str) -> bool:
        """True if `question` lies in the OOD range (longer operands, or a longer run of carries)."""
        steps = solution_steps(question)
        if self.ood == "longer":
            return len(steps) > self.id_digits[1] or len(steps) < self.id_digits[0]
        return carry_chain(steps) > self.id_max_chain

    def make_split(self, *, split: ScratchpadSplit, n: int, seed: int | None = None) -> list[Prompt]:
        """n prompts with qids `scratchpad-{split}-{i:05d}`; deterministic in (split, n, seed) and
        prefix-stable (a longer list with the same seed starts with the shorter one)."""
        if split not in _STREAM:
            raise ValueError(f"split={split!r} must be one of {', '.join(SPLITS)}")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        seed = self.seed if seed is None else seed
        ood = split.startswith("ood-")
        lo, hi = self.ood_digits if ood and self.ood == "longer" else self.id_digits
        if ood and self.ood == "carry-chain":
            lo = max(lo, self.id_max_chain + 1)  # a run of c carries needs c columns
        rng = np.random.default_rng([seed, _STREAM[split], 11])  # 11: streams apart from the other tasks
        part = _PART_OF_SPLIT[split]
        questions: list[str] = []
        seen: set[str] = set()
        for _ in range(200 * n + 10_000):
            if len(questions) == n:
                break
            longer = int(rng.integers(lo, hi + 1))
            shorter = int(rng.integers(1, longer + 1))
            x, y = _operand(rng, longer), _operand(rng, shorter)
            q = f"{x}+{y}" if rng.random() < 0.5 else f"{y}+{x}"
            if q in seen or question_part(q) != part or self.is_ood(q) != ood:
                continue
            seen.add(q)
            questions.append(q)
        if len(questions) < n:
            raise RuntimeError(f"could not draw {n} distinct {split} scratchpad questions")
        source = OOD_SOURCE if ood else ID_SOURCE
        return [
            Prompt(
                qid=f"scratchpad-{split}-{i:05d}",
                question=q,
                answer=str(sum(parse_question(q))),
                data_source=source,
            )
            for i, q in enumerate(questions)
        ]

    def solution_text(self, prompt: Prompt) -> str:
        """The fully valid trace (raises if the gold answer disagrees with the question)."""
        steps = solution_steps(prompt.question)
        value = answer_from_steps(steps)
        if prompt.answer.strip() != str(value):
            raise ValueError(f"{prompt.qid}: gold answer {prompt.answer!r} but {prompt.question} = {value}")
        return render(steps, value)

    def noisy_solution(
        self, prompt: Prompt, rng: np.random.Generator, p_propagating: float, p_silent: float
    ) -> str:
        """A trace with controlled noise (docs/task.md, "Base models"): with probability p_propagating
        one step's result is off by 1 or 2 and the error propagates to a wrong answer; with
        probability p_silent one step miscopies an operand digit but writes the true sum (flawed
        trace, right answer); otherwise the valid trace. The step is uniform over the steps."""
        if not (p_propagating >= 0 and p_silent >= 0 and p_propagating + p_silent <= 1):
            raise ValueError(
                f"need p_propagating, p_silent >= 0 with sum <= 1, got {p_propagating}, {p_silent}"
            )
        a, b = parse_question(prompt.question)
        true_steps = solution_steps(prompt.question)
        u = float(rng.random())
        k = int(rng.integers(len(true_steps)))
        if u < p_propagating:
            steps, carry = [], 0
            for j, s in enumerate(true_steps):
                total = s.a + s.b + carry
                if j == k:
                    choices = [total + d for d in _PROPAGATING_DELTAS if 0 <= total + d <= 19]
                    total = choices[int(rng.integers(len(choices)))]
                steps.append(Step(s.a, s.b, carry, total))
                carry = total // 10
            return render(steps, answer_from_steps(steps))
        steps = list(true_steps)
        if u < p_propagating + p_silent:
            s = steps[k]
            which = int(rng.integers(2))
            old = s.a if which == 0 else s.b
            new = int(rng.choice([d for d in range(10) if d != old]))
            steps[k] = Step(new, s.b, s.carry, s.result) if which == 0 else Step(s.a, new, s.carry, s.result)
        return render(steps, a + b)

    def difficulty(self, prompt: Prompt) -> int:
        """(steps - 1) + carries, e.g. "5+3" -> 0, "4827+396" -> 3 + 3 = 6."""
        steps = solution_steps(prompt.question)
        return len(steps) - 1 + sum(s.result >= 10 for s in steps)

    def num_steps(self, prompt: Prompt) -> int:
        """Digits of the longer operand (= steps of the valid trace)."""
        return len(solution_steps(prompt.question))


def _operand(rng: np.random.Generator, digits: int) -> int:
    if digits == 1:
        return int(rng.integers(0, 10))
    return int(rng.integers(10 ** (digits - 1), 10**digits))


@dataclass(frozen=True)
class ScratchpadView:
    """`ScratchpadTask` with its `eval` split redirected, for configs that only know train/eval.

    `data.eval: builtin:scratchpad-ood` scores the OOD held-out questions; `builtin:scratchpad-val`
    and `builtin:scratchpad-ood-val` score the validation questions (hyper-parameter search), so
    the held-out eval questions stay for the final numbers. Every other split is passed through
    (`train` is the ID train split).
    """

    seed: int = 0  # default seed of make_split
    eval_split: ScratchpadSplit = "ood-eval"  # what `make_split(split="eval")` returns
    name: str = "scratchpad-ood"
    task: ScratchpadTask = ScratchpadTask()

    def make_split(self, *, split: ScratchpadSplit, n: int, seed: int | None = None) -> list[Prompt]:
        seed = self.seed if seed is None else seed
        return self.task.make_split(split=self.eval_split if split == "eval" else split, n=n, seed=seed)

    def solution_text(self, prompt: Prompt) -> str:
        return self.task.solution_text(prompt)

    def difficulty(self, prompt: Prompt) -> int:
        return self.task.difficulty(prompt)


@dataclass(frozen=True)
class ScratchpadHeldOut:
    """`ScratchpadTask` whose `eval` split is half ID and half OOD questions (each tagged by its
    `data_source`), so one run scores both ranges separately (`eval/accuracy_scratchpad_id`, `..._ood`).

    `builtin:scratchpad-heldout` gives the held-out eval and ood-eval questions (final numbers only);
    `builtin:scratchpad-val-all` the val and ood-val questions (choosing hyper-parameters).
    """

    seed: int = 0
    splits: tuple[ScratchpadSplit, ScratchpadSplit] = ("eval", "ood-eval")
    name: str = "scratchpad-heldout"
    task: ScratchpadTask = ScratchpadTask()

    def make_split(self, *, split: ScratchpadSplit, n: int, seed: int | None = None) -> list[Prompt]:
        seed = self.seed if seed is None else seed
        if split != "eval":
            return self.task.make_split(split=split, n=n, seed=seed)
        id_split, ood_split = self.splits
        return self.task.make_split(split=id_split, n=n - n // 2, seed=seed) + self.task.make_split(
            split=ood_split, n=n // 2, seed=seed
        )

    def solution_text(self, prompt: Prompt) -> str:
        return self.task.solution_text(prompt)

    def difficulty(self, prompt: Prompt) -> int:
        return self.task.difficulty(prompt)


# builtin task names -> factories (seed=...) for `exgrpo.data.tasks.BUILTIN_TASKS`
SCRATCHPAD_TASKS = {
    "scratchpad-heldout": ScratchpadHeldOut,
    "scratchpad-val-all": lambda seed=0: ScratchpadHeldOut(
        seed=seed, splits=("val", "ood-val"), name="scratchpad-val-all"
    ),
    "scratchpad": ScratchpadTask,
    # a hard training distribution: 4-digit questions only (the base solves ~12% of them, so most fresh
    # groups are all wrong: the regime where revisiting solved questions might pay); train with it and
    # evaluate on builtin:scratchpad-val-all / -heldout
    "scratchpad-4digit": lambda seed=0: ScratchpadTask(seed=seed, id_digits=(4, 4), name="scratchpad-4digit"),
    # its held-out questions: 4-digit ID and 4-digit OOD (carry chains), final numbers / choosing settings
    "scratchpad-4digit-heldout": lambda seed=0: ScratchpadHeldOut(
        seed=seed,
        task=ScratchpadTask(id_digits=(4, 4), name="scratchpad-4digit"),
        name="scratchpad-4digit-heldout",
    ),
    "scratchpad-4digit-val-all": lambda seed=0: ScratchpadHeldOut(
        seed=seed,
        splits=("val", "ood-val"),
        task=ScratchpadTask(id_digits=(4, 4), name="scratchpad-4digit"),
        name="scratchpad-4digit-val-all",
    ),
    "scratchpad-val": lambda seed=0: ScratchpadView(seed=seed, eval_split="val", name="scratchpad-val"),
    "scratchpad-ood": lambda seed=0: ScratchpadView(seed=seed, eval_split="ood-eval", name="scratchpad-ood"),
    "scratchpad-ood-val": lambda seed=0: ScratchpadView(
        seed=seed, eval_split="ood-val", name="scratchpad-ood-val"
    ),
}
