"""The builtin arithmetic task: determinism, held-out split, difficulty spread, reference answers."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from exgrpo.core.records import Prompt
from exgrpo.data.tasks import ArithTask, boxed, builtin_task, in_eval_part
from exgrpo.verify.answers import last_boxed


def _prompt(question: str, answer: str = "") -> Prompt:
    return Prompt(qid="t", question=question, answer=answer, data_source="arith")


def test_make_split_is_deterministic_per_seed() -> None:
    task = ArithTask()
    a = task.make_split(split="train", n=300, seed=5)
    assert a == ArithTask().make_split(split="train", n=300, seed=5)
    assert a[:100] == task.make_split(split="train", n=100, seed=5)  # prefix-stable
    b = task.make_split(split="train", n=300, seed=6)
    assert [p.question for p in a] != [p.question for p in b]
    # seed=None uses the task's own seed
    assert ArithTask(seed=5).make_split(split="train", n=50) == a[:50]


def test_qids_answers_and_lengths() -> None:
    prompts = ArithTask().make_split(split="eval", n=2000, seed=0)
    assert [p.qid for p in prompts[:3]] == ["arith-eval-00000", "arith-eval-00001", "arith-eval-00002"]
    assert len({p.qid for p in prompts}) == 2000
    assert len({p.question for p in prompts}) == 2000  # questions are unique within a split
    for p in prompts:
        assert re.fullmatch(r"\d{1,3}([+-]\d{1,3}){1,2}", p.question), p.question
        assert len(p.question) < 24
        # an independent evaluation: walk the signed terms
        terms = [int(t) for t in re.findall(r"[+-]?\d+", p.question)]
        running = 0
        for t in terms:
            running += t
            assert running >= 0  # never negative along the way
        assert p.answer == str(running)
        assert p.data_source == "arith"


def test_eval_and_train_are_disjoint_on_20k() -> None:
    task = ArithTask()
    train = task.make_split(split="train", n=20_000, seed=0)
    evals = task.make_split(split="eval", n=20_000, seed=0)
    other_train = task.make_split(split="train", n=5_000, seed=1)
    train_q = {p.question for p in train} | {p.question for p in other_train}
    eval_q = {p.question for p in evals}
    assert len(eval_q) == 20_000
    assert train_q.isdisjoint(eval_q)
    # by construction: membership is a property of the text alone
    assert all(in_eval_part(q) for q in eval_q)
    assert not any(in_eval_part(q) for q in train_q)


def test_eval_part_is_about_an_eighth_of_the_space() -> None:
    # every 2-operand question on 0..99: 10000 sums + 5050 non-negative differences = 15050
    space = [f"{a}{op}{b}" for a in range(100) for b in range(100) for op in "+-" if op == "+" or a >= b]
    share = sum(in_eval_part(q) for q in space) / len(space)
    assert 0.11 < share < 0.14  # 1/8 = 0.125


def test_difficulty_hand_examples() -> None:
    task = ArithTask()
    assert task.difficulty(_prompt("5+3")) == 0  # no carry, 1 digit, 2 operands
    assert task.difficulty(_prompt("9-3")) == 0
    assert task.difficulty(_prompt("58+67")) == 3  # 8+7 carries, 5+6+1 carries; + (2 - 1) digits
    assert task.difficulty(_prompt("50-7")) == 2  # 0-7 borrows; + 1 for two digits
    assert task.difficulty(_prompt("100-1")) == 4  # borrows in units and tens (2); + (3 - 1) digits
    # 347+85 = 432: carries in units (7+5) and tens (4+8+1) -> 2; 432-19: borrow in units -> 1;
    # + (3 - 1) digits + (3 - 2) extra operand = 6
    assert task.difficulty(_prompt("347+85-19")) == 6


def test_difficulty_varies() -> None:
    task = ArithTask()
    prompts = task.make_split(split="train", n=2000, seed=0)
    counts = Counter(task.difficulty(p) for p in prompts)
    assert len(counts) >= 7
    assert counts[0] + counts[1] >= 40  # some easy questions
    assert sum(v for k, v in counts.items() if k >= 5) >= 100  # and some hard ones
    assert max(counts.values()) < 0.4 * len(prompts)  # no single level dominates
    ops = Counter(p.question.count("+") + p.question.count("-") + 1 for p in prompts)
    assert ops[2] > 1000 and ops[3] > 300


def test_solution_text_is_a_correct_boxed_answer() -> None:
    task = ArithTask()
    assert task.solution_text(_prompt("347+85-19", "413")) == "\\boxed{413}"
    assert boxed(7) == "\\boxed{7}"
    for p in task.make_split(split="train", n=500, seed=3):
        text = task.solution_text(p)
        assert text == boxed(p.answer) and last_boxed(text) == p.answer
    with pytest.raises(ValueError, match="gold answer '5'"):
        task.solution_text(_prompt("2+2", "5"))
    with pytest.raises(ValueError, match="not an arith question"):
        task.difficulty(_prompt("2*2", "4"))


def test_solution_text_scores_under_rewards() -> None:
    rewards = pytest.importorskip(
        "exgrpo.verify.verifier", reason="exgrpo.verify.verifier is not written yet"
    )
    task = ArithTask()
    for p in task.make_split(split="eval", n=50, seed=0):
        assert rewards.score(task.solution_text(p), p.answer) == 1.0
        assert rewards.score(boxed(int(p.answer) + 1), p.answer) == 0.0  # off by one scores 0


def test_builtin_task_registry() -> None:
    assert isinstance(builtin_task("arith"), ArithTask)
    assert builtin_task("builtin:arith", seed=4).seed == 4
    with pytest.raises(ValueError, match="unknown builtin task 'gsm8k'; valid names: arith"):
        builtin_task("gsm8k")
    with pytest.raises(ValueError, match="split="):
        ArithTask().make_split(split="test", n=1, seed=0)  # type: ignore[arg-type]
