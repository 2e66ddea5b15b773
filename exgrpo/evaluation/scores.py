"""Held-out scores: Avg@n, Pass@1 and Pass@n per data source (the library half of `python -m exgrpo.evaluate`).

The definitions are docs/metrics.md's ("Held-out scores"): one threshold (`CORRECT_ABOVE`), every score a
fraction in [0, 1], the same in the run's `eval/*` metrics. Each score is reported per `Prompt.data_source`,
pooled (`overall`) and as the unweighted mean of the sources (`mean_of_sources`, the paper's "Avg." column).
At temperature 0 only the greedy decode is generated. Engine-agnostic: anything with
`GenerationEngine.generate`. Tests: tests/exgrpo/evaluation/test_evaluate.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from actors.sampling import Samples, Scorer, check_scoring, sample_completions
from exgrpo.core.config import TemplateName
from exgrpo.core.records import CORRECT_ABOVE, Prompt
from exgrpo.data.sources import SourceData, read_source

if TYPE_CHECKING:  # the engines import torch; evaluate itself only calls `generate`
    from actors.engines import GenerationEngine


@dataclass(frozen=True)
class SourceScores:
    """Scores over a set of questions (fractions in [0, 1])."""

    questions: int  # questions scored
    avg_at_n: float  # mean reward over the n samples, averaged over questions
    correct_at_n: float  # share of the samples whose reward is above the correctness threshold
    pass_at_1: float  # share of questions whose greedy decode is correct
    pass_at_n: float  # share of questions with at least one correct sample


@dataclass(frozen=True)
class QuestionResult:
    """One question's outcome."""

    qid: str
    data_source: str
    correct: int  # correct samples out of n (reward above the threshold)
    greedy: float  # reward of the greedy decode
    mean_reward: float  # mean reward of the n samples


