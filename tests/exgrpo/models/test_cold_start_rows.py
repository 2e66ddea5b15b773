"""The cold start on the user's own rows (exgrpo/cold_start.py): a real parquet file's
solution column (named, or found: openr1's `target` messages), rows without a solution counted and skipped (or
refused), a clear error naming the columns when no column fits, the run's held-out questions refused, and the
tiny model fine-tuned on the file's solutions through the command line with the prompt tokens never trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from exgrpo.cold_start import main, read_solutions, solution_text
from exgrpo.data.errors import DataError
from exgrpo.data.tasks import builtin_task
from exgrpo.models.cold_start import training_rows
from exgrpo.models.sft import pad_rows

torch.set_num_threads(1)


def openr1_rows() -> list[dict]:
    def row(i: int, target: list[dict] | None) -> dict:
        return {
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "target": target,
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }

    rows = [
        row(i, [{"role": "assistant", "content": f"{i} + {i} = {2 * i}. \\boxed{{{2 * i}}}"}])
        for i in range(6)
    ]
    rows.append(row(6, None))  # no reference solution
    return rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_openr1_target_is_found_and_rows_without_a_solution_are_counted(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "openr1-mine.parquet", openr1_rows())
    found = read_solutions(str(path))
    assert found.column == "target" and found.layout == "openr1" and found.rows == 7
    assert [p.qid for p, _ in found.pairs] == [f"openr1-mine:{i}" for i in range(6)]
    assert found.pairs[2] == (found.pairs[2][0], "2 + 2 = 4. \\boxed{4}")
    assert len(found.unsolved) == 1 and found.unsolved[0].row == 6
    assert "6 of 7 rows with a solution in column 'target'" in found.summary(str(path))
    assert "skipped 1 without a solution (first: row 6: no solution in column 'target'" in found.summary(
        str(path)
    )
    with pytest.raises(DataError, match="data.on_bad_row=error"):
        read_solutions(str(path), on_bad_row="error")


def test_a_named_column_and_the_errors_that_name_the_columns(tmp_path: Path) -> None:
    rows = [{"question": "What is 2 + 3?", "worked": "2 + 3 = 5. \\boxed{5}"}, {"question": "What is 1 + 1?"}]
    path = write_parquet(tmp_path / "plain.parquet", rows)
    with pytest.raises(DataError, match=r"has no solution column: its columns are \['question', 'worked'\]"):
        read_solutions(str(path))
    with pytest.raises(DataError, match=r"has no column 'answer_text' \(--solution-column\); its columns"):
        read_solutions(str(path), column="answer_text")
    found = read_solutions(str(path), column="worked")  # no answer column: a solution needs no gold answer
    assert [t for _, t in found.pairs] == ["2 + 3 = 5. \\boxed{5}"] and len(found.unsolved) == 1
    empty = write_parquet(tmp_path / "empty.parquet", [{"question": "What is 1 + 1?", "solution": " "}])
    with pytest.raises(DataError, match="nothing to fine-tune on"):
        read_solutions(str(empty))
    assert solution_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": " s "}]) == "s"
    assert solution_text(None) == "" and solution_text(7) == ""


def test_the_command_fine_tunes_the_tiny_model_on_a_files_solutions(tmp_path: Path, capsys) -> None:
    path = write_parquet(tmp_path / "mine.parquet", openr1_rows())
    out = tmp_path / "cold"
    over = ["model.template=plain", "learners.autocast=off", f"model.cache_dir={tmp_path / 'cache'}"]
    argv = ["--config", "tiny-cpu", "--out", str(out), "--steps", "25", "--batch-size", "6", "--lr", "3e-3"]
    assert main([*argv, f"data.train={path}", *over]) == 0
    printed = capsys.readouterr().out
    assert (
        "6 of 7 rows with a solution in column 'target' (layout openr1); skipped 1 without a solution"
        in printed
    )
    record = json.loads((out / "cold_start.json").read_text())
    assert record["train_prompts"] == 6 and record["template"] == "plain"
    assert record["losses"][-1] < 0.5 * record["losses"][0], record["losses"]
    # the prompt is the run's template around the file's question; only the solution and eos carry labels
    tok = AutoTokenizer.from_pretrained(out)
    found = read_solutions(str(path))
    by_qid = {p.qid: t for p, t in found.pairs}
    rows = training_rows(tok, [p for p, _ in found.pairs], lambda p: by_qid[p.qid], "plain")
    labels = pad_rows(rows, tok.pad_token_id).labels
    for (head, tail), lab in zip(rows, labels.tolist(), strict=True):
        assert lab[: len(head)] == [-100] * len(head) and lab[len(head) : len(head) + len(tail)] == tail


def test_held_out_questions_and_a_builtin_task_with_a_column_are_refused(tmp_path: Path, capsys) -> None:
    held = builtin_task("builtin:arith").make_split(split="eval", n=16, seed=0)[0]
    rows = [
        {"question": held.question, "solution": "\\boxed{1}"},
        {"question": "What is 1 + 1?", "solution": "2"},
    ]
    path = write_parquet(tmp_path / "leak.parquet", rows)
    argv = ["--config", "tiny-cpu", "--out", str(tmp_path / "x")]
    assert (
        main([*argv, "--data", str(path)]) == 2
    )  # tiny-cpu trains on builtin:arith: its eval split is held out
    assert "1 of the rows of" in capsys.readouterr().err
    assert main([*argv, "--solution-column", "solution"]) == 2
    assert "data.train=builtin:arith is a builtin task" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_json_lines_pair_each_prompt_with_its_own_rows_solution(tmp_path: Path) -> None:
    lines = [
        '{"question": "What is 1 + 1?", "response": "1 + 1 = 2"}',
        "",  # a blank line is no row but shifts the row numbers after it
        "not JSON",
        '{"question": "", "response": "an empty question: a bad row"}',
        '{"question": "What is 2 + 2?", "response": "2 + 2 = 4"}',
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    found = read_solutions(str(path))
    assert found.column == "response" and len(found.bad) == 2
    assert [(p.qid, p.question, t) for p, t in found.pairs] == [
        ("mine:0", "What is 1 + 1?", "1 + 1 = 2"),
        ("mine:4", "What is 2 + 2?", "2 + 2 = 4"),
    ]
    assert "skipped 2 malformed" in found.summary(str(path))
