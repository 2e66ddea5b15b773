"""Two scores of a reply to a question whose answer is a number: strict (the requested format) and lenient.

`strict`: the reply's last `\\boxed{...}` holds a plain number equal to the gold; `lenient`: the last number written
anywhere equals it. Both are plain reward functions (`reward.fn: exgrpo.verify.number_scores:strict` or
`...:lenient`), so a run can tell format learning from arithmetic. Numbers are compared as `decimal.Decimal`
(no eval, no sympify of model text); every failure scores 0, never raises. More: docs/rewards.md ("Built in:
strict and lenient scores of numeric answers"); tests: tests/exgrpo/verify/test_number_scores.py.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from exgrpo.verify.answers import last_boxed

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"  # 7, 1,000, 7.5 (commas only as thousands groups)
_PLAIN = re.compile(
    r"\$?\s*([+-]?\s*" + _NUMBER + r")\s*\$?"
)  # a box's whole content: a number, maybe in $..$
_LAST = re.compile(r"(?<![\w.])(-?)(" + _NUMBER + r")(?![\w])")  # a number not glued to a word or digit
_MINUS_OPERATOR = re.compile(r"[\d)\]]\s*$")  # "8-3", "(2)-3": the minus is an operator, not a sign
MAX_REPLY_CHARS = 100_000  # longer replies are read from their last MAX_REPLY_CHARS characters


def to_number(text: str) -> Decimal | None:
    """`text` as a finite Decimal ("1,000" -> 1000, "+7" -> 7, "7.0" -> 7.0), or None."""
    try:
        value = Decimal(text.replace(",", "").replace(" ", ""))
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None


def strict_answer(reply: str) -> Decimal | None:
    """The number in the reply's last `\\boxed{}` when the box holds a plain number and nothing else."""
    if not isinstance(reply, str):
        return None
    content = last_boxed(reply[-MAX_REPLY_CHARS:])
    match = _PLAIN.fullmatch(content) if content is not None else None
    return to_number(match.group(1)) if match else None


def lenient_answer(reply: str) -> Decimal | None:
    """The last number written in the reply (with its sign when the `-` is a sign), or None."""
    if not isinstance(reply, str):
        return None
    text = reply[-MAX_REPLY_CHARS:]
    last = None
    for last in _LAST.finditer(text):  # noqa: B007 (only the last match is used)
        pass
    if last is None:
        return None
    sign, digits = last.group(1), last.group(2)
    if sign and _MINUS_OPERATOR.search(text, 0, last.start()):
        sign = ""
    return to_number(sign + digits)


def _gold(fields: Any) -> Decimal | None:
    answer = fields.get("answer") if isinstance(fields, dict) else None
    return to_number(answer.strip()) if isinstance(answer, str) else None


def _same(value: Decimal | None, gold: Decimal | None) -> float:
    return 1.0 if value is not None and gold is not None and value == gold else 0.0


def strict(prompt: str, completion: str, fields: dict[str, Any]) -> float:
    """1.0 when the reply's last `\\boxed{}` holds exactly the gold number, else 0.0 (never raises)."""
    try:
        return _same(strict_answer(completion), _gold(fields))
    except Exception:  # a reward function must not crash a sampler
        return 0.0


def lenient(prompt: str, completion: str, fields: dict[str, Any]) -> float:
    """1.0 when the last number of the reply equals the gold number, else 0.0 (never raises)."""
    try:
        return _same(lenient_answer(completion), _gold(fields))
    except Exception:  # a reward function must not crash a sampler
        return 0.0
