"""A run directory works from any directory: the command line's start makes `data.*`, `model.path` and a file
`reward.fn` absolute, and copies a reward file into the run directory (`reward/`) for the run and its config.yaml
to point at (the Python API's callable travels in the config already). Before: config.yaml kept
`my_rewards.py:score` and `train.jsonl` as typed, so `--resume` and `--like-run` failed elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

from exgrpo.core.config_files import load_config
from exgrpo.runtime.preflight import check_data, check_reward
from exgrpo.runtime.run_dir import self_contained

REWARD = "def score(prompt, completion, fields):\n    return float(len(completion) < 8)\n"


def _project(root: Path) -> None:
    root.mkdir()
    (root / "my_rewards.py").write_text(REWARD)
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_start_points_its_config_at_absolute_paths_and_a_copied_reward(tmp_path, monkeypatch):
    here = tmp_path / "proj"
    _project(here)
    monkeypatch.chdir(here)
    cfg = load_config(
        "tiny-cpu",
        [
            "reward.fn=my_rewards.py:score",
            "data.train=train.jsonl",
            "data.eval=train.jsonl",
            "logging.run_dir=runs/x",
        ],
    )
    new, made = self_contained(cfg)
    run_dir = (here / "runs" / "x").resolve()
    assert made == run_dir
    assert new.reward.fn == f"{run_dir}/reward/my_rewards.py:score"
    assert (run_dir / "reward" / "my_rewards.py").read_text() == REWARD
    assert new.data.train == new.data.eval == str(here / "train.jsonl")
    assert new.model.path == "builtin:tiny" and new.logging.run_dir == "runs/x"
    monkeypatch.chdir(tmp_path)  # elsewhere: the config still reads
    assert "imports and takes" in check_reward(new) and "8 train / 8 eval" in check_data(new)
    monkeypatch.chdir(here)
    again, made_again = self_contained(new)  # a config already self-contained is left as it is
    assert again == new and made_again is None


def test_a_reward_that_imports_its_siblings_is_kept_where_it_is(tmp_path, monkeypatch):
    here = tmp_path / "proj"
    _project(here)
    (here / "helpers.py").write_text("LIMIT = 8\n")
    (here / "my_rewards.py").write_text("import helpers\n\n" + REWARD)
    monkeypatch.chdir(here)
    cfg = load_config("tiny-cpu", ["reward.fn=my_rewards.py:score", "logging.run_dir=runs/y"])
    new, made = self_contained(cfg)
    assert new.reward.fn == f"{here / 'my_rewards.py'}:score" and made is None  # absolute, not copied
