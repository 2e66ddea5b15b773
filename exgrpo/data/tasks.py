"""Builtin verifiable tasks: seeded generators of questions with exact integer answers.

`arith` (chains of additions and subtractions, `"347+85-19"` -> `413`) and `gsm` (word problems of one to three
steps, `GsmTask`); `BUILTIN_TASKS` names every builtin task. Held-out guarantee: a fixed keyed hash of the
question (for `gsm`, of its equation) splits the question space into an eval part (1/8) and a train part, so no
eval question appears in any train split, whatever the seeds. More: docs/data.md ("Builtin tasks"),
docs/task.md; tests: tests/exgrpo/data/test_tasks.py.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from string import Formatter
from typing import Literal, Protocol

import numpy as np

from exgrpo.core.config import builtin_name
from exgrpo.core.records import Prompt
from exgrpo.data.gym_tasks import GYM_TASKS
from exgrpo.data.scratchpad import SCRATCHPAD_TASKS
from exgrpo.data.scratchpad_trace import trace_valid
from exgrpo.verify.answers import boxed  # the response format the tasks expect (re-exported)

Split = Literal["train", "eval"]

EVAL_SHARE = 8  # one question in EVAL_SHARE (by hash) belongs to the held-out eval part
_HASH_KEY = b"exgrpo-arith-v1"  # fixed: changing it re-partitions the question space
_SPLIT_STREAM = {"train": 0, "eval": 1}  # separate random streams per split
_QUESTION = re.compile(r"\d{1,3}(?:[+-]\d{1,3}){1,2}")
_TERM = re.compile(r"([+-]?)(\d+)")


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


# --------------------------------------------------------------------------- gsm: word problems

_NAMES = (
    ("Tom", "He", "him"),
    ("Anna", "She", "her"),
    ("Sam", "He", "him"),
    ("Lily", "She", "her"),
    ("Ben", "He", "him"),
    ("Mia", "She", "her"),
    ("Jack", "He", "him"),
    ("Emma", "She", "her"),
    ("Leo", "He", "him"),
    ("Zoe", "She", "her"),
)  # (name, subject pronoun, object pronoun)
_ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "cookies",
    "books",
    "stamps",
    "shells",
    "cards",
    "balloons",
)
_BOXES = ("bags", "boxes", "packs")
GsmKind = Literal["add", "sub", "bags", "share"]  # +n, -n, +b*c, -b*c
_KINDS: tuple[GsmKind, ...] = ("add", "sub", "bags", "share")
# One sentence per step. Fields: {S} subject pronoun, {O} object pronoun, {F} a friend, {x} the item,
# {k} a container; numbers {n} (add, sub), {b} and {c} (products: b containers/friends of c each).
_PHRASES: dict[str, tuple[str, ...]] = {
    "add": ("{S} buys {n} more {x}.", "{S} finds {n} more {x}.", "{F} gives {O} {n} {x}."),
    "sub": ("{S} gives {n} {x} to {F}.", "{S} loses {n} {x}.", "{S} sells {n} {x}."),
    "bags": ("{S} buys {b} {k} of {c} {x}.", "{S} gets {b} {k} with {c} {x} in each."),
    "share": ("{S} gives {c} {x} to each of {b} friends.",),
}
_OPENING = re.compile(r"(?P<name>[A-Z][a-z]+) has (?P<a>\d+) (?P<x>[a-z]+)\.")
_CLOSING = re.compile(r"How many (?P<x>[a-z]+) does (?P<name>[A-Z][a-z]+) have now\?")


def _phrase_pattern(template: str) -> re.Pattern[str]:
    """A phrase template as a regex: number fields captured by name, word fields matched as words."""
    parts = []
    for literal, field_name, _, _ in Formatter().parse(template):
        parts.append(re.escape(literal))
        if field_name in ("n", "b", "c"):
            parts.append(f"(?P<{field_name}>\\d+)")
        elif field_name:
            parts.append("[A-Za-z]+")
    return re.compile("".join(parts))


_PATTERNS = tuple((kind, _phrase_pattern(t)) for kind, phrases in _PHRASES.items() for t in phrases)


@dataclass(frozen=True)
class GsmStep:
    """One step of a word problem: `count * size` items gained (add, bags) or lost (sub, share)."""

    kind: GsmKind
    count: int  # n for add/sub; b (containers or friends) for bags/share
    size: int = 1  # c (items per container or per friend); 1 for add/sub

    @property
    def delta(self) -> int:
        return (1 if self.kind in ("add", "bags") else -1) * self.count * self.size

    def term(self) -> str:
        """This step in the problem's equation: "+5", "-5", "+3*4" or "-3*4"."""
        sign = "+" if self.delta >= 0 else "-"
        return f"{sign}{self.count}" if self.kind in ("add", "sub") else f"{sign}{self.count}*{self.size}"


