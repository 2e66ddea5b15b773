"""The Python API's run directory works from any directory, as the command line's (`self_contained`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import exgrpo
from exgrpo.runtime import recipe

REWARD = "def score(prompt, completion, fields):\n    return 1.0\n"


def test_a_reward_file_is_copied_into_the_run_and_data_paths_are_absolute(tmp_path, monkeypatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_rewards.py").write_text(REWARD)
    (project / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    monkeypatch.chdir(project)
    seen = {}

    def fake_train(cfg, **_: object) -> str:
        seen["cfg"] = cfg
        return "trained"

    monkeypatch.setattr(recipe, "train", fake_train)
    run_dir = tmp_path / "runs" / "r1"
    out = exgrpo.train(
        "tiny-cpu",
        overrides=[f"logging.run_dir={run_dir}", "reward.fn=my_rewards.py:score", "data.train=train.jsonl"],
    )
    assert out == "trained"
    cfg = seen["cfg"]
    copied = Path(cfg.reward.fn.rpartition(":")[0])
    assert copied.is_absolute() and copied.parent == run_dir / "reward" and copied.read_text() == REWARD
    assert cfg.data.train == str(project / "train.jsonl")


def test_a_refused_start_removes_the_directory_made_for_the_reward_copy(tmp_path, monkeypatch) -> None:
    from exgrpo.core.config import ConfigError

    (tmp_path / "my_rewards.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)

    def refuse(cfg, **_: object) -> None:
        raise ConfigError("refused")

    monkeypatch.setattr(recipe, "train", refuse)
    run_dir = tmp_path / "runs" / "r2"
    with pytest.raises(ConfigError, match="refused"):
        exgrpo.train("tiny-cpu", overrides=[f"logging.run_dir={run_dir}", "reward.fn=my_rewards.py:score"])
    assert not run_dir.exists()
