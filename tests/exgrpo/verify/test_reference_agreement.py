"""Agreement of `exgrpo.verify.verifier.score` with what math-verify's own public tests establish as "equal".

The cases are written here (not copied): each restates, with other numbers and wording, a rule that a
math-verify test case (tests/test_all.py, test_numina_cases.py, test_boxed.py, test_strict.py,
test_string_extraction.py, test_yujianll.py of huggingface/Math-Verify) establishes, as a row
(response, gold, expected), expected being math-verify's verdict under that rule. The answer
is usually boxed, as our responses are; a few state it in text. Our score must agree on at least
`MIN_AGREEMENT` of the rows, and the rows where it does not are exactly `DELIBERATE`, each for a
stated reason (docs/rewards.md).
"""

from __future__ import annotations

import pytest

from exgrpo.verify.verifier import Verifier

MIN_AGREEMENT = 0.97

CASES = [
    # numbers: signs, thousands separators, decimal forms, units, currency, percent
    (r"\boxed{-7}", "-7", 1),
    (r"\boxed{3,125,000}", "3125000", 1),
    (r"\boxed{2 000}", "2000", 1),
    (r"\boxed{2000.0}", "2000", 1),
    (r"\boxed{2,000.5}", "2000.5", 1),
    (r"\boxed{.25}", "0.25", 1),
    (r"\boxed{\$2,500.75}", "2500.75", 1),
    (r"\boxed{12.5\text{ m}^2}", "12.5", 1),
    (r"\boxed{40\%}", r"40\%", 1),
    (r"\boxed{40}", r"40\%", 1),
    ("So the price is 3,450.25 dollars.", "3450.25", 1),
    (r"\boxed{B7Q3}", "3", 0),
    (r"\boxed{45{,}318}", "45318", 1),
    (r"\boxed{7,\!204,\!001}", "7204001", 1),
    (r"\boxed{45, 318}", "45318", 0),  # a comma and a space: two numbers
    # fractions and LaTeX notation
    (r"\boxed{\frac{11}{4}}", "11/4", 1),
    (r"\boxed{-\frac{11}{4}}", "-11/4", 1),
    (r"\boxed{\frac25}", "2/5", 1),
    (r"\boxed{\frac4{4}}", "1", 1),
    (r"\boxed{\sqrt5}", r"\sqrt{5}", 1),
    (r"\boxed{\cfrac{2}{7}}", "2/7", 1),
    (r"\boxed{\tfrac{2}{7}}", "2/7", 1),
    (r"\boxed{\left( \frac{2}{7} \right)}", "2/7", 1),
    (r"\boxed{\frac{2}{7} \text{inches}}", "2/7", 1),
    (r"\boxed{\frac{2}{7} \textbf{inches}}", "2/7", 1),
    (r"\boxed{(6+2)}", "8", 1),
    (r"\boxed{125\textnormal{ km}}", "125", 1),
    (r"\boxed{\sqrt 3+\sqrt 7}", r"\sqrt{3}+\sqrt{7}", 1),
    (r"\boxed{\frac53\pi}", r"\frac{5}{3}\pi", 1),
    (r"\boxed{45^\circ}", r"45^\circ", 1),
    (r"\boxed{4\sqrt{11}}", r"\sqrt{176}", 1),
    (r"\boxed{312_6}", "312_6", 1),
    # sets, intervals, tuples
    (r"\boxed{[2,5)}", "[2,5)", 1),
    (r"\boxed{[2,5)}", "[2,8)", 0),
    (r"\boxed{[2,5)}", "(2,5)", 0),
    (r"\boxed{-[0,3)}", "3", 0),
    (r"\boxed{\{3,1\}}", r"\{1,3\}", 1),
    (r"\boxed{{2,5}}", "(2,5)", 1),
    (r"\boxed{{2,5}}", "(5,2)", 0),
    (r"\boxed{[-2, -\tfrac13) \cup (-\tfrac13, 4]}", r"[-2, -\frac{1}{3}) \cup (-\frac{1}{3}, 4]", 1),
    (r"\boxed{(1,\frac{7}{2})}", "(1,3.5)", 1),
    (r"\boxed{\left( 5, \frac{\pi}{3} \right)}", r"(5, \frac{\pi}{3})", 1),
    (r"\boxed{-3,4}", "-3,4", 1),
    (r"\boxed{4,-3}", "-3,4", 1),
    (r"\boxed{(4, 1), (2, 3)}", "(2,3),(4,1)", 1),
    (r"\boxed{(4, 1), (2, 3)}", "(2,3),(4,2)", 0),
    (r"\boxed{\{2\pm\sqrt{3},-5\}}", r"\{-5, 2\pm\sqrt{3}\}", 1),
    (r"\boxed{-17, 17}", r"\pm 17", 1),
    (r"\boxed{17}", r"\pm 17", 0),
    # relations (the gold states one: math-verify compares relations)
    (r"\boxed{y \geq 3}", "y >= 3", 1),
    (r"\boxed{y \lt 8}", "y < 8", 1),
    (r"\boxed{y <= 4}", r"y \leq 4", 1),
    (r"\boxed{y \neq 6}", "y != 6", 1),
    (r"\boxed{y < 3}", "y > 3", 0),
    (r"\boxed{y \leq 3}", r"y \geq 3", 0),
    (r"\boxed{3 \geq y}", r"y \leq 3", 1),
    (r"\boxed{-y > -2}", "y < 2", 1),
    (r"\boxed{y > -2}", "y < 2", 0),
    (r"\boxed{y = 2+3 = 4 = 9}", "y = 9", 1),
    (r"\boxed{3b+d}", "5 = 3b+d", 0),
    (r"\boxed{4}", "3x + w = 4", 0),
    (r"\boxed{y=-\frac{1}{3}x+2}", "x+3y-6=0", 1),
    (r"\boxed{x^2/18 + y^2/8 = 1/2}", "x^2/9 + y^2/4 = 1", 1),
    (r"\boxed{x \in [-3,5]}", r"-3 \le x \le 5", 1),
    # equations in the answer, gold a plain value
    (r"\boxed{x = 9}", "9", 1),
    (r"\boxed{m=4}", "4", 1),
    (r"\boxed{n=1/5\approx0.2}", "1/5", 1),
    (r"\boxed{x\approx 9}", "9", 1),
    # matrices
    (r"\boxed{\begin{pmatrix}2 & 0 \\ 0 & 2\end{pmatrix}}", r"\begin{pmatrix}2 & 0 \\ 0 & 2\end{pmatrix}", 1),
    (r"\boxed{\begin{pmatrix}1 & 1 \\ 1 & 1\end{pmatrix}}", r"\begin{bmatrix}1 & 1 \\ 1 & 1\end{bmatrix}", 1),
    (r"\boxed{\begin{pmatrix}5 & 6 \\ 7 & 9\end{pmatrix}}", r"\begin{pmatrix}5 & 6 \\ 7 & 8\end{pmatrix}", 0),
    (
        r"\boxed{\begin{pmatrix}0.5 \\ 0.25\end{pmatrix}}",
        r"\begin{pmatrix}\frac12 \\ \frac14\end{pmatrix}",
        1,
    ),
    # algebra and precision
    (r"\boxed{0.1666666666666}", r"\frac{1}{6}", 1),
    (r"\boxed{\frac{y}{5}+\frac{3}{5}}", r"\frac{y+3}{5}", 1),
    (r"\boxed{\sec^2(t)}", r"\tan^2(t)+1", 1),
    (r"\boxed{(+3)(c+1)}", "(a+3)(c+1)", 0),
    (r"\boxed{\frac{1+\sqrt{3}}{2}}", "3", 0),
    (r"\boxed{y+1}", "y+3m+1", 0),
    (r"\boxed{2\sqrt{3}}", "2", 0),
    (r"\boxed{\frac{\sqrt{2}}{3+\sqrt{5}}}", r"\frac{\sqrt{2}}{\sqrt{5}+3}", 1),
    (r"\boxed{6x+8y-4z+10=0}", "-6x-8y+4z-10=0", 1),
    # text answers
    (r"\boxed{\text{Maria}}", r"\text{Maria}", 1),
    (r"\boxed{\text{(D)}}", r"\text{D}", 1),
    (r"\boxed{D}", r"\text{D}", 1),
    (r"\boxed{\text{B}}", "c", 0),
    (r"\boxed{even}", r"\text{even}", 1),
    (r"\boxed{f(t)}", "f(s)", 0),
    # where the answer is: boxes, several boxes, no box
    (r"so $x-q=\boxed{3-3q}$.", "3-3q", 1),
    (r"\boxed{5} is it. On reflection, after checking every case again: \boxed{5}", "5", 1),
    ("so \\boxed{612}. Let me double check the sum once more.\n\n**Final Answer**\n\\boxed{612}", "612", 1),
    (r"\boxed{3}, \boxed{4}", "3,4", 1),
    (r"\boxed{3}\boxed{4}", "3,4", 1),
    (r"\boxed{(2, 5)}, \boxed{(5, 2)}, \boxed{(-3, -10)}", "(5,2),(2,5),(-3,-10)", 1),
    (r"\(\boxed{2}\) and \(\boxed{-7}\).", "-7,2", 1),
    (r"\boxed{3,4}", r"\boxed{3}\boxed{4}", 1),
    (r"\boxed{-7,2}", r"\boxed{2} and \boxed{-7}", 1),
    (r"\boxed{4 \text{ and } 9}", "4,9", 1),
    (r"\boxed{x = -2,\ q = \frac{7}{3}}", r"-2, \frac{7}{3}", 1),
    ("Final Answer: The smallest k is 27.", "27", 1),
    ("Therefore, the final answer is $\\frac{3}{8}$. I hope it is correct.", "3/8", 1),
    ("The answer is 61.", "62", 0),
    # chains in the answer
    (r"\boxed{k = 2 + 2 = 4}", "4", 1),
    (r"\boxed{z = 5 + 6 = 12}", "12", 1),
]

