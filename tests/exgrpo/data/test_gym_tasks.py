"""The reasoning-gym builtin task (exgrpo/data/gym_tasks.py): registered, seeded, and a held-out split that
shares no question with training."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from exgrpo.data.gym_tasks import GymTask, in_eval_part  # noqa: E402
from exgrpo.data.sources import read_source  # noqa: E402
from exgrpo.data.tasks import BUILTIN_TASKS, builtin_task  # noqa: E402
from exgrpo.verify.number_scores import strict  # noqa: E402


def test_registered_as_a_builtin_source() -> None:
    assert "sum-1digit" in BUILTIN_TASKS
    task = builtin_task("builtin:sum-1digit", seed=3)
    assert isinstance(task, GymTask) and task.seed == 3
    data = read_source("builtin:sum-1digit", split="train", num=5, seed=0)
    assert data.name == "sum-1digit" and len(data.prompts) == 5
    first = data.prompts[0]
    assert first.qid == "sum-1digit-train-00000" and first.data_source == "sum-1digit"
    assert first.question.startswith("State the final answer to the following arithmetic problem:")


def test_held_out_split_shares_no_question_with_training() -> None:
    task = GymTask()
    evaluation = task.make_split(split="eval", n=20, seed=0)
    eval_questions = {p.question for p in evaluation}
    assert all(in_eval_part(p.fields["expression"]) for p in evaluation)
    for seed in range(3):
        train = task.make_split(split="train", n=150, seed=seed)
        assert not eval_questions & {p.question for p in train}
        assert not any(in_eval_part(p.fields["expression"]) for p in train)
    assert len(eval_questions) == 20  # unique within a split


def test_seeded_and_prefix_stable() -> None:
    task = GymTask()
    a = task.make_split(split="train", n=30, seed=1)
    assert a == task.make_split(split="train", n=30, seed=1)
    assert task.make_split(split="train", n=10, seed=1) == a[:10]
    assert [p.question for p in a] != [p.question for p in task.make_split(split="train", n=30, seed=2)]


def test_answers_are_right_and_the_reference_solution_scores() -> None:
    task = GymTask()
    for p in task.make_split(split="train", n=40, seed=0):
        left, op, right = p.fields["expression"].split()
        assert int(p.answer) == (int(left) + int(right) if op == "+" else int(left) - int(right))
        assert strict(p.question, task.solution_text(p), {"answer": p.answer}) == 1.0
        assert task.difficulty(p) == 0
    first = task.make_split(split="train", n=1, seed=0)[0]  # "0 - 4": the cold start's worked solution
    assert (
        task.solution_text(first)
        == f"{first.fields['expression']} = {first.answer}.\nThe answer is \\boxed{{{first.answer}}}."
    )


def test_asking_for_more_questions_than_the_space_holds_fails_clearly() -> None:
    with pytest.raises(RuntimeError, match="has only .* distinct eval questions"):
        GymTask().make_split(split="eval", n=100, seed=0)
    with pytest.raises(ValueError, match="split="):
        GymTask().make_split(split="test", n=1)  # type: ignore[arg-type]


def test_the_mixed_sums_hold_hundreds_of_held_out_questions_over_three_grades() -> None:
    """builtin:sum-mixed (2-3 terms of 1-2 digits): a held-out split of >= 200 questions disjoint from a large
    train split, every grade of difficulty in both."""
    task = builtin_task("builtin:sum-mixed")
    held_out = read_source("builtin:sum-mixed", split="eval", num=240, seed=0).prompts
    train = read_source("builtin:sum-mixed", split="train", num=2000, seed=0).prompts
    assert len({p.question for p in held_out}) == 240 and len({p.question for p in train}) == 2000
    assert not {p.question for p in held_out} & {p.question for p in train}
    for split in (held_out, train):
        assert {task.difficulty(p) for p in split} == {0, 1, 2}
    assert held_out[0].qid == "sum-mixed-eval-00000" and held_out[0].data_source == "sum-mixed"
