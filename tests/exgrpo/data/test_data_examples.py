"""docs/data.md's example files: made by docs/data/make_examples.py, and read by the project's reader into
the prompts the page says they give."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from exgrpo.data.readers import DataError, read_prompts
from exgrpo.data.tasks import BUILTIN_TASKS

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "data"
PAGE = ROOT / "docs" / "data.md"

PLAIN = [
    ("plain:0", "What is 7 + 5?", "12", "plain"),
    ("plain:1", "What is 9 * 8?", "72", "plain"),
    ("squares-6", "What is 6 squared?", "36", "squares"),
]
VERL = [("verl:0", "What is 7 + 5?", "12", "arith-demo"), ("verl:1", "What is 9 * 8?", "72", "arith-demo")]
OPENR1 = [
    ("openr1:17", "Find x if 2x + 3 = 11.", "4", "openr1-demo"),
    ("openr1:42", "What is the sum of the first 5 positive integers?", "15", "openr1-demo"),
]
OPENR1_RAW = [
    ("openr1-raw:0", "Find x if 3x = 12.", "4", "openr1-raw"),
    ("openr1-raw:1", "How many sides does a hexagon have?", "6", "openr1-raw"),
]
KEYS = {"question_key": "problem_text", "answer_key": "solution"}
# file -> (reader options, layout, prompts as (qid, question, answer, data_source), skipped rows)
EXPECTED = {
    "plain.jsonl": ({}, "plain", PLAIN, []),
    "plain.parquet": ({}, "plain", PLAIN, []),
    "plain-keys.jsonl": (
        KEYS,
        "plain",
        [
            ("plain-keys:0", "What is 12 - 5?", "7", "plain-keys"),
            ("plain-keys:1", "What is 100 / 4?", "25", "plain-keys"),
        ],
        [],
    ),
    "verl.jsonl": ({}, "verl", VERL, []),
    "verl.parquet": ({}, "verl", VERL, []),
    "openr1.jsonl": ({}, "openr1", OPENR1, []),
    "openr1.parquet": ({}, "openr1", OPENR1, []),
    "openr1-raw.jsonl": ({}, "openr1", OPENR1_RAW, []),
    "openr1-raw.parquet": ({}, "openr1", OPENR1_RAW, []),
    "bad-rows.jsonl": (
        {},
        "plain",
        [("a", "What is 2 + 2?", "4", "bad-rows"), ("c", "What is 4 + 4?", "8", "bad-rows")],
        [1, 3, 5],
    ),
}


def _script():
    spec = importlib.util.spec_from_file_location("make_examples", DOCS / "make_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_examples_are_what_the_script_makes(tmp_path):
    made = _script().write_examples(tmp_path)
    assert sorted(p.name for p in made) == sorted(p.name for p in DOCS.iterdir() if p.suffix != ".py")
    for path in made:
        checked_in = DOCS / path.name
        if path.suffix == ".parquet":  # compared as tables: the bytes also carry the writer's version
            assert pq.read_table(checked_in).equals(pq.read_table(path)), path.name
        else:
            assert checked_in.read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_example_reads_as_documented(name):
    options, layout, prompts, skipped = EXPECTED[name]
    result = read_prompts(DOCS / name, **options)
    assert result.layout == layout
    assert [(p.qid, p.question, p.answer, p.data_source) for p in result.prompts] == prompts
    assert [b.row for b in result.skipped] == skipped


def test_bad_rows_fail_with_error():
    with pytest.raises(
        DataError, match=r"3 of 5 rows in '.*bad-rows.jsonl' are malformed: row 1: missing answer"
    ):
        read_prompts(DOCS / "bad-rows.jsonl", on_bad_row="error")


def test_the_page_shows_every_example_and_every_builtin_task():
    text = PAGE.read_text(encoding="utf-8")
    assert set(EXPECTED) == {p.name for p in DOCS.iterdir() if p.suffix != ".py"}
    for name in EXPECTED:
        assert f"`docs/data/{name}`" in text, name
    # each jsonl example is shown as it is
    for name in (n for n in EXPECTED if n.endswith(".jsonl")):
        assert (DOCS / name).read_text(encoding="utf-8").strip() in text, name
    table = text.split("## Builtin tasks", 1)[1]
    assert set(re.findall(r"^\| `builtin:([a-z0-9-]+)` \|", table, flags=re.M)) == set(BUILTIN_TASKS)
    extra = text.split("## Extra columns and custom rewards", 1)[1]
    assert "reward.fn" in extra and "docs/rewards.md" in extra and "fields" in extra
