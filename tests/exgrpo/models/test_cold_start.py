"""The supervised cold start (exgrpo/models/cold_start.py) and its command line (exgrpo/cold_start.py): prompt tokens are
never trained on, the builtin tiny model learns its worked solutions, the model directory it writes loads, and bad
input is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from exgrpo.cold_start import main
from exgrpo.data.tasks import ArithTask
from exgrpo.models.cold_start import ColdStartSpec, cold_start, training_rows
from exgrpo.models.resolve import resolve_model
from exgrpo.models.sft import pad_rows

torch.set_num_threads(1)


def test_spec_errors_are_listed_together() -> None:
    with pytest.raises(ValueError, match="steps=0 must be >= 1; lr=0 must be > 0"):
        ColdStartSpec(steps=0, lr=0).check()


def test_the_tiny_model_learns_its_worked_solutions(tmp_path: Path) -> None:
    base = resolve_model("builtin:tiny", cache_dir=str(tmp_path / "cache"))
    task = ArithTask()
    prompts = task.make_split(split="train", n=4, seed=0)
    spec = ColdStartSpec(steps=30, batch_size=4, lr=3e-3, warmup_steps=0, autocast="off")
    lines: list[str] = []
    record = cold_start(
        base,
        tmp_path / "cold",
        prompts=prompts,
        solution=task.solution_text,
        template="plain",
        spec=spec,
        log=lines.append,
    )
    assert record["train_prompts"] == 4 and len(record["losses"]) == 30
    assert record["losses"][-1] < 0.25 * record["losses"][0], record["losses"]
    assert "computing in float32 (learners.autocast=off)" in lines[0]
    assert json.loads((tmp_path / "cold" / "cold_start.json").read_text())["losses"] == record["losses"]
    # the written directory is a complete model: its loss on the same solutions is the trained one, not the base's
    tok = AutoTokenizer.from_pretrained(tmp_path / "cold")
    batch = pad_rows(
        training_rows(tok, prompts, task.solution_text, "plain"), tok.pad_token_id
    ).model_inputs()
    with torch.no_grad():
        trained = AutoModelForCausalLM.from_pretrained(tmp_path / "cold")(**batch).loss.item()
        untrained = AutoModelForCausalLM.from_pretrained(base)(**batch).loss.item()
    assert trained < 0.25 * untrained


def test_the_command_refuses_bad_input_before_any_work(tmp_path: Path, capsys) -> None:
    (tmp_path / "taken").mkdir()
    assert main(["--out", str(tmp_path / "taken")]) == 2
    assert "exists (pass --overwrite" in capsys.readouterr().err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n')
    assert main(["--out", str(tmp_path / "new"), f"data.train={rows}"]) == 2
    err = (
        capsys.readouterr().err
    )  # a file's rows need a solution column (tests/exgrpo/models/test_cold_start_rows.py)
    assert "has no solution column: its columns are ['answer', 'question']" in err
    assert main(["--out", str(tmp_path / "new"), "--steps", "0"]) == 2
    assert "steps=0 must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
