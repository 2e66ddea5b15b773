"""`python -m exgrpo.cold_start`: a short supervised cold start from a run config, before RL.

    python -m exgrpo.cold_start --config configs/smollm2-135m-cpu.yaml --out runs/smollm2-cold
    python -m exgrpo.run --config configs/smollm2-135m-cpu.yaml model.path=runs/smollm2-cold

It reads the same config and overrides as the run, resolves `model.path`, fine-tunes it on worked solutions
(`exgrpo/models/cold_start.py`: the run's prompt template, the loss on the solution tokens only) and writes an HF model
directory that `model.path` accepts. The solutions come from (`SOURCES`): a builtin `data.train`'s own worked
solutions (the run's train prompts only, never its held-out or validation questions), or the rows of a data file
(`data.train`, or `--data`) with a solution column. `read_solutions` reads such a file as a run reads it
(`exgrpo.data.readers.read_prompts`: layouts, qids, bad rows skipped and counted; no gold answer needed) and pairs
each prompt with its row's solution: the column named, else the first of `SOLUTION_COLUMNS` the file has (an error
naming the columns found when none); a string, or chat messages (openr1's `target`: the last assistant message).
Rows without one are counted and skipped, or refused with `data.on_bad_row=error`. Measured: docs/smollm2.md; the
file source: docs/data.md ("Worked solutions for the cold start"); tests: tests/exgrpo/models/test_cold_start.py,
tests/exgrpo/models/test_cold_start_rows.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config, ConfigError, builtin_name
from exgrpo.core.config_files import load_config
from exgrpo.core.records import Prompt
from exgrpo.data.errors import DataError
from exgrpo.data.readers import JSONL_SUFFIXES, PARQUET_SUFFIXES, BadRow, read_prompts

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


SOLUTION_COLUMNS = ("solution", "target", "response", "completion", "output")  # tried in this order


@dataclass(frozen=True)
class Solutions:
    """What `read_solutions` found: (prompt, solution text) pairs, in file order."""

    pairs: tuple[tuple[Prompt, str], ...]
    column: str
    layout: str
    rows: int  # rows read (bad rows included)
    unsolved: tuple[BadRow, ...]  # prompts whose solution is missing or empty (skipped)
    bad: tuple[BadRow, ...]  # rows that are no prompt (the data rules' bad rows, skipped)

    def summary(self, spec: str) -> str:
        line = (
            f"{spec}: {len(self.pairs)} of {self.rows} rows with a solution in column {self.column!r} "
            f"(layout {self.layout})"
        )
        for what, rows in (("without a solution", self.unsolved), ("malformed", self.bad)):
            if rows:
                first = "; ".join(f"row {b.row}: {b.reason}" for b in rows[:3])
                line += f"; skipped {len(rows)} {what} (first: {first})"
        return line


def solution_text(value: Any) -> str:
    """The solution a cell holds ("" for none): a string, or the last assistant message of chat messages."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        messages = [m for m in value if isinstance(m, dict) and isinstance(m.get("content"), str)]
        said = [m for m in messages if m.get("role") == "assistant"] or messages
        return said[-1]["content"].strip() if said else ""
    return ""


def _column_by_row(spec: str, pick: Callable[[list[str]], str]) -> tuple[str, dict[int, Any]]:
    """The column `pick(column names)` chooses and its value per row (rows numbered as the project's reader numbers
    them: docs/data.md, "Question ids"); a line or item that is no JSON object is left out (the reader counts it
    as a bad row). A parquet file's other columns are not read."""
    from exgrpo.data import hf_datasets

    if hf_datasets.is_dataset_spec(spec):
        columns, rows = hf_datasets.load_rows(spec)
        chosen = pick(columns)
        return chosen, {row: rec.get(chosen) for row, rec in rows}
    path = Path(spec)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        chosen = pick(pq.read_schema(path).names)
        return chosen, dict(enumerate(pq.read_table(path, columns=[chosen]).column(chosen).to_pylist()))
    assert path.suffix.lower() in JSONL_SUFFIXES  # read_prompts refused any other suffix
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    if path.suffix.lower() == ".json" and data.lstrip().startswith(b"["):
        items = enumerate(json.loads(data.decode("utf-8")))
    else:
        items = enumerate(_json_or_none(line) for line in data.split(b"\n"))
    records = {row: item for row, item in items if isinstance(item, dict)}
    chosen = pick(sorted({key for rec in records.values() for key in rec}))
    return chosen, {row: rec.get(chosen) for row, rec in records.items()}


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8")) if line.strip() else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def pick_column(columns: Sequence[str], column: str | None, *, spec: str, question_key: str) -> str:
    """The solution column: `column` when the file has it, else the first of `SOLUTION_COLUMNS` it has."""
    found = sorted(columns)
    if column is not None:
        if column not in columns:
            raise DataError(f"{spec!r} has no column {column!r} (--solution-column); its columns: {found}")
        chosen = column
    else:
        chosen = next((c for c in SOLUTION_COLUMNS if c in columns), "")
        if not chosen:
            raise DataError(
                f"{spec!r} has no solution column: its columns are {found}, and none is one of "
                f"{', '.join(SOLUTION_COLUMNS)}; name the column that holds each row's worked solution with "
                "--solution-column NAME"
            )
    if chosen == question_key:
        raise DataError(f"column {chosen!r} is the question (data.question_key), not a solution")
    return chosen


def read_solutions(
    spec: str,
    *,
    column: str | None = None,
    question_key: str = "question",
    answer_key: str = "answer",
    on_bad_row: str = "skip",
) -> Solutions:
    """The (prompt, solution) pairs of a data spec (module docstring). Raises `DataError` for a file the reader
    refuses, no solution column, no row with a solution, or (`on_bad_row="error"`) any row without one."""
    # the prompts as a run reads them (an answer optional: a solution needs no gold answer)
    read = read_prompts(spec, question_key=question_key, answer_key=answer_key, for_reward_fn=True)
    chosen, records = _column_by_row(
        spec, lambda columns: pick_column(columns, column, spec=spec, question_key=question_key)
    )
    skipped = {b.row for b in read.skipped}
    rows = [row for row in sorted(records) if row not in skipped]  # the rows the prompts came from, in order
    if len(rows) != len(read.prompts):
        raise DataError(f"{spec!r}: {len(read.prompts)} prompts but {len(rows)} rows; cannot pair them")
    pairs: list[tuple[Prompt, str]] = []
    unsolved: list[BadRow] = []
    for row, prompt in zip(rows, read.prompts, strict=True):
        text = solution_text(records[row])
        if text:
            pairs.append((prompt, text))
        else:
            unsolved.append(BadRow(row, f"no solution in column {chosen!r} (qid {prompt.qid})"))
    n, layout, bad = len(records) + len(skipped - records.keys()), read.layout, list(read.skipped)
    found = Solutions(
        tuple(pairs), chosen, layout, n, tuple(unsolved), tuple(sorted(bad, key=lambda b: b.row))
    )
    if on_bad_row == "error" and (unsolved or bad):
        raise DataError(
            found.summary(spec) + "; data.on_bad_row=error: fix these rows or set data.on_bad_row=skip"
        )
    if not pairs:
        raise DataError(f"{found.summary(spec)}: nothing to fine-tune on")
    return found


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
    from exgrpo.models.cold_start import ColdStartSpec, cold_start
    from exgrpo.models.resolve import resolve_model

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
