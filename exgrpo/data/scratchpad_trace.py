"""The `scratchpad` task's trace: column addition written digit by digit, and its step-by-step check.

The expected response works the columns from the units up, one step per column, then boxes the sum
(`7+6+0=13;2+9+1=12;8+3+1=12;4+0+1=05;\\boxed{5223}` for `4827+396`). The reward stays outcome-only;
`check_trace` is a process check for measurement: it finds the first wrong step, so a right answer reached
through a wrong step can be told from a valid trace. The questions and splits are `exgrpo.data.scratchpad`'s.
More: docs/task.md ("What a question and a response look like"); tests: tests/exgrpo/data/test_scratchpad.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exgrpo.core.records import Prompt
from exgrpo.verify.answers import BOX_OPEN, boxed, extract_answer

_QUESTION = re.compile(r"(\d+)\+(\d+)")
_STEP = re.compile(r"(\d)\+(\d)\+(\d)=(\d\d);")
_STEPS = re.compile(r"(?:\d\+\d\+\d=\d\d;)*")


def parse_question(question: str) -> tuple[int, int]:
    """ "4827+396" -> (4827, 396) (raises ValueError on any other text)."""
    m = _QUESTION.fullmatch(question.strip())
    if m is None:
        raise ValueError(f"{question!r} is not a scratchpad question (like '4827+396')")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Step:
    """One column of the trace as written: `a+b+carry=result;`."""

    a: int
    b: int
    carry: int
    result: int  # 0..99 as written (two digits)

    def text(self) -> str:
        return f"{self.a}+{self.b}+{self.carry}={self.result:02d};"


def solution_steps(question: str) -> list[Step]:
    """The correct steps of `question`, units column first."""
    a, b = parse_question(question)
    steps, carry = [], 0
    for k in range(max(len(str(a)), len(str(b)))):
        da, db = a // 10**k % 10, b // 10**k % 10
        total = da + db + carry
        steps.append(Step(da, db, carry, total))
        carry = total // 10
    return steps


def carry_chain(steps: list[Step]) -> int:
    """The longest run of consecutive steps that carry out (e.g. 9999+1 -> 4, 4827+396 -> 3)."""
    best = run = 0
    for s in steps:
        run = run + 1 if s.result >= 10 else 0
        best = max(best, run)
    return best


def answer_from_steps(steps: list[Step]) -> int:
    """The sum read off written steps: final carry, then result units digits, last step first.

    Carries are the tens digits of the written results (a result of 2 digits always).
    """
    digits = [str(s.result % 10) for s in reversed(steps)]
    carry = steps[-1].result // 10 if steps else 0
    return int((str(carry) if carry else "") + "".join(digits) or "0")


def render(steps: list[Step], answer: int | str) -> str:
    """The response text of written steps and a final answer."""
    return "".join(s.text() for s in steps) + boxed(answer)


@dataclass(frozen=True)
class TraceCheck:
    """What `check_trace` found in one response.

    A step is right when its operand digits are the question's digits of that column, its carry
    is the tens digit of the previous written result (0 for the first step) and its result is the
    sum of its three written terms. A trace with too few or too many steps has its first wrong
    step at the first missing or extra one.
    """

    parsed: bool  # the response is steps followed by exactly one `\\boxed{...}` (nothing else)
    num_steps: int  # steps written (0 when not parsed)
    first_wrong_step: int | None  # index of the first wrong step (None: every step right)
    answer_correct: bool  # the boxed answer equals the sum (what the outcome reward sees)

    @property
    def valid(self) -> bool:
        """A fully valid trace: parsed, every step right, the right answer."""
        return self.parsed and self.first_wrong_step is None and self.answer_correct

    @property
    def flawed_correct(self) -> bool:
        """The right answer reached through a trace with a wrong (or missing/extra) step."""
        return self.answer_correct and not self.valid


def check_trace(question: str, response: str) -> TraceCheck:
    """Check `response` to `question` step by step (measurement only; the reward is outcome-only).

    `answer_correct` is judged from `exgrpo.verify.answers.extract_answer` (the last box), whether or not
    the rest parses, so it agrees with the outcome reward on integer answers.
    """
    a, b = parse_question(question)
    answer = extract_answer(response)
    answer_correct = answer is not None and answer.isdigit() and int(answer) == a + b
    box_at = response.rfind(BOX_OPEN)
    prefix = response[:box_at] if box_at >= 0 else ""
    parsed = (
        box_at >= 0
        and answer is not None
        and _STEPS.fullmatch(prefix) is not None
        and response[box_at:].rstrip() == boxed(answer)
    )
    if not parsed:
        return TraceCheck(parsed=False, num_steps=0, first_wrong_step=None, answer_correct=answer_correct)
    written = [Step(*(int(g) for g in m.groups())) for m in _STEP.finditer(prefix)]
    expected = max(len(str(a)), len(str(b)))
    first_wrong = None
    carry = 0
    for k, step in enumerate(written):
        right = (
            k < expected
            and step.a == a // 10**k % 10
            and step.b == b // 10**k % 10
            and step.carry == carry
            and step.result == step.a + step.b + step.carry
        )
        if not right:
            first_wrong = k
            break
        carry = step.result // 10
    if first_wrong is None and len(written) < expected:
        first_wrong = len(written)
    return TraceCheck(
        parsed=True, num_steps=len(written), first_wrong_step=first_wrong, answer_correct=answer_correct
    )


def trace_valid(prompt: Prompt, response: str) -> bool:
    """Process check for measurement (replay/chosen_valid_frac): every step of the trace is right."""
    return check_trace(prompt.question, response).valid
