"""`python -m exgrpo.evaluate`'s output file, `--like-run` on an interrupted run, `--max-tokens` past the
model's context, and the benchmark count the docs give (issue 43)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from exgrpo.evaluate import main

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model", "builtin:tiny", "--data", "builtin:arith", "--num", "2", "--n", "1", "--max-tokens", "4"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def test_a_second_evaluation_writes_a_new_file_and_says_where(cache_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*TINY, "--cache-dir", cache_dir]) == 0
    first = Path("eval-tiny-arith.json")  # where it ran: a builtin model's directory is in the cache
    assert first.is_file() and not list(Path(cache_dir).rglob("eval-*.json"))
    before = first.read_text()
    capsys.readouterr()
    assert main([*TINY, "--cache-dir", cache_dir, "--seed", "1"]) == 0
    err = capsys.readouterr().err
    second = first.with_name("eval-tiny-arith-2.json")
    assert first.read_text() == before and json.loads(second.read_text())["seed"] == 1  # the first one kept
    assert f"wrote {second}" in err and f"{first} holds an earlier evaluation" in err and "--overwrite" in err
    assert main([*TINY, "--cache-dir", cache_dir, "--overwrite"]) == 0
    assert (
        f"wrote {first}" in capsys.readouterr().err and not first.with_name("eval-tiny-arith-3.json").exists()
    )


def test_an_existing_out_file_is_refused_before_the_model_loads(cache_dir, tmp_path, capsys):
    out = tmp_path / "res.json"
    out.write_text("{}")
    assert main([*TINY, "--cache-dir", cache_dir, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} exists" in err and "--overwrite" in err and "evaluating" not in err
    assert out.read_text() == "{}"
    assert main([*TINY, "--cache-dir", cache_dir, "--out", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["n"] == 1


def test_num_cuts_a_file_to_its_first_rows(cache_dir, tmp_path, capsys):
    """Before: `--num 8` on a 20-row file evaluated 20 questions; a run's --like-run keeps every row."""
    data = tmp_path / "q20.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(20))
    )
    out = tmp_path / "e.json"
    argv = ["--model", "builtin:tiny", "--data", str(data), "--num", "8", "--n", "1", "--max-tokens", "2",
            "--cache-dir", cache_dir, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "evaluating the first 8 of 20 questions (--num 8)" in capsys.readouterr().err
    payload = json.loads(out.read_text())
    assert payload["overall"]["questions"] == 8 and payload["rows"]["evaluated"] == 8
    assert main([*argv[:4], "--num", "50", *argv[6:], "--overwrite"]) == 0  # more than the file: every row
    assert json.loads(out.read_text())["overall"]["questions"] == 20


def _interrupted_run(tmp_path: Path, cache_dir: str, *, checkpoint: bool) -> Path:
    from exgrpo.models.resolve import resolve_model

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"model:\n  path: builtin:tiny\n  cache_dir: {cache_dir}\n  max_response_len: 4\n"
        "data:\n  train: builtin:arith\n  num_eval: 2\ntrainer:\n  steps: 8\n  eval_samples: 1\n"
    )
    (run / "run.json").write_text("{}")
    if checkpoint:
        ckpt = run / "checkpoints" / "step-000003"
        shutil.copytree(resolve_model("builtin:tiny", cache_dir=cache_dir), ckpt / "model")
        (ckpt / "driver.json").write_text("{}")
    return run


def test_like_run_on_an_interrupted_run_names_its_latest_checkpoint(cache_dir, tmp_path, capsys):
    run = _interrupted_run(tmp_path, cache_dir, checkpoint=True)
    assert main(["--like-run", str(run), "--cache-dir", cache_dir]) == 2
    err = capsys.readouterr().err
    model = run / "checkpoints" / "step-000003" / "model"
    assert "stopped after step 3 of 8" in err and f"--like-run {run} --model {model}" in err, err
    assert "does not exist" not in err
    assert main(["--like-run", str(run), "--model", str(model), "--cache-dir", cache_dir, "--out",
                 str(tmp_path / "e.json")]) == 0  # fmt: skip
    bare = _interrupted_run(tmp_path / "b", cache_dir, checkpoint=False)
    assert main(["--like-run", str(bare), "--cache-dir", cache_dir]) == 2
    assert "has no final model and no checkpoint" in capsys.readouterr().err


def test_max_tokens_past_the_context_is_capped_with_a_message(cache_dir, tmp_path, capfd):
    out = tmp_path / "e.json"
    argv = ["--model", "builtin:tiny", "--data", "builtin:arith", "--num", "1", "--n", "1", "--temperature", "0",
            "--max-tokens", "100000", "--cache-dir", cache_dir, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    err = capfd.readouterr().err
    capped = json.loads(out.read_text())["max_tokens"]
    assert capped < 256 and re.search(
        rf"--max-tokens 100000 is more than .*context.*: capped to {capped}", err
    )
    assert "exceeded the model's predefined maximum length" not in err  # transformers' warning


def test_the_docs_count_the_benchmark_files_there_are():
    from exgrpo.data.benchmarks import EVAL_NAMES, SOURCES

    words = {9: "nine", 10: "ten"}
    assert (len(EVAL_NAMES), len(SOURCES)) == (9, 10)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "exgrpo" / "evaluate.py",
                 ROOT / "exgrpo" / "evaluation" / "paper.py"]:  # fmt: skip
        text = " ".join(path.read_text().split())
        assert not re.search(r"\beight (evaluation files|benchmarks|files)\b|evaluates eight", text), path
    data_md = " ".join((ROOT / "docs" / "data.md").read_text().split())
    assert (
        f"{words[len(EVAL_NAMES)]} evaluation files" in data_md
        and f"the {words[len(SOURCES)]} files" in data_md
    )
