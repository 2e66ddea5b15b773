"""Tests of exgrpo.verify.verifier and exgrpo.verify.pool: extraction, math-verify equivalence, hard timeouts,
parallel callers, safety, cleanup. Pure extraction rules: test_answers.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exgrpo.verify import answers
from exgrpo.verify import verifier as rewards
from exgrpo.verify.answers import extract_answer
from exgrpo.verify.verifier import Verifier

TIMEOUT_S = 1.0  # deadline of the verifier used for pathological inputs
MARGIN_S = 1.5  # kill + reap + scheduling noise on a loaded 2-core machine
POWER_TOWER = (
    r"\boxed{9^{9^{9^{9^{9}}}}}"  # against a gold that is a tower too: sympy computes and never returns
)
TOWER_GOLD = "9^{9^{9^{9^{8}}}}"


@pytest.fixture(scope="module")
def verifier():
    with Verifier(timeout_s=10.0, workers=2) as v:
        v.start()  # outside the timed tests
        yield v


@pytest.fixture(scope="module")
def strict_verifier():
    """Short deadline, no length limit: pathological answers reach a worker and must be killed."""
    with Verifier(timeout_s=TIMEOUT_S, workers=2, max_answer_chars=None) as v:
        v.start()
        yield v


def _timed(fn, *args):
    start = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - start


# ----------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"so \boxed{5}.", "5"),
        (r"first \boxed{4}, then \boxed{ 5 }", "5"),  # last box wins, stripped
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),  # nested braces
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not groups
        (r"\boxed{\boxed{3}}", r"\boxed{3}"),  # the outer box closes last
        (r"\boxed{3} and then \boxed{4", "3"),  # an unclosed final box is ignored
        (r"\boxed 7 is it", "7"),  # brace-less form
        (r"\boxed {8}", "8"),
        (r"\boxedx{9}", None),  # another command, not a box
        ("the answer is 5", None),
        (r"\boxed{}", None),
        (r"\boxed{ }", None),
        (r"\boxed{3} then \boxed{}", None),  # the last box is empty: no answer (no fallback to 3)
        (r"\boxed{x\}y}", r"x\}y"),  # an escaped brace neither closes nor opens
        (r"\boxed{a\{b}", r"a\{b"),
        (r"so \boxed 5", "5"),  # TeX's brace-less argument
        ("\\boxed 42.", "42"),  # up to the next space, `$` or brace, less sentence punctuation
        (r"\boxed 3.14, so", "3.14"),
        (r"$\boxed 5$", "5"),
        (r"\\boxed{5}", None),  # `\\` is a line break: the text "boxed{5}" follows, no box
    ],
)
def test_extract_boxed(response, expected):
    assert extract_answer(response) == expected
    assert rewards.last_boxed(response) == expected  # the one extractor, shared with the data cleaner


@pytest.mark.parametrize(
    ("gold", "clean"),
    [
        (r"\boxed 5", "5"),
        (r"$\boxed{x\}y}$", r"x\}y"),
        (rewards.boxed(r"\frac{1}{2}"), r"\frac{1}{2}"),
        (r"\boxed{}", r"\boxed{}"),
        (" 7 ", "7"),
    ],
)
def test_gold_is_unboxed_by_the_same_extractor(gold, clean):
    assert answers.clean_gold(gold) == clean


def test_extract_think_mode():
    response = r"<think>maybe \boxed{3}</think> so the answer is \boxed{5}"
    assert extract_answer(response, mode="think") == "5"
    assert extract_answer(r"<think>only \boxed{3}</think> no box after", mode="think") is None
    assert extract_answer(r"<think>never closed \boxed{3}", mode="think") is None
    assert extract_answer(r"no opening tag</think> \boxed{3}", mode="think") is None
    assert extract_answer(response, mode="boxed") == "5"
    with pytest.raises(ValueError, match="mode"):
        extract_answer("x", mode="plain")  # type: ignore[arg-type]


def test_extract_is_linear_on_huge_inputs():
    deep = r"\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}"
    boxes = r"\boxed{" * 100_000  # 100k unclosed boxes: no quadratic rescans
    megabyte = "lorem ipsum " * 90_000 + r"\boxed{42}"
    start = time.monotonic()
    assert extract_answer(deep) == "{" * 100_000 + "1" + "}" * 100_000
    assert extract_answer(boxes) is None
    assert extract_answer(megabyte) == "42"
    assert time.monotonic() - start < 2.0  # ~0.3 s here; quadratic would take minutes


# ---------------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # decimal vs fraction
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{\dfrac{1}{2}}", "1/2", 1.0),
        (r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$", 1.0),  # gold in $...$
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),  # \left( \right) = open interval
        (r"\boxed{[1, 2)}", "[1,2)", 1.0),
        (r"\boxed{[1,2]}", "[1,2)", 0.0),  # closed vs half-open
        (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),  # sets are unordered
        (r"\boxed{(2,1)}", "(1,2)", 0.0),  # but intervals/tuples are not
        (r"\boxed{\text{5}}", "5", 1.0),
        (r"\boxed{5\text{ cm}}", "5", 1.0),  # units are dropped
        (r"\boxed{5\%}", "5", 1.0),  # math-verify: an integer percentage matches the integer
        (r"\boxed{5\%}", "0.05", 1.0),  # ... and its value
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", 1.0),  # 1/sqrt2 = sqrt2/2
        (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),  # (x+1)^2 expands to x^2+2x+1
        (r"\boxed{x^2+2x}", "(x+1)^2", 0.0),
        (r"\boxed{x = 5}", "5", 1.0),
        (r"\boxed{6}", "5", 0.0),
        (r"\boxed{0.51}", r"\frac12", 0.0),
        (r"\boxed{hello}", "5", 0.0),
        ("The answer is 5.", "5", 1.0),  # no box: math-verify reads the stated answer
        ("The answer is 6.", "5", 0.0),
        (r"\boxed{4}. Wait. I made an error in step two. \boxed{5}", "5", 1.0),  # far apart: last box
        (r"\boxed{4} no wait \boxed{5}", "5", 0.0),  # < 10 characters apart: one answer, {4, 5}
        (r"\boxed{5}. Wait. I made an error in step two. \boxed{4}", "5", 0.0),
        (r"\boxed{007}", "7", 1.0),  # integer fast path
        (r"\boxed{-0}", "0", 1.0),
        (r"\boxed{-5}", "5", 0.0),
    ],
)
def test_equivalence(verifier, response, gold, expected):
    assert verifier.score(response, gold) == expected


def test_integer_fast_path_agrees_with_math_verify(verifier):
    responses = [r"\boxed{007}", r"\boxed{+5}", r"\boxed{-0}", r"\boxed{-5}", r"\boxed{12}", r"\boxed{13}"]
    golds = ["7", "5", "0", "5", "12", "31"]
    with Verifier(fast_path=False) as slow:
        assert slow.score_many(responses, golds) == verifier.score_many(responses, golds)
        assert slow.stats().fast == 0  # every item went through math-verify


def test_think_mode_scoring():
    response = r"<think>is it \boxed{3}?</think> The answer is \boxed{5}."
    with Verifier(mode="think") as v:
        assert v.score_many([response, response, r"<think>\boxed{5}"], ["5", "3", "5"]) == [1.0, 0.0, 0.0]


def test_module_level_functions():
    assert rewards.score(r"\boxed{\frac{2}{4}}", "0.5") == 1.0
    assert rewards.score_many([r"\boxed{2}", "none", r"\boxed{3}"], ["2", "2", "2"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="timeout_s"):
        rewards.score("x", "y", timeout_s=0)


def test_bad_inputs(verifier):
    assert verifier.score(None, "5") == 0.0  # type: ignore[arg-type]
    assert verifier.score("\udcff\x00 \\boxed{\udcff}", "5") == 0.0  # lone surrogate, NUL byte
    with pytest.raises(ValueError, match="pair up"):
        verifier.score_many(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="workers"):
        Verifier(workers=0)


# ------------------------------------------------------------------------- timeouts and safety


def test_power_tower_times_out(strict_verifier):
    reward, wall = _timed(strict_verifier.score, POWER_TOWER, TOWER_GOLD)
    assert reward == 0.0
    assert TIMEOUT_S * 0.9 < wall < TIMEOUT_S + MARGIN_S  # it did reach the deadline, no further


def test_deep_parentheses_cost_at_most_the_timeout(strict_verifier):
    answer = "(1+" * 100_000 + "1" + ")" * 100_000  # not redundant: normalize cannot drop them
    reward, wall = _timed(strict_verifier.score, rf"\boxed{{{answer}}}", "1")
    assert reward == 0.0
    assert wall < TIMEOUT_S + MARGIN_S
    # With the default length limit the same answer is refused without a worker.
    with Verifier(timeout_s=TIMEOUT_S) as limited:
        reward, wall = _timed(limited.score, rf"\boxed{{{answer}}}", "1")
        assert reward == 0.0 and wall < 0.5
        assert limited.stats() == rewards.VerifierStats(
            scored=1, fast=1, timeouts=0, failures={}, first_failures={}
        )


def test_megabyte_response(strict_verifier):
    junk = "Let me think step by step. " * 40_000  # ~1.1 MB
    reward, wall = _timed(strict_verifier.score, junk + r"\boxed{\frac{3}{6}}", "0.5")
    assert reward == 1.0 and wall < TIMEOUT_S + MARGIN_S
    reward, wall = _timed(strict_verifier.score, r"\boxed{" + junk + "}", "0.5")
    assert reward == 0.0 and wall < TIMEOUT_S + MARGIN_S


def test_code_in_the_answer_is_never_executed(verifier, tmp_path: Path):
    target = tmp_path / "pwned"
    attempts = [
        rf"\boxed{{__import__('os').system('touch {target}')}}",
        rf"\boxed{{1+__import__('os').system('touch {target}')}}",
        rf"\boxed{{exec(\"open('{target}', 'w')\")}}",
        rf"\boxed{{\text{{__import__('os').system('touch {target}')}}}}",
    ]
    assert verifier.score_many(attempts, ["0"] * len(attempts)) == [0.0] * len(attempts)
    assert not target.exists()


def test_timeout_works_outside_the_main_thread(strict_verifier):
    results: dict[str, float] = {}

    def run() -> None:
        results["tower"], results["wall"] = _timed(strict_verifier.score, POWER_TOWER, TOWER_GOLD)
        results["half"] = strict_verifier.score(r"\boxed{0.5}", r"\frac12")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert results["tower"] == 0.0 and results["wall"] < TIMEOUT_S + MARGIN_S
    assert results["half"] == 1.0


def test_score_many_with_one_pathological_item(strict_verifier):
    timeouts_before = strict_verifier.stats().timeouts
    responses = [r"\boxed{0.5}", POWER_TOWER, r"\boxed{7}", r"\boxed{x^2+2x+1}", "no box", r"\boxed{2}"]
    golds = [r"\frac{1}{2}", TOWER_GOLD, "8", "(x+1)^2", "1", "2"]
    rewards_, wall = _timed(strict_verifier.score_many, responses, golds)
    assert rewards_ == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert wall < TIMEOUT_S + MARGIN_S  # the others finish on the second worker meanwhile
    assert strict_verifier.stats().timeouts == timeouts_before + 1


def test_pathological_calls_do_not_delay_an_easy_one_from_another_thread():
    """Three threads at once, two answers that only the deadline ends and one easy answer: the easy
    one runs on the third worker at once (a serialising verifier would return it after 10 s)."""
    results: dict[str, tuple[float, float]] = {}
    with Verifier(timeout_s=5.0, workers=3, max_answer_chars=None) as v:
        v.start()

        def run(key: str, response: str, gold: str) -> None:
            with contextlib.suppress(RuntimeError):  # closed under the towers: the test does not wait
                results[key] = _timed(v.score, response, gold)

        threads = [
            threading.Thread(target=run, args=(f"tower{i}", POWER_TOWER, TOWER_GOLD)) for i in range(2)
        ]
        threads.append(threading.Thread(target=run, args=("easy", r"\boxed{\frac{1}{2}}", "0.5")))
        for t in threads:
            t.start()
            time.sleep(0.05)  # the towers are dispatched first
        threads[2].join(timeout=30)
        assert not any(key.startswith("tower") for key in results)  # still running: they did not block
        v.close()
    for t in threads:
        t.join(timeout=30)
    reward, wall = results["easy"]
    assert reward == 1.0
    assert wall < 1.5  # well under the 5 s timeout of the items ahead of it


# ------------------------------------------------------------------------------------- cleanup


def _verify_children() -> list[int]:
    """Live or zombie children of this process that run the verification worker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"exgrpo.verify.worker" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_close_reaps_every_worker():
    before = set(_verify_children())
    v = Verifier(timeout_s=TIMEOUT_S, workers=2)
    assert v.score_many([POWER_TOWER, r"\boxed{1}"], [TOWER_GOLD, "2"]) == [0.0, 0.0]  # one kill + restart
    # 2 workers and (once started in the background, which can lag on a loaded machine) the spare
    assert len(set(_verify_children()) - before) >= 2
    v.close()
    assert set(_verify_children()) - before == set()  # none left, not even as zombies
    with pytest.raises(RuntimeError, match="closed"):
        v.score(r"\boxed{0.5}", "1/2")


def test_workers_exit_with_the_interpreter():
    code = (
        "from exgrpo.verify import verifier as rewards\n"
        "assert rewards.score(r'\\boxed{0.25}', r'\\frac14') == 1.0\n"
        "print(*[w.process.pid for w in rewards._shared_pool()._workers])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
