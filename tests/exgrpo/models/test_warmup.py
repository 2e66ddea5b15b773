"""Supervised warm-up: specs and their fingerprints, train-only data, noise, determinism, the cache,
and (slow) the real builtin:arith-base's held-out solve rate."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import exgrpo.models.resolve as models
from actors.engines import HFEngine
from exgrpo.data.tasks import ArithTask, in_eval_part
from exgrpo.data.templates import render_prompt
from exgrpo.evaluation.measure import evaluate_solve_rate
from exgrpo.models.resolve import BuiltinModel, register_builtin, resolve_model
from exgrpo.models.tiny import TinyModelSpec, build_char_tokenizer
from exgrpo.models.warmup import (
    ARITH_BASE,
    ARITH_WEAK,
    WarmupSpec,
    _add_label_noise,
    _encode,
    questions_sha256,
    read_warmup,
    training_prompts,
    warm_up,
)

torch.set_num_threads(1)

MICRO = TinyModelSpec(
    hidden_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_position=32,
)
# 1-digit additions drawn from 400 train questions (28 of them): small enough to memorise in seconds
ONE_DIGIT = WarmupSpec(
    model=MICRO, steps=400, lr=3e-3, batch_size=16, num_train=400, question_pattern=r"\d\+\d", warmup_steps=10
)
# a few noisy updates on 2-operand questions, with the thread count of ARITH_BASE
NOISY = WarmupSpec(
    model=MICRO,
    steps=8,
    batch_size=8,
    num_train=200,
    label_noise=0.5,
    format_noise=0.5,
    question_pattern=r"\d{1,2}[+-]\d{1,2}",
    threads=ARITH_BASE.threads,
)


# ------------------------------------------------------------------------------------ the spec


def test_fingerprint_is_stable_and_covers_every_field() -> None:
    assert WarmupSpec().fingerprint() == WarmupSpec().fingerprint()
    assert len(ARITH_BASE.fingerprint()) == 12
    changes = {
        "steps": 7,
        "lr": 0.5,
        "label_noise": 0.1,
        "format_noise": 0.1,
        "seed": 3,
        "question_pattern": "1",
    }
    prints = {dataclasses.replace(ARITH_BASE, **{k: v}).fingerprint() for k, v in changes.items()}
    prints.add(
        dataclasses.replace(ARITH_BASE, model=dataclasses.replace(ARITH_BASE.model, seed=9)).fingerprint()
    )
    assert ARITH_BASE.fingerprint() not in prints and len(prints) == len(changes) + 1


def test_invalid_spec_names_every_problem() -> None:
    with pytest.raises(ValueError, match=r"steps=0 must be >= 1.*label_noise=1.5 must be in \[0, 1\]"):
        WarmupSpec(steps=0, label_noise=1.5)


def test_arith_weak_is_arith_base_stopped_early() -> None:
    assert dataclasses.replace(ARITH_WEAK, steps=ARITH_BASE.steps) == ARITH_BASE
    assert ARITH_WEAK.steps < ARITH_BASE.steps


# ---------------------------------------------------------------------------------- the data


def test_training_questions_come_from_the_train_split_only() -> None:
    prompts = training_prompts(ARITH_BASE)
    assert len(prompts) > 5000
    assert all(re.fullmatch(r"\d{1,2}[+-]\d{1,2}", p.question) for p in prompts)
    assert not any(in_eval_part(p.question) for p in prompts)  # the held-out part of the space
    evaluation = {p.question for p in ArithTask().make_split(split="eval", n=2000, seed=0)}
    assert evaluation.isdisjoint(p.question for p in prompts)
    # two-operand 1-2 digit eval questions exist, so the disjointness above is not vacuous
    assert any(re.fullmatch(r"\d{1,2}[+-]\d{1,2}", q) for q in evaluation)


def test_sequences_hold_prompt_response_and_eos() -> None:
    tok = build_char_tokenizer()
    prompts = training_prompts(ONE_DIGIT)[:2]  # "5+0", "8+1"
    boxed = _encode(prompts, spec=ONE_DIGIT, misspelled=False, width=0)
    misspelled = _encode(prompts, spec=ONE_DIGIT, misspelled=True, width=boxed.input_ids.shape[1])
    assert [p.question for p in prompts] == ["5+0", "8+1"]
    # "Q: 5+0\nA: " is 10 tokens, "\boxed{5}" 9, eos 1
    assert boxed.lengths.tolist() == [20, 20] and misspelled.lengths.tolist() == [20, 20]
    assert tok.decode(boxed.input_ids[0].tolist()) == "Q: 5+0\nA: \\boxed{5}<|endoftext|>"
    assert tok.decode(misspelled.input_ids[1].tolist()) == "Q: 8+1\nA: \\boxes{9}<|endoftext|>"
    response = boxed.labels[0][boxed.labels[0] != -100].tolist()
    assert response == tok.encode("\\boxed{5}", add_special_tokens=False) + [tok.eos_token_id]
    assert (boxed.labels[0, :10] == -100).all()  # no loss on the prompt


def test_label_noise_changes_exactly_one_answer_digit() -> None:
    tok = build_char_tokenizer()
    prompts = [p for p in training_prompts(ARITH_BASE) if len(p.answer) == 3][:50]
    seqs = _encode(prompts, spec=ARITH_BASE, misspelled=False, width=0)
    ids, labels = seqs.input_ids.clone(), seqs.labels.clone()
    _add_label_noise(ids, labels, share=1.0, rng=np.random.default_rng(0))
    changed = labels != seqs.labels  # (N, T)
    assert changed.sum(dim=1).tolist() == [1] * len(prompts)
    assert torch.equal(changed, ids != seqs.input_ids)  # the input sees the same wrong digit
    positions = set()
    for row in range(len(prompts)):
        text = tok.decode(ids[row, : int(seqs.lengths[row])].tolist())
        answer = re.search(r"\\boxed\{(\d+)\}<\|endoftext\|>$", text).group(1)
        assert len(answer) == 3 and answer[0] != "0" and answer != prompts[row].answer
        positions.add(int(seqs.lengths[row]) - int(changed[row].nonzero()))  # from the end: "d d d } eos"
    assert positions == {3, 4, 5}  # every digit of the answer gets hit somewhere in 50 rows
    _add_label_noise(ids, labels, share=0.0, rng=np.random.default_rng(0))
    assert (labels != seqs.labels).sum() == len(prompts)  # share 0: nothing more changes


# ------------------------------------------------------------------------------ the warm-up


def test_warm_up_is_deterministic_and_records_its_run(tmp_path: Path) -> None:
    first = warm_up(tmp_path / "a", spec=NOISY)
    second = warm_up(tmp_path / "b", spec=NOISY)
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(w.dtype == torch.float32 for w in a.values())
    ra, rb = read_warmup(first), read_warmup(second)
    assert dataclasses.replace(ra, build_seconds=0.0) == dataclasses.replace(rb, build_seconds=0.0)
    record = json.loads((first / "warmup.json").read_text())
    assert record["spec"] == dataclasses.asdict(NOISY) and ra.fingerprint == NOISY.fingerprint()
    # the questions it trained on are exactly training_prompts(spec): train split only (see above)
    assert ra.train_questions_sha256 == questions_sha256(training_prompts(NOISY))
    assert len(ra.loss_curve) == 8  # one block per update when steps < 20
    changed = warm_up(tmp_path / "c", spec=dataclasses.replace(NOISY, seed=1))
    c = load_file(changed / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_warmed_model_learns_and_is_measured_through_the_engine(tmp_path: Path) -> None:
    model_dir = warm_up(tmp_path / "m", spec=ONE_DIGIT)
    result = read_warmup(model_dir)
    assert result.final_loss < 0.1 * result.first_loss  # loss decreases (ln 98 = 4.6 at the start)
    assert all(b <= a + 0.05 for a, b in zip(result.loss_curve, result.loss_curve[1:], strict=False))
    prompts = training_prompts(ONE_DIGIT)
    assert evaluate_solve_rate(model_dir, prompts, temperature=0.0) == 1.0  # memorised: greedy solves all
    engine = HFEngine(model_dir)
    completions = engine.generate(
        [render_prompt(p.question, template="plain") for p in prompts], n=2, max_tokens=16
    )
    assert all(c.finish_reason == "stop" and c.token_ids[-1] == 1 for group in completions for c in group)
    # every response misspelled -> the verifier finds no answer, whatever the digits
    misspelled = warm_up(tmp_path / "f", spec=dataclasses.replace(ONE_DIGIT, format_noise=1.0))
    assert evaluate_solve_rate(misspelled, prompts, temperature=0.0) == 0.0
    assert HFEngine(misspelled).generate(["Q: 3+4\nA: "], n=1, max_tokens=16, temperature=0.0)[0][0].text == (
        "\\boxes{7}"
    )


def test_resolve_builds_a_warmed_builtin_once_then_reuses_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(models, "BUILTIN_MODELS", dict(models.BUILTIN_MODELS))
    builds: list[Path] = []

    def build(out_dir: Path, *, cache_dir: Path) -> Path:
        builds.append(Path(out_dir))
        return warm_up(out_dir, spec=NOISY)

    register_builtin("noisy-test", BuiltinModel(build=build, fingerprint=NOISY.fingerprint()))
    first = resolve_model("builtin:noisy-test", cache_dir=str(tmp_path))
    assert first == tmp_path / "models" / f"noisy-test-{NOISY.fingerprint()}"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("builtin:noisy-test", cache_dir=str(tmp_path)) == first
    assert len(builds) == 1 and (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert read_warmup(first).fingerprint == NOISY.fingerprint()


def test_arith_builtins_are_registered_under_their_spec_fingerprints(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(models, "BUILTIN_MODELS", dict(models.BUILTIN_MODELS))
    with pytest.raises(models.ModelResolveError, match="builtin:arith-base.*builtin:arith-weak"):
        resolve_model("builtin:nope", cache_dir=str(tmp_path))
    assert models.BUILTIN_MODELS["arith-base"].fingerprint == ARITH_BASE.fingerprint()
    assert models.BUILTIN_MODELS["arith-weak"].fingerprint == ARITH_WEAK.fingerprint()


# ----------------------------------------------------------------------------- the real ones


@pytest.mark.slow
def test_arith_base_held_out_solve_rate_is_in_its_band(tmp_path: Path) -> None:
    """docs/base-model.md: builtin:arith-base solves 15-40% of held-out questions at T = 1."""
    model_dir = resolve_model("builtin:arith-base", cache_dir=str(tmp_path))
    evaluation = ArithTask().make_split(split="eval", n=200, seed=0)
    rate = evaluate_solve_rate(model_dir, evaluation, n=4, temperature=1.0, max_tokens=16)
    assert 0.15 <= rate <= 0.40, rate
    assert evaluate_solve_rate(model_dir, evaluation, temperature=0.0) > rate  # sharpening would help RL
    completions = HFEngine(model_dir).generate(
        [render_prompt(p.question, template="plain") for p in evaluation], n=1, max_tokens=16
    )
    assert np.mean([g[0].finish_reason == "stop" for g in completions]) >= 0.95


@pytest.mark.slow
def test_arith_weak_held_out_solve_rate_is_in_its_band(tmp_path: Path) -> None:
    """docs/base-model.md: builtin:arith-weak solves 1-6% of held-out questions at T = 1."""
    model_dir = resolve_model("builtin:arith-weak", cache_dir=str(tmp_path))
    evaluation = ArithTask().make_split(split="eval", n=200, seed=0)
    rate = evaluate_solve_rate(model_dir, evaluation, n=4, temperature=1.0, max_tokens=16)
    assert 0.01 <= rate <= 0.06, rate
