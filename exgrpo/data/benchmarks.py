"""`python -m exgrpo.data.benchmarks --out DIR`: the ExGRPO paper's training set and nine evaluation files.

    python -m exgrpo.data.benchmarks --out data/paper                    # all ten, from the hub (or its cache)
    python -m exgrpo.data.benchmarks --out data/paper --only aime24 gpqa_diamond
    python -m exgrpo.data.benchmarks --out data/paper --from-dir local/  # local copies, one per source

Each source is a public hub dataset (`SOURCES`: id, config, split), read with `datasets.load_dataset`
(`HF_HOME`, `HF_TOKEN` and `HF_HUB_OFFLINE` honoured), and its rows go through a small per-source adapter to
the project's plain layout: `qid`, `question`, `answer`, `data_source` (docs/data.md). Multiple-choice sources
(ARC-c, GPQA-Diamond, MMLU-Pro) give the question followed by lettered options (`A. ...`) and the letter as the
answer. The training set is written as `openr1-math-46k.parquet`, each evaluation file as
`<data_source>.parquet`. The hub ids and column layouts were not checked against the hub from where this was
written (docs/data.md, "The paper's benchmarks").
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, Any]


class BenchmarkError(Exception):
    """A source that cannot be loaded or adapted (the CLI prints it and exits 2)."""


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text` (braces balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
        i += 1
    return None


def multiple_choice(question: str, options: list[str]) -> str:
    """The question followed by one lettered option a line: `A. ...`, `B. ...`."""
    if not 2 <= len(options) <= len(LETTERS):
        raise ValueError(f"{len(options)} options (2 to {len(LETTERS)} allowed)")
    lines = [f"{LETTERS[i]}. {str(o).strip()}" for i, o in enumerate(options)]
    return f"{question.strip()}\n\n" + "\n".join(lines)


def _text(value: Any) -> str:
    """An answer as text: a list (OlympiadBench's final answers) joined with ', '; numbers as written."""
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    return "" if value is None else str(value).strip()


# --------------------------------------------------------------------------- adapters: source row -> (q, a)


def _openr1(row: Row) -> tuple[str, str]:
    """Elliott/Openr1-Math-46k-8192 (LUFFY's layout): chat `prompt`, `reward_model.ground_truth`."""
    users = [m["content"] for m in row["prompt"] if m.get("role") == "user"]
    question = users[-1] if users else ""
    return question, _text((row.get("reward_model") or {}).get("ground_truth"))


def _problem_answer(row: Row) -> tuple[str, str]:
    """`problem` and `answer` (MATH-500, AIME 2025); AIME 2024's `solution` when there is no `answer`."""
    answer = row.get("answer")
    if answer is None and "solution" in row:
        solution = _text(row["solution"])
        answer = last_boxed(solution) or solution
    if answer is None:
        raise KeyError("answer")
    return row["problem"], _text(answer)


def _question_answer(row: Row) -> tuple[str, str]:
    """`question` and `answer` (AMC 2023, Minerva)."""
    return row["question"], _text(row["answer"])


def _olympiad(row: Row) -> tuple[str, str]:
    """Hothan/OlympiadBench: `question` and `final_answer` (a list of strings)."""
    return row["question"], _text(row["final_answer"])


def _arc(row: Row) -> tuple[str, str]:
    """allenai/ai2_arc: `question`, `choices` {`text`, `label`}, `answerKey` (a label, sometimes a digit)."""
    labels = [str(x) for x in row["choices"]["label"]]
    answer = LETTERS[labels.index(str(row["answerKey"]))]
    return multiple_choice(row["question"], list(row["choices"]["text"])), answer


def _gpqa(row: Row) -> tuple[str, str]:
    """Idavidrein/gpqa: `Question`, `Correct Answer`, `Incorrect Answer 1..3`; the four options in an order
    seeded by the question's text (the same on every build, the correct one not always first)."""
    question = row["Question"]
    options = [
        row["Correct Answer"],
        row["Incorrect Answer 1"],
        row["Incorrect Answer 2"],
        row["Incorrect Answer 3"],
    ]
    order = list(range(4))
    random.Random(hashlib.sha256(question.encode()).hexdigest()).shuffle(order)
    shuffled = [str(options[i]).strip() for i in order]
    return multiple_choice(question, shuffled), LETTERS[order.index(0)]


def _mmlu_pro(row: Row) -> tuple[str, str]:
    """TIGER-Lab/MMLU-Pro: `question`, `options` (up to ten), `answer` (a letter) or `answer_index`."""
    options = list(row["options"])
    answer = row.get("answer")
    letter = str(answer).strip() if answer not in (None, "") else LETTERS[int(row["answer_index"])]
    return multiple_choice(row["question"], options), letter


@dataclass(frozen=True)
class Source:
    """One benchmark: where it comes from on the hub and how its rows become question and answer."""

    name: str  # the data_source of its rows and its file's stem
    hub_id: str
    config: str | None
    split: str
    adapt: Callable[[Row], tuple[str, str]]
    columns: str  # the source columns the adapter reads (documentation and error messages)


TRAIN = "openr1-math-46k"
SOURCES: tuple[Source, ...] = (
    Source(
        TRAIN, "Elliott/Openr1-Math-46k-8192", None, "train", _openr1, "prompt, reward_model.ground_truth"
    ),
    Source(
        "aime24", "math-ai/aime24", None, "test", _problem_answer, "problem, solution (its last \\boxed{})"
    ),
    Source("aime25", "math-ai/aime25", None, "test", _problem_answer, "problem, answer"),
    Source("amc", "math-ai/amc23", None, "test", _question_answer, "question, answer"),
    Source("math500", "HuggingFaceH4/MATH-500", None, "test", _problem_answer, "problem, answer"),
    Source("minerva", "math-ai/minervamath", None, "test", _question_answer, "question, answer"),
    Source(
        "olympiad_bench",
        "Hothan/OlympiadBench",
        "OE_TO_maths_en_COMP",
        "train",
        _olympiad,
        "question, final_answer",
    ),
    Source(
        "arc_c", "allenai/ai2_arc", "ARC-Challenge", "test", _arc, "question, choices.text/label, answerKey"
    ),
    Source(
        "gpqa_diamond",
        "Idavidrein/gpqa",
        "gpqa_diamond",
        "train",
        _gpqa,
        "Question, Correct Answer, Incorrect Answer 1-3",
    ),
    Source("mmlu_pro", "TIGER-Lab/MMLU-Pro", None, "test", _mmlu_pro, "question, options, answer"),
)
BY_NAME = {s.name: s for s in SOURCES}
EVAL_NAMES = tuple(s.name for s in SOURCES if s.name != TRAIN)


def adapt_rows(source: Source, rows: list[Row]) -> tuple[list[Row], int]:
    """(the project's rows, how many rows were skipped for an empty question or answer). A row without a
    column the adapter needs is a `BenchmarkError` naming the source, the column and the columns present."""
    out: list[Row] = []
    skipped = 0
    for i, row in enumerate(rows):
        try:
            question, answer = source.adapt(row)
        except (KeyError, ValueError, IndexError, TypeError) as err:
            raise BenchmarkError(
                f"{source.name} ({source.hub_id}): row {i} does not fit the expected layout ({source.columns}): "
                f"{type(err).__name__}: {err}; its columns: {sorted(row)}"
            ) from None
        question = str(question or "").strip()
        if not question or not answer:
            skipped += 1
            continue
        out.append(
            {"qid": f"{source.name}-{i}", "question": question, "answer": answer, "data_source": source.name}
        )
    return out, skipped


def _local(source: Source, from_dir: Path) -> Any:
    """The source's local copy under `from_dir`: `<name>/` (a save_to_disk Dataset or DatasetDict with the
    source's split) or `<name>.parquet` / `.jsonl` / `.json`."""
    import datasets

    directory = from_dir / source.name
    if directory.is_dir():
        data = datasets.load_from_disk(str(directory))
        if isinstance(data, datasets.DatasetDict):
            if source.split not in data:
                raise BenchmarkError(f"{directory} holds the splits {list(data)}, not {source.split!r}")
            data = data[source.split]
        return data
    for suffix, builder in ((".parquet", "parquet"), (".jsonl", "json"), (".json", "json")):
        path = from_dir / f"{source.name}{suffix}"
        if path.is_file():
            return datasets.load_dataset(builder, data_files=str(path), split="train")
    raise BenchmarkError(
        f"{source.name}: no local copy in {from_dir} (a save_to_disk directory {source.name}/ or a file "
        f"{source.name}.parquet/.jsonl/.json)"
    )


def load_source(source: Source, from_dir: Path | None = None) -> list[Row]:
    """The source's raw rows: from `from_dir` when given, else `datasets.load_dataset(hub id, config, split)`."""
    try:
        import datasets

        if from_dir is not None:
            data = _local(source, from_dir)
        else:
            data = datasets.load_dataset(source.hub_id, source.config, split=source.split)
    except BenchmarkError:
        raise
    except Exception as err:  # offline and uncached, a missing repo, config or split: many kinds
        from huggingface_hub import constants

        where = f"local copy in {from_dir}" if from_dir is not None else f"hub dataset {source.hub_id!r}"
        config = (
            ""
            if from_dir is not None
            else f" ({f'config {source.config!r}, ' if source.config else ''}split {source.split!r})"
        )
        hint = (
            "; HF_HUB_OFFLINE is set and it is not in the cache "
            f"({constants.HF_HUB_CACHE}): download it first or give --from-dir"
            if from_dir is None and constants.HF_HUB_OFFLINE
            else ""
        )
        raise BenchmarkError(
            f"{source.name}: cannot load the {where}{config}: {type(err).__name__}: {err}{hint}"
        ) from None
    return list(data.to_list())


def write_rows(rows: list[Row], path: Path) -> None:
    """The rows as a parquet file (columns qid, question, answer, data_source), written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.string()) for c in COLUMNS]))
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


COLUMNS = ("qid", "question", "answer", "data_source")


def build(out: Path, names: list[str], from_dir: Path | None = None) -> dict[str, tuple[int, int]]:
    """Writes `out/<name>.parquet` for each source named; returns {name: (rows written, rows skipped)}."""
    counts: dict[str, tuple[int, int]] = {}
    for name in names:
        source = BY_NAME[name]
        rows, skipped = adapt_rows(source, load_source(source, from_dir))
        if not rows:
            raise BenchmarkError(f"{name}: no usable row ({skipped} skipped for an empty question or answer)")
        write_rows(rows, out / f"{name}.parquet")
        counts[name] = (len(rows), skipped)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exgrpo.data.benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the parquet files")
    p.add_argument(
        "--only",
        nargs="+",
        choices=[s.name for s in SOURCES],
        metavar="NAME",
        help=f"build only these ({', '.join(s.name for s in SOURCES)}) (default: all)",
    )
    p.add_argument(
        "--from-dir",
        metavar="DIR",
        help="read each source from DIR/<name>/ (save_to_disk) or DIR/<name>.parquet/.jsonl/.json instead of "
        "the hub (default: the hub, or its cache)",
    )
    args = p.parse_args(argv)
    names = args.only or [s.name for s in SOURCES]
    out = Path(args.out)
    try:
        counts = build(out, names, Path(args.from_dir) if args.from_dir else None)
    except BenchmarkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    width = max(len(n) for n in counts) + len(".parquet")
    for name, (rows, skipped) in counts.items():
        note = f"  ({skipped} skipped: empty question or answer)" if skipped else ""
        print(
            f"{name + '.parquet':<{width}}  {rows:>6} {'row ' if rows == 1 else 'rows'}  {BY_NAME[name].hub_id}{note}"
        )
    print(f"wrote {len(counts)} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
