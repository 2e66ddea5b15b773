"""The scratchpad task (splits, traces, process check, noise) and its trace warm-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from exgrpo.core.records import Prompt
from exgrpo.data.scratchpad import (
    ID_SOURCE,
    OOD_SOURCE,
    SPLITS,
    ScratchpadTask,
    carry_chain,
    check_trace,
    question_part,
    solution_steps,
)
from exgrpo.models.tiny import TinyModelSpec
from exgrpo.models.trace_warmup import TraceWarmupSpec, read_trace_warmup, training_prompts, warm_up_traces
from exgrpo.verify.answers import extract_answer

TASK = ScratchpadTask()


def _prompt(question: str) -> Prompt:
    a, b = (int(x) for x in question.split("+"))
    return Prompt(qid="q", question=question, answer=str(a + b))


def test_solution_trace_by_hand() -> None:
    text = TASK.solution_text(_prompt("4827+396"))
    assert text == "7+6+0=13;2+9+1=12;8+3+1=12;4+0+1=05;\\boxed{5223}"
    assert extract_answer(text) == "5223"
    assert TASK.solution_text(_prompt("5+7")) == "5+7+0=12;\\boxed{12}"
    assert TASK.difficulty(_prompt("5+3")) == 0 and TASK.difficulty(_prompt("4827+396")) == 6
    assert carry_chain(solution_steps("4827+396")) == 3 and carry_chain(solution_steps("9999+1")) == 4


def test_splits_are_disjoint_deterministic_and_in_range() -> None:
    splits = {s: TASK.make_split(split=s, n=300) for s in SPLITS}
    texts = {s: {p.question for p in ps} for s, ps in splits.items()}
    held_out = texts["val"] | texts["eval"] | texts["ood-val"] | texts["ood-eval"]
    assert not texts["train"] & held_out
    assert not texts["val"] & texts["eval"] and not texts["ood-val"] & texts["ood-eval"]
    assert not (texts["val"] | texts["eval"]) & (texts["ood-val"] | texts["ood-eval"])
    # the train split never emits a held-out question, whatever the seed
    assert not {p.question for p in TASK.make_split(split="train", n=2000, seed=5)} & held_out
    for s, ps in splits.items():
        assert len(texts[s]) == len(ps) == 300
        ood = s.startswith("ood-")
        assert all(p.data_source == (OOD_SOURCE if ood else ID_SOURCE) for p in ps)
        assert all(TASK.is_ood(p.question) == ood for p in ps)
        assert all(1 <= TASK.num_steps(p) <= 4 for p in ps)
        part = {"ood-val": "val", "ood-eval": "eval"}.get(s, s)
        assert all(question_part(p.question) == part for p in ps)
    assert TASK.make_split(split="eval", n=50, seed=3) == TASK.make_split(split="eval", n=80, seed=3)[:50]
    longer = ScratchpadTask(ood="longer").make_split(split="ood-eval", n=50)
    assert all(TASK.num_steps(p) == 5 and p.data_source == OOD_SOURCE for p in longer)


def test_solution_traces_pass_the_check() -> None:
    for s in SPLITS:
        for p in TASK.make_split(split=s, n=200, seed=1):
            text = TASK.solution_text(p)
            check = check_trace(p.question, text)
            assert check.valid and check.num_steps == TASK.num_steps(p) and not check.flawed_correct
            assert len(text) <= 49


def test_noisy_traces_are_classified() -> None:
    rng = np.random.default_rng(0)
    prompts = TASK.make_split(split="train", n=300, seed=2)
    for p in prompts:
        wrong = check_trace(p.question, TASK.noisy_solution(p, rng, 1.0, 0.0))
        assert wrong.parsed and not wrong.answer_correct and wrong.first_wrong_step is not None
        silent = check_trace(p.question, TASK.noisy_solution(p, rng, 0.0, 1.0))
        assert silent.parsed and silent.answer_correct and silent.first_wrong_step is not None
        assert silent.flawed_correct and not silent.valid
        assert check_trace(p.question, TASK.noisy_solution(p, rng, 0.0, 0.0)).valid
    # the first wrong step is the corrupted one: later steps follow the written carry faithfully
    rng = np.random.default_rng(1)
    p = _prompt("4827+396")
    for _ in range(50):
        text = TASK.noisy_solution(p, rng, 1.0, 0.0)
        k = check_trace(p.question, text).first_wrong_step
        valid_steps = TASK.solution_text(p).split(";")
        assert text.split(";")[:k] == valid_steps[:k] and text.split(";")[k] != valid_steps[k]


def test_check_trace_edge_cases() -> None:
    q = "58+67"  # 8+7+0=15;5+6+1=12;\boxed{125}
    assert check_trace(q, "8+7+0=15;5+6+1=12;\\boxed{125}").valid
    missing = check_trace(q, "8+7+0=15;\\boxed{125}")
    assert missing.parsed and missing.first_wrong_step == 1 and missing.flawed_correct
    extra = check_trace(q, "8+7+0=15;5+6+1=12;0+0+1=01;\\boxed{125}")
    assert extra.first_wrong_step == 2 and extra.flawed_correct
    bad_carry = check_trace(q, "8+7+0=15;5+6+0=12;\\boxed{125}")
    assert bad_carry.first_wrong_step == 1 and bad_carry.answer_correct
    garbled = check_trace(q, "8+7+0=15;5+6+\\boxed{125}")
    assert not garbled.parsed and garbled.answer_correct and garbled.flawed_correct
    assert not check_trace(q, "8+7+0=15;5+6+1=12;\\boxes{125}").answer_correct
    assert not check_trace(q, "").parsed


def test_invalid_task_and_spec() -> None:
    with pytest.raises(ValueError):
        ScratchpadTask(ood="longer", ood_digits=(3, 5))
    with pytest.raises(ValueError):
        TASK.make_split(split="test", n=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps=0"):
        TraceWarmupSpec(steps=0)


_SMALL = TraceWarmupSpec(
    model=TinyModelSpec(
        hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=32, intermediate_size=64
    ),
    steps=4,
    batch_size=8,
    num_train=200,
    warmup_steps=2,
)


def test_tiny_warm_up_is_deterministic(tmp_path: Path) -> None:
    a = warm_up_traces(tmp_path / "a", spec=_SMALL)
    b = warm_up_traces(tmp_path / "b", spec=_SMALL)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    ra, rb = read_trace_warmup(a), read_trace_warmup(b)
    assert ra.fingerprint == rb.fingerprint == _SMALL.fingerprint()
    assert ra.final_loss == rb.final_loss and ra.num_train_questions == 200
    other = dataclasses.replace(_SMALL, p_silent=0.2)
    assert other.fingerprint() != _SMALL.fingerprint()
    c = warm_up_traces(tmp_path / "c", spec=other)
    wc = load_file(str(c / "model.safetensors"))
    assert any(not (wa[k] == wc[k]).all() for k in wa)
    assert all(question_part(p.question) == "train" for p in training_prompts(_SMALL))


def test_views_redirect_eval_for_configs() -> None:
    from exgrpo.data.scratchpad import SCRATCHPAD_TASKS

    for name, target in (
        ("scratchpad-val", "val"),
        ("scratchpad-ood", "ood-eval"),
        ("scratchpad-ood-val", "ood-val"),
    ):
        view = SCRATCHPAD_TASKS[name](seed=4)
        assert view.make_split(split="eval", n=20) == TASK.make_split(split=target, n=20, seed=4)
        assert view.make_split(split="train", n=20) == TASK.make_split(split="train", n=20, seed=4)
    assert SCRATCHPAD_TASKS["scratchpad"](seed=2).make_split(split="eval", n=5) == TASK.make_split(
        split="eval", n=5, seed=2
    )
