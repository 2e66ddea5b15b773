"""`python -m exgrpo.cold_start`: a short supervised cold start from a run config, before RL.

    python -m exgrpo.cold_start --config configs/smollm2-135m-cpu.yaml --out runs/smollm2-cold
    python -m exgrpo.run --config configs/smollm2-135m-cpu.yaml model.path=runs/smollm2-cold

It reads the same config and overrides as the run, resolves `model.path`, fine-tunes it on worked solutions
(`learners/cold_start.py`: the run's prompt template, the loss on the solution tokens only) and writes an HF model
directory that `model.path` accepts. The solutions come from (`SOURCES`): a builtin `data.train`'s own worked
solutions (the run's train prompts only, never its held-out or validation questions), or the rows of a data file
(`data.train`, or `--data`) with a solution column (`exgrpo/data/solutions.py`). Measured: docs/smollm2.md;
the file source: docs/data.md ("Worked solutions for the cold start").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from exgrpo.core.config import Config, ConfigError, builtin_name
from exgrpo.core.config_files import load_config
from exgrpo.core.records import Prompt
from exgrpo.data.errors import DataError

SOURCES = """where the worked solutions come from:
  a builtin task      data.train=builtin:<name> (the config's): the task's own worked solutions of the run's
                      train prompts (every builtin task has them)
  your own rows       a parquet / JSON-lines file, a save_to_disk directory or hf:org/name, read as the run
                      reads data (docs/data.md): data.train when it is not builtin, or --data SPEC; each row's
                      solution is the column --solution-column names, else the first of solution, target,
                      response, completion, output that the file has (a string, or chat messages: the last
                      assistant message; openr1's target). Rows without one are skipped and counted
                      (data.on_bad_row=error refuses them); rows that are held-out questions of the run
                      (data.eval) are refused.
the prompt is rendered with the run's model.template, and only the solution tokens (and end-of-text) are
trained on, never the prompt's."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m exgrpo.cold_start",
        description="A short supervised cold start (fine-tune on worked solutions) from a run config, before RL.",
        epilog=SOURCES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="the run's YAML file or packaged config name")
    p.add_argument(
        "--data",
        help="rows to fine-tune on: a parquet/jsonl file, save_to_disk directory or hf:org/name (default: the "
        "run's data.train)",
    )
    p.add_argument(
        "--solution-column",
        help="the column holding each row's worked solution (default: the first of solution, target, response, "
        "completion, output)",
    )
    p.add_argument("--out", required=True, help="directory to write the fine-tuned model to")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--batch-size", type=int, default=8, help="solutions per step (default 8)")
    p.add_argument(
        "--lr", type=float, default=2.0e-5, help="AdamW learning rate, every weight (default 2e-5)"
    )
    p.add_argument("--seed", type=int, default=0, help="data order and initialisation seed (default 0)")
    p.add_argument("overrides", nargs="*", help="the run's dotted overrides, e.g. data.num_train=146")
    return p


def _solutions(
    cfg: Config, *, data: str | None, column: str | None
) -> tuple[list[Prompt], Callable[[Prompt], str]]:
    """The prompts to fine-tune on and their solutions: a builtin data.train's own (no --data), else the rows of
    --data or data.train with a solution column, none of them a held-out question of the run."""
    from exgrpo.data.sources import load_prompts, read_source
    from exgrpo.data.tasks import builtin_task

    d = cfg.data
    if data is None and builtin_name(d.train) is not None:
        if column is not None:
            raise ConfigError(
                f"--solution-column reads a data file; data.train={d.train} is a builtin task, whose solutions "
                "are its own (give --data FILE to fine-tune on a file's rows)"
            )
        task = builtin_task(d.train, seed=d.seed)
        return load_prompts(cfg)[0], task.solution_text
    from exgrpo.data.solutions import read_solutions

    spec = data or d.train
    found = read_solutions(
        spec, column=column, question_key=d.question_key, answer_key=d.answer_key, on_bad_row=d.on_bad_row
    )
    print(f"[exgrpo] cold start rows: {found.summary(spec)}")
    held = d.eval or (d.train if builtin_name(d.train) is not None else "")
    if held:  # the run's held-out questions are never trained on
        heldout = read_source(
            held,
            split="eval",
            num=d.num_eval,
            seed=d.seed,
            question_key=d.question_key,
            answer_key=d.answer_key,
            for_reward_fn=cfg.reward.fn != "math",
        )
        questions = {p.question for p in heldout.prompts}
        leaked = [p.qid for p, _ in found.pairs if p.question in questions]
        if leaked:
            raise DataError(
                f"{len(leaked)} of the rows of {spec} are held-out questions of the run ({held}), e.g. "
                f"{', '.join(leaked[:3])}: the cold start never trains on them; remove them from the file"
            )
    by_qid = {p.qid: text for p, text in found.pairs}
    return [p for p, _ in found.pairs], lambda p: by_qid[p.qid]


def main(argv: list[str] | None = None) -> int:
    from exgrpo.models.resolve import resolve_model
    from learners.cold_start import ColdStartSpec, cold_start

    args = _parser().parse_intermixed_args(argv)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        print(f"error: {out} exists (pass --overwrite to replace it)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        spec = ColdStartSpec(
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            autocast=cfg.learners.autocast,
        )
        spec.check()
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        prompts, solution = _solutions(cfg, data=args.data, column=args.solution_column)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir)
    record = cold_start(base, out, prompts=prompts, solution=solution, template=cfg.model.template, spec=spec)
    print(
        f"[exgrpo] cold start done in {record['seconds']} s: loss {record['losses'][0]} -> "
        f"{record['losses'][-1]}; model in {out}"
    )
    config = f"--config {args.config} " if args.config else ""
    print(f"next: python -m exgrpo.run {config}model.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
