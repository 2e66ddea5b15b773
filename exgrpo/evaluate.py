"""Held-out evaluation: Avg@n, Pass@1 and Pass@n per data source, and the `python -m exgrpo.evaluate` CLI.

    python -m exgrpo.evaluate --model runs/X/final --data aime24.parquet --template think --n 32
    python -m exgrpo.evaluate --model builtin:tiny --data builtin:arith --num 200 --max-tokens 32

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
decode is generated and reused for all n.

`sample_rewards` is the project's one "generate n, verify" loop (used by `evaluate`, the samplers'
held-out evaluation and the warm-up's solve counts). Both are engine-agnostic (anything
implementing `GenerationEngine.generate`) and import no Ray, vLLM or DeepSpeed, so the driver can
call them on any engine it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_args

from exgrpo.config import Dtype, EngineKind, TemplateName
from exgrpo.data.sources import SourceData, read_source
from exgrpo.data.templates import TEMPLATES, render_prompt, reward_mode
from exgrpo.fileio import atomic_write_text
from exgrpo.types import Prompt

if TYPE_CHECKING:  # the engines import torch; evaluate itself only calls `generate`
    from actors.engines import GenerationEngine


class Scorer(Protocol):
    """What `evaluate` needs from a verifier (`exgrpo.rewards.Verifier` is one)."""

    def score_many(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]: ...


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


def sample_rewards(
    engine: GenerationEngine,
    verifier: Scorer,
    prompts: Sequence[Prompt],
    *,
    n: int,
    template: TemplateName,
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
    tokenizer: Any = None,
) -> list[tuple[float, ...]]:
    """Per prompt, the rewards of its n sampled responses: one engine call, one verifier call.

    Prompts are rendered with `render_prompt(question, template=..., tokenizer=...)`; `tokenizer`
    defaults to the engine's own `tokenizer` attribute when it has one. The engine call is
    `generate(texts, n=n, max_tokens=, temperature=, top_p=, seed=)` (vLLM seeds prompt i's sample
    j with seed + i * n + j). At temperature 0 all n samples would be the greedy decode: one is
    generated and its reward repeated n times. The verifier's extraction mode must be
    `reward_mode(template)` (checked when the verifier has a `mode`).
    """
    _check(verifier, n=n, temperature=temperature, template=template)
    if not prompts:
        return []
    if tokenizer is None:
        tokenizer = getattr(engine, "tokenizer", None)
    texts = [render_prompt(p.question, template=template, tokenizer=tokenizer) for p in prompts]
    drawn = 1 if temperature == 0 else n
    outs = engine.generate(
        texts, n=drawn, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    if len(outs) != len(prompts) or any(len(comps) != drawn for comps in outs):
        raise RuntimeError(
            f"the engine returned {[len(c) for c in outs]} completions for {len(prompts)} prompts, "
            f"asked for {drawn} each"
        )
    golds = [p.answer for p in prompts for _ in range(drawn)]
    rewards = verifier.score_many([c.text for comps in outs for c in comps], golds)
    return [tuple(rewards[i * drawn : (i + 1) * drawn]) * (n // drawn) for i in range(len(prompts))]


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
) -> EvalReport:
    """Avg@n, Pass@1 and Pass@n of `engine` on `prompts` (see the module docstring).

    Prompts go to `sample_rewards` `chunk_size` at a time, a greedy pass (n=1, T=0) and a sampling
    pass (n, T) per chunk (at T = 0 the greedy rewards stand in for the samples); the chunk
    starting at prompt index s samples with seed `seed + s * n`, so prompt i's samples get the
    seeds a single call would give them (vLLM: seed + i * n + j). `progress(done, total)` is
    called after each chunk.
    """
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _check(verifier, n=n, temperature=temperature, template=template)
    common: dict[str, Any] = dict(template=template, max_tokens=max_tokens, tokenizer=tokenizer)
    results: list[QuestionResult] = []
    for start in range(0, len(prompts), chunk_size):
        chunk = prompts[start : start + chunk_size]
        greedy = sample_rewards(engine, verifier, chunk, n=1, temperature=0.0, seed=seed, **common)
        if temperature == 0:
            samples = [g * n for g in greedy]
        else:
            sample_seed = None if seed is None else seed + start * n
            samples = sample_rewards(
                engine, verifier, chunk, n=n, temperature=temperature, top_p=top_p, seed=sample_seed, **common
            )
        for p, g, drawn in zip(chunk, greedy, samples, strict=True):
            results.append(
                QuestionResult(p.qid, p.data_source, sum(1 for r in drawn if r > 0.5), float(g[0] > 0.5))
            )
        if progress is not None:
            progress(len(results), len(prompts))
    return summarize(results, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)


def _check(verifier: Scorer, *, n: int, temperature: float, template: TemplateName) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1 samples per question, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    mode = reward_mode(template)
    if getattr(verifier, "mode", mode) != mode:
        raise ValueError(
            f"template {template!r} puts the final answer in {mode!r} mode but the verifier extracts "
            f"in {verifier.mode!r} mode; make it with Verifier(mode=reward_mode(template))"
        )


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
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI

DEFAULT_MAX_TOKENS = 4096  # response budget when --max-tokens is not given (capped by the context)


def load_data(data: str, *, num: int, seed: int, question_key: str, answer_key: str) -> SourceData:
    """`builtin:<task>` (its held-out split, `num` questions) or a parquet/jsonl file (bad rows skipped)."""
    return read_source(
        data,
        split="eval",
        num=num,
        seed=seed,
        question_key=question_key,
        answer_key=answer_key,
        on_bad_row="skip",
    )


def _context_length(model_dir: Path) -> int | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m exgrpo.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF model directory, or builtin:<name>")
    p.add_argument("--data", required=True, help="parquet/jsonl file, or builtin:<task> (its held-out split)")
    p.add_argument("--num", type=int, default=200, help="questions of a builtin task's held-out split")
    p.add_argument("--engine", choices=get_args(EngineKind), default="hf", help="generation engine")
    p.add_argument("--n", type=int, default=32, help="samples per question for Avg@n and Pass@n")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature of the n samples")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling of the n samples")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"response tokens (default {DEFAULT_MAX_TOKENS}, capped by the model's context minus the longest prompt)",
    )
    p.add_argument("--template", choices=TEMPLATES, default="plain", help="prompt template")
    p.add_argument("--out", help="JSON output (default <model dir>/eval-<data stem>.json)")
    p.add_argument("--question-key", default="question", help="question column of a plain-layout file")
    p.add_argument("--answer-key", default="answer", help="answer column of a plain-layout file")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and builtin task seed)")
    p.add_argument("--dtype", choices=get_args(Dtype), default="float32")
    p.add_argument("--verify-timeout", type=float, default=5.0, help="seconds per answer verification")
    p.add_argument("--verify-workers", type=int, default=1, help="math-verify worker processes")
    p.add_argument("--cache-dir", default="~/.cache/exgrpo", help="where builtin models are built")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from exgrpo.data.readers import DataError
    from exgrpo.models.resolve import ModelResolveError, resolve_model

    try:
        model_dir = resolve_model(args.model, cache_dir=args.cache_dir)
        data = load_data(
            args.data,
            num=args.num,
            seed=args.seed,
            question_key=args.question_key,
            answer_key=args.answer_key,
        )
    except (DataError, ModelResolveError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if data.skipped:
        shown = "; ".join(f"row {b.row}: {b.reason}" for b in data.skipped[:5])
        print(f"skipped {len(data.skipped)} of {data.rows_read} rows ({shown})", file=sys.stderr)

    from actors.engines import make_engine
    from exgrpo.rewards import Verifier

    engine = make_engine(args.engine, model_dir, dtype=args.dtype, seed=args.seed)
    tokenizer = getattr(engine, "tokenizer", None)
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
        context = _context_length(model_dir)
        if context is not None:
            longest = max(
                len(engine.tokenize(render_prompt(p.question, template=args.template, tokenizer=tokenizer)))
                for p in data.prompts
            )
            max_tokens = max(1, min(max_tokens, context - longest))
    print(
        f"evaluating {model_dir} on {len(data.prompts)} questions from {args.data}: engine {args.engine}, "
        f"template {args.template}, n {args.n}, temperature {args.temperature}, max_tokens {max_tokens}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    with Verifier(
        mode=reward_mode(args.template), timeout_s=args.verify_timeout, workers=args.verify_workers
    ) as v:
        report = evaluate(
            engine,
            data.prompts,
            template=args.template,
            tokenizer=tokenizer,
            n=args.n,
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=max_tokens,
            verifier=v,
            seed=args.seed,
            progress=lambda done, total: print(f"  {done}/{total} questions", file=sys.stderr),
        )
    wall_s = time.perf_counter() - t0
    print(format_table(report))
    out = Path(args.out) if args.out else model_dir / f"eval-{data.name}.json"
    payload = {
        "model": str(model_dir),
        "data": args.data,
        "engine": args.engine,
        "template": args.template,
        "seed": args.seed,
        "rows": {
            "read": data.rows_read,
            "evaluated": len(data.prompts),
            "skipped": len(data.skipped),
            "skipped_rows": [{"row": b.row, "reason": b.reason} for b in data.skipped],
        },
        "wall_s": wall_s,
        **report.to_dict(),
    }
    atomic_write_text(out, json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
