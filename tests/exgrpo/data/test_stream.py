import pytest

from exgrpo.core.records import Prompt
from exgrpo.data.stream import OutOfQuestions, PromptStream


def _prompts(n):
    return [Prompt(qid=f"q{i}", question=f"{i}+0", answer=str(i)) for i in range(n)]


def test_epochs_cover_everything_once_and_are_seeded():
    s = PromptStream(_prompts(10), seed=3)
    first = [p.qid for p in s.next(10)]
    assert sorted(first) == sorted(f"q{i}" for i in range(10))
    again = PromptStream(_prompts(10), seed=3)
    assert [p.qid for p in again.next(10)] == first
    other = PromptStream(_prompts(10), seed=4)
    assert [p.qid for p in other.next(10)] != first


def test_retired_questions_skipped_from_next_epoch():
    retired = set()
    s = PromptStream(_prompts(6), seed=0, retired=lambda: frozenset(retired))
    s.next(2)
    retired.update({"q0", "q1"})
    rest_of_epoch = s.next(4)  # this epoch's order is fixed already
    assert len(rest_of_epoch) == 4
    nxt = [p.qid for p in s.next(4)]
    assert set(nxt) == {"q2", "q3", "q4", "q5"}


def test_all_retired_fails_loudly():
    s = PromptStream(_prompts(2), seed=0, retired=lambda: frozenset({"q0", "q1"}))
    with pytest.raises(OutOfQuestions, match="every training question is retired"):
        s.next(1)


def test_state_round_trip_continues_identically():
    a = PromptStream(_prompts(7), seed=1)
    a.next(5)
    b = PromptStream(_prompts(7), seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.qid for p in a.next(6)] == [p.qid for p in b.next(6)]  # crosses into the next epoch
    assert [p.qid for p in a.next(6)] == [p.qid for p in b.next(6)]


def test_a_call_never_holds_a_question_twice_across_an_epoch_boundary():
    for seed in range(20):
        s = PromptStream(_prompts(5), seed=seed)
        s.next(3)  # 2 left in this epoch: the next call of 4 crosses into the next one
        for _ in range(10):
            got = [p.qid for p in s.next(4)]
            assert len(set(got)) == 4, (seed, got)
    # every epoch is still a permutation of the questions, in seeded order
    s, seen = PromptStream(_prompts(5), seed=0), []
    for _ in range(5):
        seen += [p.qid for p in s.next(4)]
    assert sorted(seen[:5]) == sorted(f"q{i}" for i in range(5))


def test_fewer_questions_left_than_a_step_needs():
    retired = set()
    s = PromptStream(_prompts(6), seed=0, retired=lambda: frozenset(retired))
    s.next(6)
    retired.update({"q0", "q1", "q2"})
    with pytest.raises(OutOfQuestions, match="only 3 training questions are not retired; a step needs 4"):
        s.next(4)


# --------------------------------------------------------------------------- sources: builtin:<task> or a file


def test_builtin_prefix_is_parsed_in_one_place():
    from exgrpo.core.config import builtin_name
    from exgrpo.data.tasks import ArithTask, builtin_task

    assert builtin_name("builtin:arith") == "arith"
    assert builtin_name("data/arith.parquet") is None and builtin_name("arith") is None
    assert isinstance(builtin_task("builtin:arith"), ArithTask) and isinstance(
        builtin_task("arith"), ArithTask
    )


def test_read_source_builtin_task_and_file(tmp_path):
    from exgrpo.data.readers import write_prompts
    from exgrpo.data.sources import read_source
    from exgrpo.data.tasks import builtin_task

    data = read_source("builtin:arith", split="eval", num=5, seed=3)
    assert data.name == "arith" and data.skipped == () and data.rows_read == 5
    assert list(data.prompts) == builtin_task("arith").make_split(split="eval", n=5, seed=3)
    path = tmp_path / "few.jsonl"
    write_prompts(data.prompts, path)
    path.write_text(path.read_text() + '{"qid": "no-answer", "question": "1+1"}\n')
    from_file = read_source(str(path), split="train", num=1)  # files: every row, split/num unused
    assert from_file.name == "few" and from_file.prompts == data.prompts
    assert from_file.rows_read == 6 and [b.row for b in from_file.skipped] == [5]
    with pytest.raises(ValueError, match="unknown builtin task 'builtin:nope'"):
        read_source("builtin:nope", split="eval", num=1)


def test_load_prompts_train_and_eval_specs(tmp_path):
    from exgrpo.core.config_files import load_config
    from exgrpo.data.readers import write_prompts
    from exgrpo.data.sources import load_prompts
    from exgrpo.data.tasks import builtin_task

    task = builtin_task("arith")
    cfg = load_config(
        overrides=[
            "data.train=builtin:arith",
            "data.eval=",
            "data.num_train=6",
            "data.num_eval=4",
            "data.seed=2",
        ]
    )
    train, evaluation = load_prompts(cfg)  # builtin train: its held-out split is the eval set
    assert train == task.make_split(split="train", n=6, seed=2)
    assert evaluation == task.make_split(split="eval", n=4, seed=2)
    path = write_prompts(train, tmp_path / "train.jsonl")
    cfg = load_config(overrides=[f"data.train={path}", "data.eval=builtin:gsm", "data.num_eval=3"])
    train_from_file, gsm = load_prompts(cfg)
    assert train_from_file == train and gsm == builtin_task("gsm").make_split(split="eval", n=3, seed=0)
    assert (
        load_prompts(load_config(overrides=[f"data.train={path}", "data.eval="]))[1] == []
    )  # a file alone: no eval set
