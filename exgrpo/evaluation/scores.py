"""Held-out scores: Avg@n, Pass@1 and Pass@n per data source (the library half of `python -m exgrpo.evaluate`).

Scores, per question q with gold answer a_q and rewards r in {0, 1} from the verifier:

- Avg@n   = mean over q of (1/n) sum_j r(y_qj, a_q), the n samples y_qj drawn at `temperature`
            (and `top_p`); the ExGRPO paper's Avg@32 for AIME24/25 and AMC.
- Pass@1  = mean over q of r(g_q, a_q), g_q one greedy decode (temperature 0; both engines decode
            greedily at T = 0).
- Pass@n  = mean over q of max_j r(y_qj, a_q): the share of questions with at least one correct
            sample (the plain empirical rate, not the unbiased pass@k estimator).

Each score is reported per `Prompt.data_source`, pooled over all questions (`overall`) and as the
unweighted mean of the per-source scores (`mean_of_sources`, the "Avg." column of the paper's
tables). At temperature 0 the n samples would all equal the greedy decode, so only the greedy
decode is generated and reused for all n. Engine-agnostic: anything with `GenerationEngine.generate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from actors.sampling import Samples, Scorer, check_scoring, sample_completions
from exgrpo.core.config import TemplateName
from exgrpo.core.records import Prompt
from exgrpo.data.sources import SourceData, read_source

if TYPE_CHECKING:  # the engines import torch; evaluate itself only calls `generate`
    from actors.engines import GenerationEngine


@dataclass(frozen=True)
class SourceScores:
    """Scores over a set of questions (fractions in [0, 1])."""

    questions: int  # questions scored
    avg_at_n: float  # mean reward over the n samples, averaged over questions
    pass_at_1: float  # accuracy of the greedy decode
    pass_at_n: float  # share of questions with at least one correct sample


@dataclass(frozen=True)
class QuestionResult:
    """One question's outcome."""

    qid: str
    data_source: str
    correct: int  # correct samples out of n
    greedy: float  # reward of the greedy decode (0.0 or 1.0)


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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the scores as fractions)."""
        return asdict(self)


def evaluate(
    engine: GenerationEngine,
    prompts: Sequence[Prompt],
    *,
    template: TemplateName,
    tokenizer: Any = None,
    n: int,
    temperature: float,
    max_tokens: int,
    verifier: Scorer,
    top_p: float = 1.0,
    seed: int | None = 0,
    chunk_size: int = 512,
    progress: Callable[[int, int], None] | None = None,
    on_samples: Callable[[Prompt, Samples], None] | None = None,
) -> EvalReport:
    """Avg@n, Pass@1 and Pass@n of `engine` on `prompts` (see the module docstring).

    Prompts go to `sample_rewards` `chunk_size` at a time, a greedy pass (n=1, T=0) and a sampling
    pass (n, T) per chunk (at T = 0 the greedy rewards stand in for the samples); the chunk
    starting at prompt index s samples with seed `seed + s * n`, so prompt i's samples get the
    seeds a single call would give them (vLLM: seed + i * n + j). `progress(done, total)` is
    called after each chunk; `on_samples(prompt, samples)` with each prompt's n samples (texts and
    rewards; at T = 0 the greedy decode n times), in prompt order.
    """
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    check_scoring(verifier, n=n, temperature=temperature, template=template)
    common: dict[str, Any] = dict(template=template, max_tokens=max_tokens, tokenizer=tokenizer)
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
                    p.qid, p.data_source, sum(1 for r in drawn.rewards if r > 0.5), float(g.rewards[0] > 0.5)
                )
            )
            if on_samples is not None:
                on_samples(p, drawn)
        if progress is not None:
            progress(len(results), len(prompts))
    return summarize(results, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)


def summarize(
    results: Sequence[QuestionResult], *, n: int, temperature: float, top_p: float = 1.0, max_tokens: int = 0
) -> EvalReport:
    """The report of per-question outcomes (scores per source, pooled and mean of sources)."""
    by_source: dict[str, list[QuestionResult]] = {}
    for r in results:
        by_source.setdefault(r.data_source, []).append(r)
    per_source = {name: _scores(by_source[name], n=n) for name in sorted(by_source)}
    k = len(per_source)
    mean_of_sources = SourceScores(
        questions=len(results),
        avg_at_n=sum(s.avg_at_n for s in per_source.values()) / k,
        pass_at_1=sum(s.pass_at_1 for s in per_source.values()) / k,
        pass_at_n=sum(s.pass_at_n for s in per_source.values()) / k,
    )
    return EvalReport(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        overall=_scores(results, n=n),
        mean_of_sources=mean_of_sources,
        per_source=per_source,
        questions=tuple(results),
    )


def _scores(results: Sequence[QuestionResult], *, n: int) -> SourceScores:
    q = len(results)
    return SourceScores(
        questions=q,
        avg_at_n=sum(r.correct for r in results) / (n * q),
        pass_at_1=sum(r.greedy for r in results) / q,
        pass_at_n=sum(1 for r in results if r.correct > 0) / q,
    )


def format_table(report: EvalReport) -> str:
    """A fixed-width table, one row per data source then `overall` and `mean of sources` (percent)."""
    n = report.n
    rows = [
        *report.per_source.items(),
        ("overall", report.overall),
        ("mean of sources", report.mean_of_sources),
    ]
    width = max(len(name) for name, _ in rows)
    head = f"{'data_source':<{width}}  {'questions':>9}  {f'Avg@{n}':>8}  {'Pass@1':>8}  {f'Pass@{n}':>8}"
    lines = [head, "-" * len(head)]
    for i, (name, s) in enumerate(rows):
        if i == len(report.per_source):
            lines.append("-" * len(head))
        lines.append(
            f"{name:<{width}}  {s.questions:>9}  {100 * s.avg_at_n:>8.1f}  "
            f"{100 * s.pass_at_1:>8.1f}  {100 * s.pass_at_n:>8.1f}"
        )
    lines.append(measured_at(report))
    return "\n".join(lines)


def measured_at(report: EvalReport) -> str:
    """One line saying how the table's figures were measured (T and n), printed under it."""
    n = report.n
    return (
        f"Avg@{n}, Pass@{n}: n {n} samples per question at T {report.temperature:g} (top-p {report.top_p:g}); "
        f"Pass@1: one greedy decode (T 0)"
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
