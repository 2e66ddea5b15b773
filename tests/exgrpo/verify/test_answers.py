"""Pure rule tests of exgrpo.verify.answers (no sympy, no workers): final boxes, digit-group separators,
redundant parentheses, the equation rule, approximations, gold cleaning, the answer region.
Every expectation is derived by hand from the rules in the module docstring and docs/rewards.md."""

from __future__ import annotations

import time

import pytest

from exgrpo.verify import answers
from exgrpo.verify.answers import (
    answer_region,
    clean_gold,
    equation_values,
    final_answer,
    final_boxes,
    has_relation,
    normalize,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{1} and \boxed{2} and \boxed{3}", ["1", "2", "3"]),  # `and` within 70 characters
        (r"\boxed{1}\boxed{2}", ["1", "2"]),  # adjacent
        (r"\boxed{1}, \boxed{2}; \boxed{3}", ["1", "2", "3"]),
        (r"\boxed{1} or \boxed{2}", ["1", "2"]),
        (r"\boxed{4} no wait \boxed{5}", ["4", "5"]),  # fewer than 10 characters between: one answer
        (r"\boxed{4}. Wait. I made an error in step two. \boxed{5}", ["5"]),  # 37 apart, no separator
        (r"\boxed{7} and so on, as shown; \boxed{7}", ["7"]),  # identical contents count once
        (r"\boxed{7}\boxed{7}\boxed{8}", ["7", "8"]),
        (r"\boxed{1} and " + "x" * 70 + r" \boxed{2}", ["2"]),  # a separator, but 70+ characters apart
        (r"\boxed{\boxed{3}}", [r"\boxed{3}"]),  # a box inside a box is part of its content
        (r"\boxed{2} and \boxed{}", []),  # the last box is empty: no answer
        (r"\boxed{} and \boxed{2}", ["2"]),  # an empty earlier box ends the run
        ("no box at all", []),
    ],
)
def test_final_boxes(text, expected):
    assert final_boxes(text) == expected


def test_final_answer_joins_boxes_with_commas():
    assert final_answer(r"so \boxed{(1, 2)}, \boxed{(2, 1)}") == "(1, 2),(2, 1)"
    assert final_answer("none") is None
    assert final_answer(r"<think>\boxed{3}</think> then \boxed{4}", mode="think") == "4"
    assert answers.extract_answer(r"\boxed{1} and \boxed{2}") == "2"  # the last box alone, for the data code


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("1 000", "1000"),  # a space between digit groups
        (r"1\,000", "1000"),  # thin space
        (r"1\ 000\ 000", "1000000"),
        ("1~000", "1000"),
        (r"12\!345", "12345"),
        ("1,000", "1,000"),  # commas are left to math-verify (1000, or the list 1000, 99)
        ("1000,99", "1000,99"),
        ("10 00", "10 00"),  # not groups of three: left alone
        ("1 0000", "1 0000"),
        ("0.1 234", "0.1 234"),  # decimals are not grouped
        ("x 000", "x 000"),
        ("2 and 100", "2 and 100"),
        (r"\left((1 000)\right)", "(1000)"),  # \left \right dropped, then the redundant pair
        ("((x))", "(x)"),
        ("(((x+1)))", "(x+1)"),
        ("(a)(b)", "(a)(b)"),  # not nested: both kept
        ("((a)(b))", "((a)(b))"),  # the outer pair holds two groups: kept
        (r"\(x\)", r"\(x\)"),  # escaped parentheses are not grouping
    ],
)
def test_normalize(answer, expected):
    assert normalize(answer) == expected


def test_normalize_450_nested_parentheses_is_cheap():
    start = time.monotonic()
    assert normalize("(" * 450 + "42" + ")" * 450) == "(42)"
    assert normalize("(" * 100_000 + "1" + ")" * 100_000) == "(1)"
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("42", "42", ["42"]),  # no relation: the answer itself
        ("x = 42", "42", ["42"]),
        (r"x \in [1, 2]", "[1,2]", ["[1, 2]"]),
        ("f(x) = x^2", "x^2", ["x^2"]),
        (r"\angle ABC = 30", "30", ["30"]),
        (r"a_1 = 5", "5", ["5"]),
        (r"\alpha = \pi", r"\pi", [r"\pi"]),
        (r"\text{area} = 12", "12", ["12"]),
        ("x = 2+2 = 4", "4", ["2+2", "4"]),  # a chain: every value must be right
        ("x = 1, y = 2", "1,2", ["1, 2"]),  # one value per item
        (r"x = -2,\ q = \frac{7}{3}", "-2,7/3", [r"-2, \frac{7}{3}"]),  # LaTeX spacing around items
        (r"x = \frac13 \approx 0.33", "1/3", [r"\frac13"]),  # the approximation is dropped
        ("43 = 42", "42", None),  # no variable on the left
        ("0 = 42", "42", None),
        ("1+1 = 42", "42", None),
        (r"x \approx 42", "42", None),  # an approximation is not the value
        ("x < 42", "42", None),  # an inequality is not a value
        ("x = 42 < 43", "42", None),
        ("x =", "42", None),
        ("x = 1 = 2, y = 3", "1,3", None),  # chains only in a one-item answer
        ("2x = 8", "4", None),  # `2x` is not a bare name
        ("x = 5", "x = 5", ["x = 5"]),  # the gold states a relation: math-verify compares relations
        ("y > 3", "y > 3", ["y > 3"]),
        ("(x = 1)", "1", ["(x = 1)"]),  # inside brackets: not at the top level
    ],
)
def test_equation_rule(answer, gold, expected):
    assert equation_values(answer, gold) == expected


def test_has_relation():
    assert has_relation("x = 1") and has_relation(r"x \approx 1") and has_relation(r"a \leq b")
    assert not has_relation("f(x=1)") and not has_relation(r"\{x = 1\}") and not has_relation("12")


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        (" 42 ", "42"),
        ("$42$", "42"),
        ("$$ 42 $$", "42"),
        (r"\boxed{42}", "42"),
        (r"$\boxed{42}$", "42"),
        (r"\boxed{1}\boxed{2}", "1,2"),  # both boxes, not the last one
        (r"\boxed{1} and \boxed{2}", "1,2"),
        (r"The answer is \boxed{12}.", "12"),
        (r"\boxed{}", r"\boxed{}"),  # nothing to read: kept (it matches nothing)
        ("1 000", "1000"),
        ("((3))", "(3)"),
        (r"\left(1, 2\right)", "(1, 2)"),
    ],
)
def test_clean_gold(gold, expected):
    assert clean_gold(gold) == expected


def test_answer_region():
    assert answer_region("all of it") == "all of it"
    assert answer_region("<think>a</think> b", "think") == " b"
    assert answer_region("<think>a</think> b </think> c", "think") == " b </think> c"  # the first close
    assert answer_region("a</think> b", "think") is None  # no <think> before it
    assert answer_region("<think>never closed", "think") is None
    with pytest.raises(ValueError, match="mode"):
        answer_region("x", "plain")  # type: ignore[arg-type]
