"""Worked solutions from a data file, for the supervised cold start (`python -m exgrpo.cold_start`).

`read_solutions(spec)` reads a parquet / JSON-lines file, a `save_to_disk` directory or an `hf:` dataset as a run
reads it (`exgrpo.data.readers.read_prompts`, docs/data.md: the layout decides the question, the qid and the data
source; a row that is no prompt is a bad row, skipped and counted; a gold answer is not needed) and pairs each
prompt with the text of its row's solution column: `column`, else the first of `SOLUTION_COLUMNS` the file has (a
`DataError` naming the columns found when none). A solution is a non-empty string, or chat messages (openr1's
`target`), whose last assistant message is taken. Rows without a solution are counted and skipped
(`on_bad_row="skip"`) or refused (`"error"`), never dropped silently. Tests:
tests/learners/test_cold_start_rows.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core.records import Prompt
from exgrpo.data.errors import DataError
from exgrpo.data.readers import JSONL_SUFFIXES, PARQUET_SUFFIXES, BadRow, read_prompts

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
