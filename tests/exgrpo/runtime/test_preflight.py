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


def test_dry_run_shows_every_preflight_error_not_only_the_first(capsys):
    """Before: only the reward's error was shown; the data and model errors came one dry run at a time."""
    args = [
        "--dry-run",
        "reward.fn=/nope/reward.py:score",
        "data.train=/nope/train.jsonl",
        "model.path=/nope/m",
    ]
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "3 pre-flight checks failed" in err
    for message in (
        "no such file '/nope/reward.py'",
        "'/nope/train.jsonl' does not exist",
        "'/nope/m' does not",
    ):
        assert f"  - {message}" in err or message in err
    assert err.count("error:") == 1


def test_a_plan_bigger_than_the_machine_says_it_oversubscribes_its_cores(monkeypatch, capsys):
    """Before: "fits a local cluster on this machine (3 logical CPUs)", silent about the 2 cores."""
    monkeypatch.setattr(clusters, "machine_cpus", lambda: 2)
    assert run.main(["--dry-run", "--config", "tiny-cpu", "samplers.num=4"]) == 0
    out = capsys.readouterr().out
    assert "3 logical CPUs on its 2 cores: the plan oversubscribes them" in out


def test_help_shows_examples_and_no_internal_module(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--dry-run" in out.split("examples:")[1] and "exgrpo.runtime" not in out


def test_dry_run_says_what_the_autoscale_policy_may_ask_the_cluster_for(capsys):
    args = ["--dry-run", "--config", "tiny-cpu", "samplers.autoscale=true", "samplers.autoscale_max=4"]
    assert run.main(args) == 0
    out = capsys.readouterr()
    assert "the run may ask Ray's autoscaler for up to 4 x (0.5 CPU) = 2 CPU" in out.out + out.err
    assert run.main(["--dry-run", "--config", "tiny-cpu"]) == 0
    out = capsys.readouterr()
    assert "autoscaler" not in out.out + out.err