@dataclass(frozen=True)
class GsmProblem:
    """A parsed word problem: the starting count and the steps, in order."""

    start: int
    steps: tuple[GsmStep, ...]

    @property
    def equation(self) -> str:
        """E.g. "12+3*4-5": the held-out split hashes this, not the wording."""
        return str(self.start) + "".join(s.term() for s in self.steps)

    @property
    def answer(self) -> int:
        return self.start + sum(s.delta for s in self.steps)


def parse_gsm(question: str) -> GsmProblem:
    """The problem behind a `gsm` question (raises ValueError on any other text)."""
    sentences = re.split(r"(?<=[.?])\s+", question.strip())
    opening = _OPENING.fullmatch(sentences[0])
    closing = _CLOSING.fullmatch(sentences[-1])
    if len(sentences) < 3 or opening is None or closing is None:
        raise ValueError(f"{question!r} is not a gsm question (like 'Tom has 12 apples. ... have now?')")
    steps = []
    for sentence in sentences[1:-1]:
        match = next(((k, m) for k, p in _PATTERNS if (m := p.fullmatch(sentence))), None)
        if match is None:
            raise ValueError(f"{sentence!r} in {question!r} is not a gsm step")
        kind, m = match
        fields = m.groupdict()
        if kind in ("add", "sub"):
            steps.append(GsmStep(kind, int(fields["n"])))
        else:
            steps.append(GsmStep(kind, int(fields["b"]), int(fields["c"])))
    return GsmProblem(start=int(opening["a"]), steps=tuple(steps))


