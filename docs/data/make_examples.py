"""Writes the example dataset files of docs/data.md, one per layout and format, into this directory.

    python docs/data/make_examples.py [--out DIR]

The rows are declared once here; every `.jsonl` and `.parquet` file beside this script is made from
them (a test makes them again and compares, and reads each one with the project's reader).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def _chat(*messages: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in messages]


# file stem -> rows; each is written as <stem>.jsonl and <stem>.parquet unless listed in JSONL_ONLY
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    # plain: a question column and an answer column (data.question_key / data.answer_key)
    "plain": [
        {"question": "What is 7 + 5?", "answer": "12"},
        {"question": "What is 9 * 8?", "answer": "72"},
        {"qid": "squares-6", "question": "What is 6 squared?", "answer": "36", "data_source": "squares"},
    ],
    # plain with columns of other names: data.question_key=problem_text data.answer_key=solution
    "plain-keys": [
        {"problem_text": "What is 12 - 5?", "solution": "7"},
        {"problem_text": "What is 100 / 4?", "solution": "25"},
    ],
    # verl: chat messages in `prompt`, the gold answer in reward_model.ground_truth
    "verl": [
        {
            "data_source": "arith-demo",
            "prompt": _chat(("system", "Put the final answer in \\boxed{}."), ("user", "What is 7 + 5?")),
            "reward_model": {"style": "rule", "ground_truth": "12"},
            "extra_info": {"index": 0},
        },
        {
            "data_source": "arith-demo",
            "prompt": _chat(("user", "What is 9 * 8?")),
            "reward_model": {"style": "rule", "ground_truth": "72"},
            "extra_info": {"index": 1},
        },
    ],
    # openr1: verl-style with `target`, a reference solution (OpenR1-Math-46k as the paper uses it)
    "openr1": [
        {
            "data_source": "openr1-demo",
            "prompt": _chat(("user", "Find x if 2x + 3 = 11.")),
            "target": _chat(("assistant", "2x = 8, so x = 4. The answer is \\boxed{4}.")),
            "reward_model": {"style": "rule", "ground_truth": "4"},
            "extra_info": {"index": 17},
        },
        {
            "data_source": "openr1-demo",
            "prompt": _chat(("user", "What is the sum of the first 5 positive integers?")),
            "target": _chat(("assistant", "1 + 2 + 3 + 4 + 5 = 15, so \\boxed{15}.")),
            "reward_model": {"style": "rule", "ground_truth": "15"},
            "extra_info": {"index": 42},
        },
    ],
    # openr1 as first released: `problem` and `answer` columns
    "openr1-raw": [
        {"problem": "Find x if 3x = 12.", "answer": "4"},
        {"problem": "How many sides does a hexagon have?", "answer": "6"},
    ],
}
JSONL_ONLY = ("plain-keys",)

# Rows a reader must turn down: 1 missing answer, 3 not JSON, 5 a duplicate qid (4 is blank: no row).
BAD_ROWS_JSONL = "\n".join(
    [
        '{"qid": "a", "question": "What is 2 + 2?", "answer": "4"}',
        '{"qid": "b", "question": "What is 3 + 3?"}',
        '{"qid": "c", "question": "What is 4 + 4?", "answer": 8}',
        "this line is not JSON",
        "",
        '{"qid": "a", "question": "What is 5 + 5?", "answer": "10"}',
    ]
)


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a table with every column any row has (a row without one holds null there);
    `Table.from_pylist` alone would take the columns of the first row only."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows])


def write_examples(out: Path) -> list[Path]:
    """Every example file, written into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, rows in EXAMPLES.items():
        path = out / f"{stem}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        written.append(path)
        if stem not in JSONL_ONLY:
            path = out / f"{stem}.parquet"
            pq.write_table(_table(rows), path)
            written.append(path)
    path = out / "bad-rows.jsonl"
    path.write_text(BAD_ROWS_JSONL + "\n", encoding="utf-8")
    return [*written, path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="target directory (default: docs/data)")
    for path in write_examples(parser.parse_args(argv).out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