@dataclass(frozen=True)
class EvalReport:
    """Scores per data source and overall, with the settings they were measured at."""

    n: int  # samples per question for Avg@n and Pass@n
    temperature: float  # sampling temperature of those samples
    top_p: float
    max_tokens: int
    overall: SourceScores  # pooled over all questions
    mean_of_sources: SourceScores  # unweighted mean of the per-source scores
    per_source: dict[str, SourceScores]  # by data_source, sorted by name
    questions: tuple[QuestionResult, ...]  # in prompt order
    correct_above: float = (
        CORRECT_ABOVE  # a sample (the greedy decode too) is correct when its reward is above this
    )
    scored: int = 0  # rewards computed (greedy decodes and samples)
    reward_failures: dict[str, int] = field(default_factory=dict)  # by kind: raised, not a number, timed out
    first_reward_failures: dict[str, str] = field(default_factory=dict)  # kind -> its text and the row's qid

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the scores as fractions)."""
        return asdict(self)


@dataclass(frozen=True)
class SamplingSettings:
    """How `evaluate` samples each question (the report records all but the seed)."""

    n: int  # samples per question for Avg@n and Pass@n
    temperature: float  # of those samples; at 0 the greedy decode stands in for them
    max_tokens: int  # response tokens per completion, at most
    top_p: float = 1.0
    seed: int | None = 0  # base seed of the samples (see `evaluate`); None = unseeded


def evaluate(
    engine: GenerationEngine,
    prompts: Sequence[Prompt],
    *,
    template: TemplateName,
    sampling: SamplingSettings,
    verifier: Scorer,
    tokenizer: Any = None,
    chunk_size: int = 512,
    progress: Callable[[int, int], None] | None = None,
    on_samples: Callable[[Prompt, Samples], None] | None = None,
    correct_above: float = CORRECT_ABOVE,
) -> EvalReport:
    """Avg@n, Pass@1 and Pass@n of `engine` on `prompts` (see the module docstring).

    Prompts go to `sample_rewards` `chunk_size` at a time, a greedy pass (n=1, T=0) and a sampling
    pass (n, T) per chunk (at T = 0 the greedy rewards stand in for the samples); n, T, top-p, the
    response length and the seed are `sampling`'s. The chunk starting at prompt index s samples with
    seed `seed + s * n`, so prompt i's samples get the seeds a single call would give them (vLLM:
    seed + i * n + j). `progress(done, total)` is called after each chunk; `on_samples(prompt, samples)`
    with each prompt's n samples (texts and rewards; at T = 0 the greedy decode n times), in prompt
    order. The report counts the rewards that failed while it ran (the scorer's `stats()`: raised, not
    a number, timed out; each scored 0).
    """
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, temperature, top_p, seed = sampling.n, sampling.temperature, sampling.top_p, sampling.seed
    check_scoring(verifier, n=n, temperature=temperature, template=template)
    common: dict[str, Any] = dict(template=template, max_tokens=sampling.max_tokens, tokenizer=tokenizer)
    before = _failure_stats(verifier)
    results: list[QuestionResult] = []
    for start in range(0, len(prompts), chunk_size):
        chunk = prompts[start : start + chunk_size]
        greedy = sample_completions(engine, verifier, chunk, n=1, temperature=0.0, seed=seed, **common)
        if temperature == 0:
            samples = [Samples(texts=g.texts * n, rewards=g.rewards * n) for g in greedy]
        else:
            sample_seed = None if seed is None else seed + start * n
            samples = sample_completions(
                engine, verifier, chunk, n=n, temperature=temperature, top_p=top_p, seed=sample_seed, **common
            )
        for p, g, drawn in zip(chunk, greedy, samples, strict=True):
            results.append(
                QuestionResult(
                    p.qid,
                    p.data_source,
                    correct=sum(1 for r in drawn.rewards if r > correct_above),
                    greedy=float(g.rewards[0]),
                    mean_reward=sum(drawn.rewards) / len(drawn.rewards),
                )
            )
            if on_samples is not None:
                on_samples(p, drawn)
        if progress is not None:
            progress(len(results), len(prompts))
    report = summarize(
        results,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=sampling.max_tokens,
        correct_above=correct_above,
    )
    scored, failures, first = _failure_stats(verifier)
    return replace(
        report,
        scored=scored - before[0],
        reward_failures={k: v - before[1].get(k, 0) for k, v in failures.items() if v > before[1].get(k, 0)},
        first_reward_failures={k: t for k, t in first.items() if k not in before[2]},
    )


def _failure_stats(scorer: Any) -> tuple[int, dict[str, int], dict[str, str]]:
    """(scored, failures by kind, first failure of each kind) of a scorer with `stats()`, else nothing."""
    stats = scorer.stats() if hasattr(scorer, "stats") else None
    return (
        getattr(stats, "scored", 0),
        dict(getattr(stats, "failures", None) or {}),
        dict(getattr(stats, "first_failures", None) or {}),
    )


def summarize(
    results: Sequence[QuestionResult],
    *,
    n: int,
    temperature: float,
    top_p: float = 1.0,
    max_tokens: int = 0,
    correct_above: float = CORRECT_ABOVE,
) -> EvalReport:
    """The report of per-question outcomes (scores per source, pooled and mean of sources)."""
    by_source: dict[str, list[QuestionResult]] = {}
    for r in results:
        by_source.setdefault(r.data_source, []).append(r)
    per_source = {
        name: _scores(by_source[name], n=n, correct_above=correct_above) for name in sorted(by_source)
    }
    k = len(per_source)
    mean_of_sources = SourceScores(
        questions=len(results),
        avg_at_n=sum(s.avg_at_n for s in per_source.values()) / k,
        correct_at_n=sum(s.correct_at_n for s in per_source.values()) / k,
        pass_at_1=sum(s.pass_at_1 for s in per_source.values()) / k,
        pass_at_n=sum(s.pass_at_n for s in per_source.values()) / k,
    )
    return EvalReport(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        overall=_scores(results, n=n, correct_above=correct_above),
        mean_of_sources=mean_of_sources,
        per_source=per_source,
        questions=tuple(results),
        correct_above=correct_above,
    )


def _scores(results: Sequence[QuestionResult], *, n: int, correct_above: float) -> SourceScores:
    q = len(results)
    return SourceScores(
        questions=q,
        avg_at_n=sum(r.mean_reward for r in results) / q,
        correct_at_n=sum(r.correct for r in results) / (n * q),
        pass_at_1=sum(1 for r in results if r.greedy > correct_above) / q,
        pass_at_n=sum(1 for r in results if r.correct > 0) / q,
    )


def format_table(report: EvalReport) -> str:
    """A fixed-width table, one row per data source then `overall` and `mean of sources` (fractions, as the
    run prints them), then how they were measured and the rewards that failed."""
    n = report.n
    rows = [
        *report.per_source.items(),
        ("overall", report.overall),
        ("mean of sources", report.mean_of_sources),
    ]
    width = max(len(name) for name, _ in rows)
    head = (
        f"{'data_source':<{width}}  {'questions':>9}  {f'Avg@{n}':>8}  {f'Correct@{n}':>10}  "
        f"{'Pass@1 greedy':>13}  {f'Pass@{n}':>8}"
    )
    lines = [head, "-" * len(head)]
    for i, (name, s) in enumerate(rows):
        if i == len(report.per_source):
            lines.append("-" * len(head))
        lines.append(
            f"{name:<{width}}  {s.questions:>9}  {s.avg_at_n:>8.3f}  {s.correct_at_n:>10.3f}  "
            f"{s.pass_at_1:>13.3f}  {s.pass_at_n:>8.3f}"
        )
    lines.append(measured_at(report))
    lines += failure_lines(report)
    return "\n".join(lines)


def failure_lines(report: EvalReport) -> list[str]:
    """The rewards that failed (each scored 0), by kind, and the first of each kind; [] when none did."""
    total = sum(report.reward_failures.values())
    if not total:
        return []
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(report.reward_failures.items()))
    share = total / max(report.scored, 1)
    return [
        f"reward failures: {total} of {report.scored} rewards ({share:.1%}; {kinds}), each scored 0",
        *(f"  first {kind}: {text}" for kind, text in sorted(report.first_reward_failures.items())),
    ]


def measured_at(report: EvalReport) -> str:
    """One line saying how the table's figures were measured (T and n), printed under it."""
    n, above = report.n, report.correct_above
    return (
        f"Avg@{n}: mean reward; correct = reward > {above:g}; Correct@{n}: share of samples correct; Pass@{n}: "
        f"share of questions with a correct sample; n {n} samples per question at T {report.temperature:g} "
        f"(top-p {report.top_p:g}, {report.max_tokens} response tokens); Pass@1 greedy: share of questions "
        f"whose greedy decode (T 0) is correct (docs/metrics.md)"
    )


def load_data(
    data: str, *, num: int, seed: int, question_key: str, answer_key: str, for_reward_fn: bool = False
) -> SourceData:
    """`builtin:<task>` (its held-out split, `num` questions) or a parquet/jsonl file (bad rows skipped;
    `for_reward_fn`: rows keep their other columns and may lack an answer, `exgrpo.data.readers`)."""
    return read_source(
        data,
        split="eval",
        num=num,
        seed=seed,
        question_key=question_key,
        answer_key=answer_key,
        on_bad_row="skip",
        for_reward_fn=for_reward_fn,
    )