# Rows where our score deliberately differs from math-verify's verdict, with the reason.
DELIBERATE = {
    (r"\boxed{x\approx 9}", "9"): "equation rule: an approximation is not the value; math-verify reads "
    "the right side of the last relation, so `x \\approx 42` (and `43 = 42`) would earn the reward",
    (r"\boxed{z = 5 + 6 = 12}", "12"): "equation rule: every value of a chain must be right; math-verify "
    "reads only the last one, so a false intermediate equality (5 + 6 = 12) would earn the reward",
}


@pytest.fixture(scope="module")
def verdicts() -> list[float]:
    with Verifier(workers=2, timeout_s=10.0) as verifier:
        return verifier.score_many([r for r, _, _ in CASES], [g for _, g, _ in CASES])


def test_cases_are_distinct():
    assert len({(r, g) for r, g, _ in CASES}) == len(CASES)
    assert set(DELIBERATE) <= {(r, g) for r, g, _ in CASES}


def test_agreement_with_math_verify(verdicts):
    disagreements = {
        (r, g) for (r, g, expected), ours in zip(CASES, verdicts, strict=True) if ours != expected
    }
    agreement = 1 - len(disagreements) / len(CASES)
    print(f"agreement with math-verify's cases: {len(CASES) - len(disagreements)}/{len(CASES)}")
    assert disagreements == set(DELIBERATE), sorted(disagreements ^ set(DELIBERATE))
    assert agreement >= MIN_AGREEMENT
