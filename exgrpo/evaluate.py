"""`python -m exgrpo.evaluate`: held-out Avg@n, Pass@1 and Pass@n of a model per data source, printed and written as JSON.

    python -m exgrpo.evaluate --model runs/X/final --data aime24.parquet --template think --n 32
    python -m exgrpo.evaluate --like-run runs/X          # the run's model, eval data, T, lengths, template, reward

The scores are the run's (docs/metrics.md, "Held-out scores"; `exgrpo/evaluation/scores.py`); `--like-run`
measures as the run's `eval/accuracy` is. An earlier evaluation's JSON is never overwritten without
`--overwrite`. `--help` lists the options; tests: tests/exgrpo/evaluation/test_evaluate_cli.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, get_args

from exgrpo.core.config import Dtype, EngineKind
from exgrpo.core.fileio import atomic_write_text
from exgrpo.core.records import Prompt
from exgrpo.data.templates import TEMPLATES, render_prompt, reward_mode
from exgrpo.evaluation.completions import CompletionWriter
from exgrpo.evaluation.like_run import (
    DEFAULT_MAX_TOKENS,
    context_length,
    default_out,
    first_questions,
    free_out,
    like_run,
    response_budget,
    run_model_dir,
    unfinished_run,
)
from exgrpo.evaluation.scores import SamplingSettings, evaluate, format_table, load_data

# --------------------------------------------------------------------------- CLI

RUN_DEFAULTS = {  # the options' defaults without --like-run (what a run uses by default)
    "num": 200,
    "n": 32,
    "temperature": 1.0,
    "top_p": 1.0,
    "template": "plain",
    "question_key": "question",
    "answer_key": "answer",
    "seed": 0,
    "dtype": "float32",
    "verify_timeout": 5.0,
    "reward_fn": "math",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m exgrpo.evaluate", description=__doc__.split("\n")[0])
    _what_options(p)
    _sampling_options(p)
    _run_options(p)
    return p


def _what_options(p: argparse.ArgumentParser) -> None:
    """What is evaluated (the model, the data, or a run's), what counts as correct, the engine."""
    p.add_argument(
        "--model",
        help="HF model directory, hub id org/name[@revision], or builtin:<name> (a run directory: its final/; "
        "default with --like-run: "
        "RUN_DIR/final)",
    )
    p.add_argument(
        "--data",
        help="parquet/jsonl file, save_to_disk dir[@split], hf:org/name[:config][@split], or builtin:<task> "
        "(its held-out split) (default with --like-run: the run's "
        "held-out data)",
    )
    p.add_argument(
        "--like-run",
        metavar="RUN_DIR",
        help="evaluate as the run did: its model (final/), held-out data, temperature, top-p, response length, "
        "template, reward, verify timeout, eval samples and seed, from RUN_DIR/config.yaml (options given win)",
    )
    p.add_argument(
        "--correct-above",
        type=float,
        default=0.5,
        help="a sample counts as correct (Correct@n, Pass@n, Pass@1 greedy) when its reward is above this; the "
        "run's rule (default: %(default)s; docs/metrics.md)",
    )
    p.add_argument(
        "--num",
        type=int,
        default=None,
        help="questions to evaluate: a builtin task's held-out split draws this many (default: 200), a file or "
        "dataset gives its first N rows (default: every row; --like-run: as the run did)",
    )
    p.add_argument(
        "--engine",
        choices=get_args(EngineKind),
        default="hf",
        help="generation engine (default: %(default)s)",
    )


def _sampling_options(p: argparse.ArgumentParser) -> None:
    """How each question is sampled: n samples, temperature, top-p, response length, template."""
    p.add_argument(
        "--n", type=int, default=None, help="samples per question for Avg@n and Pass@n (default: 32)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature of the n samples (default: 1.0, the run's samplers.temperature default)",
    )
    p.add_argument(
        "--top-p", type=float, default=None, help="nucleus sampling of the n samples (default: 1.0)"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"response tokens (default: {DEFAULT_MAX_TOKENS}, capped by the model's context minus the longest "
        "prompt; a larger value given is capped too, saying so)",
    )
    p.add_argument("--template", choices=TEMPLATES, default=None, help="prompt template (default: plain)")


def _run_options(p: argparse.ArgumentParser) -> None:
    """Where the results go, the data's columns, seed and dtype, the reward, the paper's preset."""
    p.add_argument(
        "--out",
        help="JSON output (default: <model dir>/eval-<data stem>.json for a model directory of your own; for a "
        "builtin: model or a hub id ./eval-<model>-<data stem>.json in the current directory, never inside a "
        "cache; when that exists: eval-<data stem>-2.json, ...)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier evaluation's JSON (default: an --out that exists is refused, the default file "
        "gets a new name)",
    )
    p.add_argument(
        "--question-key", default=None, help="question column of a plain-layout file (default: question)"
    )
    p.add_argument(
        "--answer-key", default=None, help="answer column of a plain-layout file (default: answer)"
    )
    p.add_argument(
        "--seed", type=int, default=None, help="sampling seed, also the builtin task's (default: 0)"
    )
    p.add_argument(
        "--dtype",
        choices=get_args(Dtype),
        default=None,
        help="parameter dtype of the engine (default: float32)",
    )
    p.add_argument(
        "--verify-timeout", type=float, default=None, help="seconds per answer verification (default: 5.0)"
    )
    p.add_argument(
        "--verify-workers", type=int, default=1, help="math-verify worker processes (default: %(default)s)"
    )
    p.add_argument(
        "--cache-dir", default="~/.cache/exgrpo", help="where builtin models are built (default: %(default)s)"
    )
    p.add_argument(
        "--reward-fn",
        default=None,
        help="the reward: math (the answer verifier) or package.module:function / file.py:function (default: math)",
    )
    p.add_argument(
        "--save-completions",
        metavar="PATH",
        help="also write every sampled completion to this JSONL file "
        "(qid, data_source, prompt, completion, reward, sample) (default: not written)",
    )
    p.add_argument(
        "--paper-table",
        metavar="DIR",
        help="the ExGRPO paper's table over the nine evaluation files of `python -m exgrpo.data.benchmarks --out "
        "DIR`: "
        "T 0.6, 8192 response tokens, Avg@32 for AIME24/AIME25/AMC, one sample (Pass@1) for the rest; --out is "
        "then a directory, default paper-eval (exgrpo/evaluation/paper.py) (default: off)",
    )


def _fill(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options not given: the run's with --like-run, else the defaults (`RUN_DEFAULTS`)."""
    run = {}
    if args.like_run:
        try:
            run = like_run(Path(args.like_run))
        except ValueError as err:
            parser.error(str(err))
    for key, value in {**RUN_DEFAULTS, **run}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.model is None or args.data is None:
        parser.error("--model and --data are required (or --like-run RUN_DIR)")


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Ranges of the numeric options, checked before any model loads (argparse's exit 2 and message)."""
    rules = [
        (args.num >= 1, "--num must be >= 1"),
        (args.n >= 1, "--n must be >= 1 sample per question"),
        (args.temperature >= 0, "--temperature must be >= 0 (0 = greedy)"),
        (0 < args.top_p <= 1, "--top-p must lie in (0, 1]"),
        (args.max_tokens is None or args.max_tokens >= 1, "--max-tokens must be >= 1"),
        (args.verify_timeout > 0, "--verify-timeout must be > 0 seconds"),
        (args.verify_workers >= 1, "--verify-workers must be >= 1"),
        (0 <= args.correct_above < 1, "--correct-above must lie in [0, 1)"),
    ]
    for ok, message in rules:
        if not ok:
            parser.error(message)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.paper_table:  # the preset sets data, n, T and length per file and calls main once per file
        return _paper_table(parser, args, argv)
    num_given = args.num is not None  # a file's rows are cut to --num only when it is given
    _fill(parser, args)
    _check(parser, args)
    refused = _refusal(args)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    loaded = _load(args)
    if isinstance(loaded, int):
        return loaded
    scorer, model_dir, data = loaded
    if num_given:
        data = first_questions(data, args.num)
    from actors.factory import make_engine

    engine = make_engine(args.engine, model_dir, dtype=args.dtype, seed=args.seed)
    tokenizer = getattr(engine, "tokenizer", None)
    max_tokens = _max_tokens(args, engine, model_dir, data.prompts)
    print(
        f"evaluating {model_dir} on {len(data.prompts)} questions from {args.data}: engine {args.engine}, "
        f"template {args.template}, n {args.n}, temperature {args.temperature}, max_tokens {max_tokens}, "
        f"reward {args.reward_fn}" + (f" (as run {args.like_run})" if args.like_run else ""),
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    completions = CompletionWriter(Path(args.save_completions)) if args.save_completions else None
    with scorer as v:
        report = evaluate(
            engine,
            data.prompts,
            template=args.template,
            sampling=SamplingSettings(
                n=args.n,
                temperature=args.temperature,
                max_tokens=max_tokens,
                top_p=args.top_p,
                seed=args.seed,
            ),
            verifier=v,
            tokenizer=tokenizer,
            progress=lambda done, total: print(f"  {done}/{total} questions", file=sys.stderr),
            on_samples=completions,
            correct_above=args.correct_above,
        )
    if completions is not None:
        completions.close()
    wall_s = time.perf_counter() - t0
    print(format_table(report))
    _write(args, model_dir, data, {"wall_s": wall_s, **report.to_dict()})
    if completions is not None:
        print(f"wrote {completions.path} ({len(data.prompts) * args.n} completions)", file=sys.stderr)
    return 0


def _paper_table(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    """`--paper-table DIR`: `main` once per file of the paper's table, with its settings."""
    from exgrpo.evaluation import paper

    given = [f"--{o.replace('_', '-')}" for o in paper.PAPER_OPTIONS if getattr(args, o) is not None]
    if given or not args.model:
        parser.error(f"--paper-table needs --model and sets {', '.join(given) or 'the data'} itself")
    if args.save_completions:
        parser.error("--save-completions is one file, --paper-table evaluates nine: give them apart")
    rest = [*(sys.argv[1:] if argv is None else argv), "--paper-table="]  # the last one given wins
    return paper.run(rest, Path(args.paper_table), Path(args.out or "paper-eval"), lambda a: main(a))


def _load(args: argparse.Namespace) -> tuple[Any, Path, Any] | int:
    """The scorer, the model directory and the data; or 2 (the error printed) when one cannot be had."""
    from exgrpo.data.readers import DataError
    from exgrpo.models.resolve import ModelResolveError, resolve_model
    from exgrpo.verify.plugin import RewardError
    from exgrpo.verify.rewards import MATH, make_scorer

    try:
        scorer = make_scorer(
            args.reward_fn,
            mode=reward_mode(args.template),
            timeout_s=args.verify_timeout,
            workers=args.verify_workers,
        )
    except (RewardError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        model, note = run_model_dir(args.model)
        if note:
            print(note, file=sys.stderr)
        model_dir = resolve_model(model, cache_dir=args.cache_dir)
        data = load_data(
            args.data,
            num=args.num,
            seed=args.seed,
            question_key=args.question_key,
            answer_key=args.answer_key,
            for_reward_fn=args.reward_fn != MATH,
        )
    except (DataError, ModelResolveError, ValueError) as err:
        scorer.close()
        print(f"error: {err}", file=sys.stderr)
        return 2
    if data.skipped:
        shown = "; ".join(f"row {b.row}: {b.reason}" for b in data.skipped[:5])
        print(f"skipped {len(data.skipped)} of {data.rows_read} rows ({shown})", file=sys.stderr)
    return scorer, model_dir, data


def _refusal(args: argparse.Namespace) -> str | None:
    """Why the evaluation cannot start, before any model loads: `--like-run` of a run without a final model (the
    step it stopped at and its latest checkpoint's model), an `--out` that exists without `--overwrite`."""
    if args.like_run and Path(args.model) == Path(args.like_run) / "final" and not Path(args.model).exists():
        return unfinished_run(Path(args.like_run))
    if args.out and Path(args.out).exists() and not args.overwrite:
        return f"--out {args.out} exists (an earlier evaluation); give --overwrite to replace it, or another --out"
    return None


def _max_tokens(args: argparse.Namespace, engine: Any, model_dir: Path, prompts: list[Prompt]) -> int:
    """`--max-tokens` (else the default), capped, saying so, by what the context leaves after the longest prompt."""
    context = context_length(model_dir)
    longest = 0
    if context is not None:
        tokenizer = getattr(engine, "tokenizer", None)
        longest = max(
            len(engine.tokenize(render_prompt(p.question, template=args.template, tokenizer=tokenizer)))
            for p in prompts
        )
    max_tokens, note = response_budget(args.max_tokens, context=context, longest_prompt=longest)
    if note:
        print(note, file=sys.stderr)
    return max_tokens


def _write(args: argparse.Namespace, model_dir: Path, data: Any, results: dict[str, Any]) -> None:
    """The JSON of the evaluation: its settings, the rows read, evaluated and skipped, then `results`."""
    out = (
        Path(args.out)
        if args.out
        else default_out(args.model, model_dir, data.name, cache_dir=args.cache_dir)
    )
    earlier = out if out.exists() and not args.overwrite else None
    out = free_out(out) if earlier else out  # a default file that exists: a new name (an --out was refused)
    payload = {
        "model": str(model_dir),
        "data": args.data,
        "engine": args.engine,
        "template": args.template,
        "reward_fn": args.reward_fn,
        "like_run": args.like_run,
        "seed": args.seed,
        "rows": {
            "read": data.rows_read,
            "evaluated": len(data.prompts),
            "skipped": len(data.skipped),
            "skipped_rows": [{"row": b.row, "reason": b.reason} for b in data.skipped],
        },
        **results,
    }
    atomic_write_text(out, json.dumps(payload, indent=2) + "\n")
    kept = f" ({earlier} holds an earlier evaluation, kept; --overwrite replaces it)" if earlier else ""
    print(f"wrote {out}{kept}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
