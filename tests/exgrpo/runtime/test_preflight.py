"""`--dry-run` checks what a start checks before Ray (the reward, the data, the model, LoRA's targets), and a
refused start leaves no run directory behind. Before: each of these dry runs said "fits" and exited 0."""

from __future__ import annotations

import pytest

from exgrpo import run
from exgrpo.core.config_files import load_config
from exgrpo.data.readers import DataError
from exgrpo.runtime import clusters


@pytest.fixture(autouse=True)
def _local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("EXGRPO_SKIP_RESOURCE_CHECK", raising=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.fn=/nope/reward.py:score", "reward.fn: no such file '/nope/reward.py'"),
        ("data.train=/nope/train.jsonl", "dataset file '/nope/train.jsonl' does not exist"),
        ("model.path=/nope/model", "model path '/nope/model' does not exist"),
        ("learners.lora_target_modules=[q_proj,nope_proj]", "nope_proj matches no module of"),
    ],
)
def test_dry_run_refuses_what_a_start_refuses(override, message, capsys):
    args = ["--dry-run", "--config", "tiny-cpu", override, "learners.lora_rank=4"]
    assert run.main(args) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "fits" not in captured.out


def test_dry_run_says_what_it_checked(capsys):
    assert run.main(["--dry-run", "--config", "tiny-cpu", "learners.lora_rank=4"]) == 0
    out = capsys.readouterr().out
    assert "reward: math" in out and "model: builtin:" in out and "fits a local cluster" in out
    assert "LoRA targets: q_proj, k_proj" in out or "LoRA targets: not checked" in out
    assert "data: " in out and " train / " in out


def test_dry_run_reads_bad_rows_as_the_start_does(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{oops\n')
    assert (
        run.main(["--dry-run", f"data.train={data}", "data.on_bad_row=error", "data.eval=" + str(data)]) == 2
    )
    err = capsys.readouterr().err
    assert "1 of 2 rows" in err and "set data.on_bad_row=skip" in err


def test_a_refused_start_leaves_no_run_directory(tmp_path):
    from exgrpo.runtime.recipe import train

    run_dir = tmp_path / "runs" / "refused"
    cfg = load_config("tiny-cpu", [f"logging.run_dir={run_dir}", "data.train=/nope/train.jsonl"])
    with pytest.raises(DataError, match="does not exist"):
        train(cfg)
    assert not run_dir.exists()  # before: config.yaml alone was left there
    kept = tmp_path / "mine"
    kept.mkdir()  # a directory the user made is left alone
    with pytest.raises(DataError):
        train(load_config("tiny-cpu", [f"logging.run_dir={kept}", "data.train=/nope/train.jsonl"]))
    assert kept.is_dir()


def test_local_cpus_are_the_ones_ray_would_offer(monkeypatch):
    """A 2-core container on a 48-core host: os.cpu_count() says 48, Ray (and the plan) 2."""
    import ray._private.utils as ray_utils

    monkeypatch.setattr("os.cpu_count", lambda: 48)
    monkeypatch.setattr(ray_utils, "get_num_cpus", lambda *a, **k: 2)
    assert clusters.local_cluster_cpus(load_config("tiny-cpu")) == 2
