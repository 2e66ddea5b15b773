"""Worked solutions from a data file, for the supervised cold start (`python -m exgrpo.cold_start`).

`read_solutions(spec)` reads a parquet / JSON-lines file, a `save_to_disk` directory or an `hf:` dataset with the
project's reader rules (docs/data.md: the layout decides the question, the qid and the data source; a row that is
no prompt is a bad row) and pairs each prompt with the text of its solution column: `column`, else the first of
`SOLUTION_COLUMNS` the file has (a `DataError` naming the columns found when none). A solution is a non-empty
string, or chat messages (openr1's `target`), whose last assistant message is taken. Rows without a solution are
counted and skipped (`on_bad_row="skip"`) or refused (`"error"`), never dropped silently. Tests:
tests/learners/test_cold_start_rows.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core.records import Prompt
from exgrpo.data.errors import DataError
from exgrpo.data.readers import (
    _LAYOUT_COLUMNS,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    BadRow,
    _choose_layout,
    _parquet_rows,
    _read_jsonl,
)
from exgrpo.data.rows import RowError, to_prompt

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


def _raw_rows(spec: str) -> tuple[list[str], Iterable[tuple[int, dict[str, Any]]], list[BadRow]]:
    """(columns, (row, record) pairs, rows that are no JSON object) of a data spec, every column kept."""
    from exgrpo.data import hf_datasets

    if hf_datasets.is_dataset_spec(spec):
        columns, rows = hf_datasets.load_rows(spec)
        return columns, rows, []
    path = Path(spec)
    if not path.is_file():
        raise DataError(f"dataset file {spec!r} does not exist")
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        try:
            columns = pq.read_schema(path).names
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same error to the user
            raise DataError(f"{spec!r} is not a readable parquet file: {err}") from err
        return columns, _parquet_rows(path, None), []
    if suffix in JSONL_SUFFIXES:
        records, bad = _read_jsonl(path)
        return sorted({key for _, rec in records for key in rec}), records, bad
    raise DataError(
        f"cannot read {spec!r}: unknown suffix {path.suffix!r}; use one of "
        f"{', '.join(PARQUET_SUFFIXES + JSONL_SUFFIXES)}, a save_to_disk directory or hf:org/name"
    )


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
    columns, rows, bad = _raw_rows(spec)
    layout = _choose_layout("auto", columns, question_key=question_key, path=Path(spec))
    chosen = pick_column(columns, column, spec=spec, question_key=question_key)
    from exgrpo.data.hf_datasets import is_dataset_spec, source_name

    source = source_name(spec) if is_dataset_spec(spec) else Path(spec).stem
    keep = {*_LAYOUT_COLUMNS[layout], question_key, answer_key}
    pairs: list[tuple[Prompt, str]] = []
    unsolved: list[BadRow] = []
    seen: set[str] = set()
    n = len(bad)
    for row, record in rows:
        n += 1
        try:  # the layout's own columns only, an answer optional: a solution needs no gold answer
            prompt = to_prompt(
                {k: v for k, v in record.items() if k in keep},
                row=row,
                layout=layout,
                source=source,
                question_key=question_key,
                answer_key=answer_key,
                for_reward_fn=True,
            )
        except RowError as err:
            bad.append(BadRow(row, str(err)))
            continue
        if prompt.qid in seen:
            bad.append(BadRow(row, f"duplicate qid {prompt.qid!r}"))
            continue
        seen.add(prompt.qid)
        text = solution_text(record.get(chosen))
        if not text:
            unsolved.append(BadRow(row, f"no solution in column {chosen!r} (qid {prompt.qid})"))
            continue
        pairs.append((prompt, text))
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
