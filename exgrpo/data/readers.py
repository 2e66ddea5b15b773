"""Dataset readers: parquet and JSON-lines files (or, through `exgrpo.data.hf_datasets`, `datasets` folders and
`hf:` specs) into `Prompt` records (pyarrow + stdlib only).

Layouts (`openr1`, `verl`, `plain`; `layout="auto"` picks one by column names), question ids and the rows kept
for a custom reward are docs/data.md's ("Layouts", "Question ids", "Extra columns and custom rewards").
Invariant: nothing is dropped silently: a bad row or a duplicate qid is reported in `ReadResult.skipped` or raised
as a `DataError` naming the rows (docs/data.md, "Bad rows"). Tests: tests/exgrpo/data/test_data.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from exgrpo.core.fileio import atomic_write, atomic_write_text
from exgrpo.core.records import Prompt
from exgrpo.data.errors import DataError
from exgrpo.data.rows import Layout, RowError, to_prompt

LayoutArg = Literal["auto", "plain", "verl", "openr1"]
BadRowPolicy = Literal["skip", "error"]

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_MAX_LISTED = 5  # bad rows named in an error message


@dataclass(frozen=True)
class BadRow:
    """One row that could not become a Prompt, with a human-readable reason."""

    row: int  # 0-based row number in the file
    reason: str


@dataclass(frozen=True)
class ReadResult:
    """The prompts read from one file and the rows that were skipped."""

    prompts: tuple[Prompt, ...]
    skipped: tuple[BadRow, ...]
    layout: Layout = "plain"  # the layout the rows were read with (after auto-detection)


# --------------------------------------------------------------------------- reading


def read_prompts(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    layout: LayoutArg = "auto",
    on_bad_row: BadRowPolicy = "skip",
    source_name: str | None = None,
    for_reward_fn: bool = False,
) -> ReadResult:
    """Read a parquet or JSON-lines file into prompts; the layouts are docs/data.md's ("Layouts").

    Raises `DataError` for an unknown suffix, a missing file, a layout that does not fit the
    columns, a file with no valid row, or (with `on_bad_row="error"`) any bad row.
    """
    from exgrpo.data import hf_datasets

    spec, path = str(path), Path(path)
    if on_bad_row not in ("skip", "error"):
        raise DataError(f"on_bad_row={on_bad_row!r} must be 'skip' or 'error'")
    dataset = hf_datasets.is_dataset_spec(spec)  # a save_to_disk directory or hf:org/name (datasets)
    if not dataset and not path.is_file():
        raise DataError(f"dataset file {spec!r} does not exist{_builder_hint(path)}")
    source = source_name or (hf_datasets.source_name(spec) if dataset else path.stem)
    suffix = path.suffix.lower()
    bad: list[BadRow] = []
    rows: Iterable[tuple[int, dict[str, Any]]]
    if dataset:
        columns, rows = hf_datasets.load_rows(spec)
        chosen = _choose_layout(layout, columns, question_key=question_key, path=path)
    elif suffix in PARQUET_SUFFIXES:
        try:
            columns = pq.read_schema(path).names
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            raise DataError(f"{str(path)!r} is not a readable parquet file: {err}") from err
        chosen = _choose_layout(layout, columns, question_key=question_key, path=path)
        needed = None if for_reward_fn else _needed_columns(chosen, columns)
        rows = _parquet_rows(path, needed)
    elif suffix in JSONL_SUFFIXES:
        records, bad = _read_jsonl(path)
        if not records:
            detail = f": {_bad_rows_message(path, bad, len(bad))}" if bad else ""
            raise DataError(f"{str(path)!r} holds no JSON record{detail}")
        columns = sorted({key for _, rec in records for key in rec})
        chosen = _choose_layout(layout, columns, question_key=question_key, path=path)
        rows = records
    else:
        raise DataError(
            f"cannot read {str(path)!r}: unknown suffix {path.suffix!r}; "
            f"use one of {', '.join(PARQUET_SUFFIXES + JSONL_SUFFIXES)}"
        )

    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    n_rows = len(bad)
    for row, record in rows:
        n_rows += 1
        try:
            prompt = to_prompt(
                record,
                row=row,
                layout=chosen,
                source=source,
                question_key=question_key,
                answer_key=answer_key,
                for_reward_fn=for_reward_fn,
            )
        except RowError as err:
            bad.append(BadRow(row, str(err)))
            continue
        if prompt.qid in seen:
            bad.append(BadRow(row, f"duplicate qid {prompt.qid!r} (first seen in row {seen[prompt.qid]})"))
            continue
        seen[prompt.qid] = row
        prompts.append(prompt)

    bad.sort(key=lambda b: b.row)
    if bad and on_bad_row == "error":
        raise DataError(
            _bad_rows_message(path, bad, n_rows)
            + "; to skip them with a count, set data.on_bad_row=skip (read_prompts(on_bad_row='skip'))"
        )
    if not prompts:
        detail = f": {_bad_rows_message(path, bad, n_rows)}" if bad else ""
        raise DataError(f"{str(path)!r} holds no valid prompt ({n_rows} rows, layout {chosen}){detail}")
    return ReadResult(prompts=tuple(prompts), skipped=tuple(bad), layout=chosen)


def _builder_hint(path: Path) -> str:
    """For a missing file named as one the benchmark builder writes: the command that writes it."""
    from exgrpo.data.benchmarks import BY_NAME

    if path.stem not in BY_NAME:
        return ""
    return (
        f"; `python -m exgrpo.data.benchmarks --out {path.parent} --only {path.stem}` writes it "
        '(docs/data.md, "The paper\'s benchmarks")'
    )


def _bad_rows_message(path: Path, bad: Sequence[BadRow], n_rows: int) -> str:
    listed = "; ".join(f"row {b.row}: {b.reason}" for b in bad[:_MAX_LISTED])
    more = f"; and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
    return f"{len(bad)} of {n_rows} rows in {str(path)!r} are malformed: {listed}{more}"


def _choose_layout(layout: LayoutArg, columns: Sequence[str], *, question_key: str, path: Path) -> Layout:
    """The layout asked for (checked against the columns), or the one the columns imply."""
    cols = set(columns)
    needs: dict[Layout, str] = {
        "openr1": "'problem', or 'prompt' and 'target'",
        "verl": "'prompt' and 'reward_model'",
        "plain": f"{question_key!r}",
    }
    fits: dict[Layout, bool] = {
        "openr1": ("prompt" in cols and "target" in cols) or ("problem" in cols and question_key not in cols),
        "verl": "prompt" in cols and "reward_model" in cols,
        "plain": question_key in cols,
    }
    if layout == "auto":
        for name in ("openr1", "verl", "plain"):
            if fits[name]:
                return name
        raise DataError(
            f"cannot detect the layout of {str(path)!r} from its columns {sorted(cols)}: "
            f"plain needs {needs['plain']} (set question_key/answer_key), verl needs {needs['verl']}, "
            f"openr1 needs {needs['openr1']}"
        )
    if layout not in fits:
        raise DataError(f"layout={layout!r} is not one of auto, plain, verl, openr1")
    if not fits[layout] and not (layout == "openr1" and "problem" in cols):
        raise DataError(
            f"{str(path)!r} does not fit layout {layout!r}: it needs columns {needs[layout]}, "
            f"the file has {sorted(cols)}"
        )
    return layout


_LAYOUT_COLUMNS: dict[Layout, tuple[str, ...]] = {
    # openr1 keeps `target` (the long reference solutions): a row whose gold is null falls back to it, in
    # parquet as in JSON lines
    "openr1": (
        "problem",
        "answer",
        "prompt",
        "reward_model",
        "target",
        "data_source",
        "extra_info",
        "qid",
        "id",
    ),
    "verl": ("prompt", "reward_model", "data_source", "extra_info", "qid", "id"),
    "plain": ("data_source", "extra_info", "qid", "id"),
}


def _needed_columns(layout: Layout, columns: Sequence[str]) -> list[str] | None:
    """Parquet columns to load: those the layout reads (all of them for plain files)."""
    if layout == "plain":
        return None  # question_key/answer_key are user-chosen; plain files are small
    wanted = set(_LAYOUT_COLUMNS[layout])
    return [c for c in columns if c in wanted]


def _parquet_rows(path: Path, columns: list[str] | None) -> Iterator[tuple[int, dict[str, Any]]]:
    row = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096, columns=columns):
            for record in batch.to_pylist():
                yield row, record
                row += 1
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:  # corrupt pages can hold invalid UTF-8
        raise DataError(f"{str(path)!r}: parquet data unreadable at row {row} or after: {err}") from err


def _read_jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    """JSON lines (row = 0-based line index); a `.json` file holding one array is also accepted.

    Lines are split on "\\n" only (a JSON string may hold U+2028 and other line separators); a line
    that is not UTF-8, not JSON, nested too deeply or not an object is a bad row.
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {str(path)!r}: {err}") from err
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
        data = data[3:]
    if path.suffix.lower() == ".json" and data.lstrip().startswith(b"["):
        try:
            items = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DataError(f"{str(path)!r} is not UTF-8 text: {err}") from err
        except json.JSONDecodeError as err:
            raise DataError(f"{str(path)!r} is not valid JSON: {err}") from err
        except RecursionError as err:
            raise DataError(f"{str(path)!r}: JSON nested too deeply to read") from err
        good, bad = [], []
        for row, item in enumerate(items):
            if isinstance(item, dict):
                good.append((row, item))
            else:
                bad.append(BadRow(row, f"expected a JSON object, got {type(item).__name__}"))
        return good, bad
    good, bad = [], []
    for row, raw in enumerate(data.split(b"\n")):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            bad.append(BadRow(row, f"line {row + 1} is not UTF-8 text (byte {err.start})"))
            continue
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            bad.append(BadRow(row, f"invalid JSON on line {row + 1}: {err.msg} at column {err.colno}"))
            continue
        except RecursionError:
            bad.append(BadRow(row, f"JSON on line {row + 1} is nested too deeply"))
            continue
        if not isinstance(item, dict):
            bad.append(BadRow(row, f"expected a JSON object on line {row + 1}, got {type(item).__name__}"))
            continue
        good.append((row, item))
    return good, bad


# --------------------------------------------------------------------------- writing


def write_prompts(prompts: Iterable[Prompt], path: str | Path) -> Path:
    """Write prompts in the plain layout (columns qid, question, answer, data_source).

    `read_prompts` gives the same records back. The format follows the suffix like the reader; the
    file is written under a temporary name and renamed into place (`exgrpo.core.fileio`).
    """
    path = Path(path)
    rows = [
        {"qid": p.qid, "question": p.question, "answer": p.answer, "data_source": p.data_source}
        for p in prompts
    ]
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        schema = pa.schema([(name, pa.string()) for name in ("qid", "question", "answer", "data_source")])
        table = pa.Table.from_pylist(rows, schema=schema)
        return atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    if suffix in JSONL_SUFFIXES:
        return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    raise DataError(
        f"cannot write {str(path)!r}: unknown suffix {path.suffix!r}; "
        f"use one of {', '.join(PARQUET_SUFFIXES + JSONL_SUFFIXES)}"
    )
