"""One meaning per held-out metric, in the run (`eval/accuracy`, `eval/pass_at_n`) and in `python -m
exgrpo.evaluate` (Avg@n, Correct@n, Pass@1, Pass@n), with a reward that is not 0 / 1 (docs/metrics.md,
"Held-out scores"): Avg@n is the mean reward; a sample is correct when its reward is above 0.5
(`--correct-above`); Pass@k is the share of questions with a correct sample among k, the greedy Pass@1 too.
With a 0 / 1 reward every figure is what it was before."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pytest

from actors.engines import Completion
from exgrpo.core import metric_names as M
from exgrpo.core.records import Prompt
from exgrpo.evaluation.scores import QuestionResult, SamplingSettings, evaluate, format_table, summarize
from exgrpo.loop.steps import CORRECT_ABOVE, eval_metrics

PROMPTS = [Prompt(qid=f"q{i}", question=f"q{i}", answer="", data_source="s") for i in range(2)]
# q0: greedy 0.4 (partly right, not correct); samples 0.9 (correct), 0.2, 0.2, 0.2
# q1: greedy 0.45; samples 0.5 (not above 0.5), 0.3, 0.3, 0.3
GREEDY = {"q0": "g0.4", "q1": "g0.45"}
SAMPLES = {"q0": ["0.9", "0.2", "0.2", "0.2"], "q1": ["0.5", "0.3", "0.3", "0.3"]}
SAMPLING = SamplingSettings(n=4, temperature=1.0, max_tokens=8)


@dataclass
class Engine:
    def generate(self, prompts: Sequence[str], *, n: int, max_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None) -> list[list[Completion]]:  # fmt: skip
        out = []
        for text in prompts:
            q = text.removeprefix("Q: ").removesuffix("\nA: ")
            canned = [GREEDY[q]] if temperature == 0 else SAMPLES[q]
            out.append([Completion((1,), (0.0,), canned[j % len(canned)], "stop") for j in range(n)])
        return out

    def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(map(ord, text))


class Graded:
    """A user's reward in [0, 1]: the completion's text is its reward."""

    def score_prompts(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        return [float(c.lstrip("g")) for c in completions]


def test_evaluate_uses_one_threshold_for_every_pass_figure() -> None:
    report = evaluate(Engine(), PROMPTS, template="plain", sampling=SAMPLING, verifier=Graded())
    s = report.overall
    assert s.avg_at_n == pytest.approx((0.9 + 0.6 + 0.5 + 0.9) / 8)  # the mean reward
    assert s.correct_at_n == pytest.approx(1 / 8)  # one sample above 0.5
    assert s.pass_at_n == pytest.approx(1 / 2)  # q0 has a correct sample, q1 none (0.5 is not above 0.5)
    assert s.pass_at_1 == 0.0  # greedy 0.4 and 0.45: not correct (before: their mean, 0.425 > nothing)
    assert [q.greedy for q in report.questions] == [0.4, 0.45]  # the greedy reward itself is kept
    loose = evaluate(
        Engine(), PROMPTS, template="plain", sampling=SAMPLING, verifier=Graded(), correct_above=0.35
    )
    assert (loose.overall.pass_at_1, loose.overall.pass_at_n) == (1.0, 1.0)  # the same threshold for both


def test_the_run_and_evaluate_agree_on_avg_and_pass() -> None:
    rewards = [[float(c) for c in SAMPLES[p.qid]] for p in PROMPTS]
    run, _ = eval_metrics(PROMPTS, rewards, version=3)
    results = [
        QuestionResult(p.qid, p.data_source, correct=sum(r > CORRECT_ABOVE for r in rs), greedy=0.0,
                       mean_reward=sum(rs) / len(rs))
        for p, rs in zip(PROMPTS, rewards, strict=True)
    ]  # fmt: skip
    report = summarize(results, n=4, temperature=1.0, correct_above=CORRECT_ABOVE)
    assert run[M.EVAL_ACCURACY] == pytest.approx(report.overall.avg_at_n)
    assert run[M.EVAL_PASS] == pytest.approx(report.overall.pass_at_n) == 0.5  # before: mean best reward 0.7


def test_binary_rewards_give_the_numbers_they_gave_before() -> None:
    rng = random.Random(0)
    for _ in range(50):
        rewards = [[float(rng.random() < 0.3) for _ in range(4)] for _ in range(7)]
        prompts = [Prompt(qid=str(i), question="", answer="") for i in range(7)]
        run, _ = eval_metrics(prompts, rewards, version=0)
        assert run[M.EVAL_PASS] == float(np.mean([max(s) for s in rewards]))  # the old formula
        assert run[M.EVAL_ACCURACY] == float(np.mean([np.mean(s) for s in rewards]))
        greedy = [float(rng.random() < 0.5) for _ in range(7)]
        results = [QuestionResult(str(i), "s", correct=int(sum(s)), greedy=g, mean_reward=sum(s) / 4)
                   for i, (s, g) in enumerate(zip(rewards, greedy, strict=True))]  # fmt: skip
        assert summarize(results, n=4, temperature=1.0).overall.pass_at_1 == sum(greedy) / 7  # the old mean


def test_the_table_names_the_greedy_pass_apart_from_pass_at_n() -> None:
    report = evaluate(Engine(), PROMPTS, template="plain", sampling=replace(SAMPLING, n=1), verifier=Graded())
    head = format_table(report).splitlines()[0]
    assert "Pass@1 greedy" in head  # n = 1: two columns named Pass@1 before, the greedy one a mean reward
    assert "correct = reward > 0.5" in format_table(report)
