"""Strict and lenient scores of replies to numeric questions (exgrpo/verify/number_scores.py), on hand-written
replies: well-formed, wrong, unparsable (0, never a crash)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from exgrpo.verify.number_scores import lenient, lenient_answer, strict, strict_answer

GOLD = {"answer": "7"}


@pytest.mark.parametrize(
    ("reply", "want_strict", "want_lenient"),
    [
        ("3 + 4 = 7, so the answer is \\boxed{7}.", 1.0, 1.0),
        ("\\boxed{7}", 1.0, 1.0),
        ("The answer is \\boxed{ 7 }", 1.0, 1.0),
        ("\\boxed{$7$}", 1.0, 1.0),
        ("\\boxed{7.0}", 1.0, 1.0),
        ("\\boxed{+7}", 1.0, 1.0),
        ("3 + 4 = 7.", 0.0, 1.0),  # right number, not in the requested format
        ("The answer is 7", 0.0, 1.0),
        ("\\boxed{7} ... wait, 3 + 4 = 8", 1.0, 0.0),  # the box holds 7; the last number written is 8
        ("\\boxed{8}", 0.0, 0.0),
        ("\\boxed{7 apples}", 0.0, 1.0),  # strict: only a number in the box
        ("\\boxed{3+4}", 0.0, 0.0),  # no evaluation of model text; the last number written is 4
        ("\\boxed{17}", 0.0, 0.0),  # no partial credit for the gold inside a longer number
        ("\\boxed{7} and then \\boxed{9}", 0.0, 0.0),
        ("", 0.0, 0.0),
        ("I do not know.", 0.0, 0.0),
        ("\\boxed{", 0.0, 0.0),
        ("\\boxed{}", 0.0, 0.0),
        ("7th place", 0.0, 0.0),  # a number glued to a word is not a number
    ],
)
def test_scores_on_hand_written_replies(reply: str, want_strict: float, want_lenient: float) -> None:
    assert strict("q", reply, GOLD) == want_strict
    assert lenient("q", reply, GOLD) == want_lenient


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("5 - -4 = 9", Decimal(9)),
        ("so 5 - 9 = -4", Decimal(-4)),
        ("The answer is -4.", Decimal(-4)),
        ("8-3", Decimal(3)),  # the minus of a subtraction is no sign
        ("(2)-3", Decimal(3)),
        ("It costs 1,000 dollars", Decimal(1000)),
        ("x = 2.5", Decimal("2.5")),
        ("no digits here", None),
    ],
)
def test_lenient_reads_the_last_number_with_its_sign(reply: str, value: Decimal | None) -> None:
    assert lenient_answer(reply) == value


def test_negative_and_grouped_golds() -> None:
    assert strict("q", "\\boxed{-4}", {"answer": "-4"}) == 1.0
    assert lenient("q", "5 - 9 = -4", {"answer": "-4"}) == 1.0
    assert lenient("q", "5 - 9 = 4", {"answer": "-4"}) == 0.0
    assert strict("q", "\\boxed{1,000}", {"answer": "1000"}) == 1.0
    assert strict_answer("\\boxed{1,00}") is None


@pytest.mark.parametrize(
    ("completion", "fields"),
    [
        (None, GOLD),
        (7, GOLD),
        ("\\boxed{7}", {}),
        ("\\boxed{7}", {"answer": None}),
        ("\\boxed{7}", {"answer": "seven"}),
        ("\\boxed{7}", {"answer": "inf"}),
        ("\\boxed{nan}", {"answer": "nan"}),
        ("\\boxed{7}", None),
        ("9" * 50_000 + "\\boxed{" * 1000, GOLD),
    ],
)
def test_anything_unreadable_scores_zero_without_raising(completion: object, fields: object) -> None:
    assert strict("q", completion, fields) == 0.0  # type: ignore[arg-type]
    assert lenient("q", completion, fields) == 0.0  # type: ignore[arg-type]


def test_usable_as_a_reward_fn_spec() -> None:
    from exgrpo.verify.plugin import resolve

    for name in ("strict", "lenient"):
        fn = resolve(f"exgrpo.verify.number_scores:{name}").fn
        assert fn("What is 3 + 4?", "3 + 4 = \\boxed{7}", {"answer": "7"}) == 1.0