@dataclass(frozen=True)
class GsmTask:
    """Grade-school word problems: a starting count, one to three steps, "how many now?".

    Sampling per question: a name, a friend, an item; start uniform in 2..max_start; 1, 2 or 3 steps
    with probabilities `step_probs`; each step's kind with probabilities `kind_probs` over
    (add n, sub n, bags +b*c, share -b*c), n in 2..max_n, b in 2..6 and c in 2..10, and a phrasing
    drawn uniformly from the kind's phrases. A step that would make the count negative is redrawn,
    so every answer is a non-negative integer. Questions are unique within a split.
    """

    seed: int = 0  # default seed of make_split
    step_probs: tuple[float, float, float] = (0.4, 0.35, 0.25)  # 1, 2, 3 steps
    kind_probs: tuple[float, float, float, float] = (0.3, 0.3, 0.25, 0.15)  # add, sub, bags, share
    max_start: int = 30  # largest starting count
    max_n: int = 15  # largest count added or removed in one add/sub step
    name: str = "gsm"

    def make_split(self, *, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """n prompts with qids `gsm-{split}-{i:05d}`; deterministic in (split, n, seed) and prefix-stable."""
        if split not in _SPLIT_STREAM:
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        seed = self.seed if seed is None else seed
        rng = np.random.default_rng([seed, _SPLIT_STREAM[split], 7])  # 7: a stream apart from arith's
        want_eval = split == "eval"
        prompts: list[Prompt] = []
        seen: set[str] = set()
        for _ in range(200 * n + 10_000):
            if len(prompts) == n:
                return prompts
            question, problem = self._draw(rng)
            if question in seen or in_eval_part(problem.equation) != want_eval:
                continue
            seen.add(question)
            prompts.append(
                Prompt(
                    qid=f"gsm-{split}-{len(prompts):05d}",
                    question=question,
                    answer=str(problem.answer),
                    data_source=self.name,
                )
            )
        if len(prompts) < n:
            raise RuntimeError(f"could not draw {n} distinct {split} gsm questions")
        return prompts

    def solution_text(self, prompt: Prompt) -> str:
        """A worked solution, one line per step, ending in `\\boxed{answer}` (raises if the gold disagrees)."""
        problem = parse_gsm(prompt.question)
        if prompt.answer.strip() != str(problem.answer):
            raise ValueError(
                f"{prompt.qid}: gold answer {prompt.answer!r} but {problem.equation} = {problem.answer}"
            )
        lines, total = [f"Start: {problem.start}."], problem.start
        for step in problem.steps:
            op = "+" if step.delta >= 0 else "-"
            amount = abs(step.delta)
            product = f"{step.count} * {step.size} = {amount}, so " if step.kind in ("bags", "share") else ""
            lines.append(f"{product}{total} {op} {amount} = {total + step.delta}.")
            total += step.delta
        lines.append(f"The answer is {boxed(total)}.")
        return "\n".join(lines)

    def difficulty(self, prompt: Prompt) -> int:
        """steps + product steps, e.g. "Tom has 12 apples. He buys 3 bags of 4 apples. ..." -> 1 + 1 = 2."""
        steps = parse_gsm(prompt.question).steps
        return len(steps) + sum(s.kind in ("bags", "share") for s in steps)

    def _draw(self, rng: np.random.Generator) -> tuple[str, GsmProblem]:
        i, j = rng.choice(len(_NAMES), size=2, replace=False)
        name, subject, obj = _NAMES[int(i)]
        words = {"S": subject, "O": obj, "F": _NAMES[int(j)][0], "x": _ITEMS[int(rng.integers(len(_ITEMS)))]}
        start = int(rng.integers(2, self.max_start + 1))
        total, steps, sentences = start, [], [f"{name} has {start} {words['x']}."]
        for _ in range(1 + int(rng.choice(3, p=np.asarray(self.step_probs)))):
            while True:  # redraw a step that would go negative (an add step always fits)
                kind = _KINDS[int(rng.choice(4, p=np.asarray(self.kind_probs)))]
                if kind in ("add", "sub"):
                    step = GsmStep(kind, int(rng.integers(2, self.max_n + 1)))
                else:
                    step = GsmStep(kind, int(rng.integers(2, 7)), int(rng.integers(2, 11)))
                if total + step.delta >= 0:
                    break
            phrases = _PHRASES[kind]
            template = phrases[int(rng.integers(len(phrases)))]
            box = _BOXES[int(rng.integers(len(_BOXES)))]
            sentences.append(template.format(**words, k=box, n=step.count, b=step.count, c=step.size))
            steps.append(step)
            total += step.delta
        sentences.append(f"How many {words['x']} does {name} have now?")
        return " ".join(sentences), GsmProblem(start=start, steps=tuple(steps))


_MORE_TASKS = {**SCRATCHPAD_TASKS, **GYM_TASKS}  # GYM_TASKS: reasoning-gym generators (gym_tasks.py)
BUILTIN_TASKS: dict[str, Callable[..., Task]] = {"arith": ArithTask, "gsm": GsmTask, **_MORE_TASKS}


def trace_checker(name: str) -> Callable[[Prompt, str], bool] | None:
    """The process check of a builtin task with reasoning traces (measurement only), else None."""
    key = builtin_name(name) or name
    return trace_valid if key.startswith("scratchpad") else None


def builtin_task(name: str, *, seed: int = 0) -> Task:
    """A builtin task by name ("arith", "gsm", or "builtin:gsm" as written in configs)."""
    key = builtin_name(name) or name
    if key not in BUILTIN_TASKS:
        raise ValueError(f"unknown builtin task {name!r}; valid names: {', '.join(sorted(BUILTIN_TASKS))}")
    return BUILTIN_TASKS[key](seed=seed)
