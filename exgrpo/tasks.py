"""Builtin verifiable tasks: seeded generators of questions with exact integer answers.

`arith` (the embedded default run's task) asks for the value of a short chain of additions and
subtractions, e.g. `"347+85-19"` -> `413`; the expected response is `\\boxed{413}`. Difficulty
varies across questions through the operand lengths (1-3 digits), the number of operands (2 or
3) and the number of column carries/borrows, so a partly trained model solves some questions
every time, some never and many k out of K times (the middle buckets ExGRPO replays most).

Held-out guarantee: a fixed keyed hash of the question text splits the whole question space
into an eval part (1/8) and a train part (7/8), independently of any seed. The train split only
emits train-part questions and the eval split only eval-part ones, so no eval question text can
appear in any train split, whatever the seeds. See docs/task.md for the reasoning.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from exgrpo.types import Prompt

Split = Literal["train", "eval"]

EVAL_SHARE = 8  # one question in EVAL_SHARE (by hash) belongs to the held-out eval part
_HASH_KEY = b"exgrpo-arith-v1"  # fixed: changing it re-partitions the question space
_SPLIT_STREAM = {"train": 0, "eval": 1}  # separate random streams per split
_QUESTION = re.compile(r"\d{1,3}(?:[+-]\d{1,3}){1,2}")
_TERM = re.compile(r"([+-]?)(\d+)")


def boxed(answer: str | int) -> str:
    """The response format the tasks expect: `\\boxed{<answer>}`."""
    return f"\\boxed{{{answer}}}"


def in_eval_part(question: str) -> bool:
    """True if the question text belongs to the held-out part of the question space."""
    digest = hashlib.blake2b(question.encode("utf-8"), digest_size=8, key=_HASH_KEY).digest()
    return int.from_bytes(digest, "big") % EVAL_SHARE == 0


class Task(Protocol):
    """A builtin task: splits of prompts, reference responses and a difficulty score."""

    name: str

    def make_split(self, *, split: Split, n: int, seed: int | None = None) -> list[Prompt]: ...

    def solution_text(self, prompt: Prompt) -> str: ...

    def difficulty(self, prompt: Prompt) -> int: ...


@dataclass(frozen=True)
class ArithTask:
    """Additions and subtractions of 1-3 digit numbers (2 or 3 operands), non-negative throughout.

    Sampling per question: 2 operands with probability `p_two_operands`, else 3; each operand's
    digit count is 1, 2 or 3 with probabilities `digit_probs` (1 digit: 0-9; d digits:
    10^(d-1) .. 10^d - 1); each operator is + or - with probability 1/2; a draw whose running
    value goes negative is discarded. Questions are unique within a split and at most 11
    characters long ("999+999-999").
    """

    seed: int = 0  # default seed of make_split
    p_two_operands: float = 0.7
    digit_probs: tuple[float, float, float] = (0.4, 0.35, 0.25)
    name: str = "arith"

    def make_split(self, *, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """n prompts with qids `arith-{split}-{i:05d}`; the same (split, n, seed) gives the same list.

        A longer list with the same seed starts with the shorter one (prefix-stable).
        """
        if split not in _SPLIT_STREAM:
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        seed = self.seed if seed is None else seed
        rng = np.random.default_rng([seed, _SPLIT_STREAM[split]])
        want_eval = split == "eval"
        questions: list[str] = []
        seen: set[str] = set()
        drawn, max_draws = 0, 200 * n + 10_000
        while len(questions) < n:
            if drawn > max_draws:
                raise RuntimeError(f"could not draw {n} distinct {split} questions in {max_draws} draws")
            batch = self._draw(rng, 4096)
            drawn += len(batch)
            for q in batch:
                if q is None or q in seen or in_eval_part(q) != want_eval:
                    continue
                seen.add(q)
                questions.append(q)
                if len(questions) == n:
                    break
        return [
            Prompt(qid=f"arith-{split}-{i:05d}", question=q, answer=str(_evaluate(q)), data_source=self.name)
            for i, q in enumerate(questions)
        ]

    def solution_text(self, prompt: Prompt) -> str:
        """The correct response, e.g. `\\boxed{413}` for "347+85-19" (raises if the gold disagrees)."""
        value = _evaluate(prompt.question)
        if prompt.answer.strip() != str(value):
            raise ValueError(f"{prompt.qid}: gold answer {prompt.answer!r} but {prompt.question} = {value}")
        return boxed(value)

    def difficulty(self, prompt: Prompt) -> int:
        """carries + borrows (column-wise, evaluated left to right) + (longest operand's digits - 1)
        + (operands - 2).

        E.g. "5+3" -> 0; "58+67" -> 2 carries + 1 = 3; "347+85-19" -> 347+85 = 432 carries in the
        units and tens (2), 432-19 borrows in the units (1), + 2 + 1 = 6.
        """
        terms = _parse(prompt.question)
        total, carries = terms[0], 0
        for term in terms[1:]:
            carries += _column_carries(total, abs(term), subtract=term < 0)
            total += term
        digits = max(len(str(abs(t))) for t in terms)
        return carries + (digits - 1) + (len(terms) - 2)

    def _draw(self, rng: np.random.Generator, m: int) -> list[str | None]:
        """m candidate questions; None where the running value went negative."""
        n_terms = np.where(rng.random(m) < self.p_two_operands, 2, 3)
        digits = rng.choice(np.arange(1, 4), size=(m, 3), p=np.asarray(self.digit_probs))
        low = np.where(digits == 1, 0, 10 ** (digits - 1))
        values = rng.integers(low, 10**digits)  # (m, 3)
        minus = rng.random((m, 2)) < 0.5  # (m, 2)
        out: list[str | None] = []
        for i in range(m):
            total, text, ok = int(values[i, 0]), str(values[i, 0]), True
            for j in range(1, int(n_terms[i])):
                v = int(values[i, j])
                total = total - v if minus[i, j - 1] else total + v
                text += ("-" if minus[i, j - 1] else "+") + str(v)
                ok = ok and total >= 0
            out.append(text if ok else None)
        return out


def _parse(question: str) -> list[int]:
    """ "347+85-19" -> [347, 85, -19]."""
    text = question.strip()
    if not _QUESTION.fullmatch(text):
        raise ValueError(f"{question!r} is not an arith question (like '347+85-19')")
    return [int(num) * (-1 if sign == "-" else 1) for sign, num in _TERM.findall(text)]


def _evaluate(question: str) -> int:
    return sum(_parse(question))


def _column_carries(a: int, b: int, *, subtract: bool) -> int:
    """Carries of a + b, or borrows of a - b (a >= b), counted column by column."""
    count = carry = 0
    while a or b:
        da, db = a % 10, b % 10
        carry = int(da - db - carry < 0) if subtract else int(da + db + carry >= 10)
        count += carry
        a, b = a // 10, b // 10
    return count


BUILTIN_TASKS: dict[str, type[ArithTask]] = {"arith": ArithTask}


def builtin_task(name: str, *, seed: int = 0) -> Task:
    """A builtin task by name ("arith", or "builtin:arith" as written in configs)."""
    key = name.removeprefix("builtin:")
    if key not in BUILTIN_TASKS:
        raise ValueError(f"unknown builtin task {name!r}; valid names: {', '.join(sorted(BUILTIN_TASKS))}")
    return BUILTIN_TASKS[key](seed=seed)
