"""The README's run command, as a user types it: `python -m exgrpo.run` (shortened) and its outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def run_cli(tmp_path, *overrides, timeout=600):
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        f"logging.run_dir={tmp_path / 'run'}",
        "logging.progress=false",
        *overrides,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )  # any working dir


def test_default_run_smoke(tmp_path):
    out = run_cli(
        tmp_path, "trainer.steps=3", "trainer.eval_every=0", "data.num_eval=16", "trainer.checkpoint_every=2"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [-1, 0, 1, 2]  # -1: the held-out evaluation before the first step
    assert records[0]["eval/version"] == 0 and "eval/accuracy" in records[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["eval_accuracy_before"] is not None
    assert "held-out accuracy after" in out.stdout
    for plot in ("reward", "buckets", "staleness", "eval_accuracy"):
        assert (run / "plots" / f"{plot}.png").stat().st_size > 1000
    assert (run / "final" / "model.safetensors").exists() and (run / "final" / "tokenizer.json").exists()
    assert (run / "checkpoints" / "step-000002" / "driver.json").exists()


def test_bad_config_fails_before_starting_anything(tmp_path):
    out = run_cli(tmp_path, "replay.rho=2")
    assert out.returncode == 2 and "replay.rho=2.0 must lie in [0, 1]" in out.stderr


@pytest.mark.slow
def test_full_default_run_improves_heldout_accuracy(tmp_path):
    out = run_cli(tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["wall_s"] < 600
    assert summary["eval_accuracy_after"] > summary["eval_accuracy_before"] + 0.02


@pytest.mark.slow
def test_compare_experiment_small(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.experiments.compare",
        "--config",
        "paper-regime",
        "--variants",
        "exgrpo",
        "grpo",
        "--seeds",
        "0",
        "1",
        "--out",
        str(tmp_path / "cmp"),
        "trainer.steps=4",
        "trainer.eval_every=2",
        "data.num_eval=16",
        "trainer.eval_samples=2",
    ]
    (tmp_path / "cmp" / "grpo-seed1").mkdir(parents=True)  # an earlier invocation's unfinished run
    (tmp_path / "cmp" / "grpo-seed1" / "metrics.jsonl").write_text('{"step": 0, "left_over": true}\n')
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "left_over" in (tmp_path / "cmp" / "grpo-seed1.interrupted" / "metrics.jsonl").read_text()
    assert "left_over" not in (tmp_path / "cmp" / "grpo-seed1" / "metrics.jsonl").read_text()
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert {(r["variant"], r["seed"]) for r in results} == {
        ("exgrpo", 0),
        ("grpo", 0),
        ("exgrpo", 1),
        ("grpo", 1),
    }
    assert all(len(r["curve"]) == 3 for r in results)  # before, step 2, step 4
    assert all(r["config"] == "paper-regime" for r in results)
    run_cfg = (tmp_path / "cmp" / "grpo-seed0" / "config.yaml").read_text()
    assert "minibatches: 2" in run_cfg and "max_staleness: 0" in run_cfg and "num_train: 400" in run_cfg
    assert "| exgrpo |" in (tmp_path / "cmp" / "table.md").read_text()
    assert (tmp_path / "cmp" / "curves.png").stat().st_size > 1000


# --------------------------------------------------------------------------- bad input: a clear message, nothing lost


def _fake_run(tmp_path, step, *overrides):
    """A run dir with config.yaml and one complete (fake) checkpoint at `step`, as a finished run leaves it."""
    from exgrpo.core.config_files import load_config
    from exgrpo.loop.checkpoint import CONFIG_FILE, config_fingerprint

    run = tmp_path / "done"
    cfg = load_config("tiny-cpu", [f"logging.run_dir={run}", *overrides])
    ckpt = run / "checkpoints" / f"step-{step:06d}"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text(cfg.to_yaml())
    (ckpt / CONFIG_FILE).write_text(
        json.dumps({"fingerprint": config_fingerprint(cfg), "config": cfg.to_dict()})
    )
    (ckpt / "driver.json").write_text("{}")
    return run


def _cli(tmp_path, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "exgrpo.run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def test_resume_errors_name_the_fix_and_change_nothing(tmp_path):
    run = _fake_run(tmp_path, 4, "trainer.steps=4")
    before = (run / "config.yaml").read_text()
    out = _cli(tmp_path, "--resume", str(run))
    assert (
        out.returncode == 2 and "already finished 4 steps; pass trainer.steps=M>4 to continue" in out.stderr
    )
    out = _cli(
        tmp_path,
        "--resume",
        str(run),
        "trainer.steps=8",
        "trainer.rollouts_per_question=8",
        "replay.num_shards=3",
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "trainer.rollouts_per_question: 4 -> 8" in out.stderr and "replay.num_shards: 2 -> 3" in out.stderr
    assert (run / "config.yaml").read_text() == before  # a refused resume writes nothing
    out = _cli(tmp_path, "--resume", str(tmp_path / "nope"))
    assert out.returncode == 2 and "no such run directory" in out.stderr


def test_model_dir_without_tokenizer_fails_before_any_actor(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0")
    out = run_cli(tmp_path, "--config", "tiny-cpu", f"model.path={model}")
    assert out.returncode == 2
    assert (
        f"model directory '{model}'" in out.stderr and "has no tokenizer files (tokenizer.json" in out.stderr
    )
    assert "Traceback" not in out.stderr and "exgrpo-sampler" not in out.stderr


def test_bad_data_file_fails_with_rows_named(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "1+1"}\nnot json\n')
    out = run_cli(tmp_path, "--config", "tiny-cpu", f"data.train={data}", "data.eval=builtin:arith")
    assert (
        out.returncode == 2 and "holds no valid prompt" in out.stderr and "row 1: invalid JSON" in out.stderr
    )
    assert "Traceback" not in out.stderr


def test_plan_that_cannot_fit_fails_at_once(tmp_path):
    out = run_cli(
        tmp_path, "--config", "tiny-cpu", "samplers.engine=vllm", "samplers.num_gpus=1", timeout=300
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "the plan needs 2 GPUs (2 samplers x 1 + 1 learner x 0) but the cluster has 0" in out.stderr
    assert "samplers.num_gpus=0" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow  # three CLI starts (~110 s); the cause is tested fast in tests/exgrpo/runtime/test_run_dir.py
def test_a_run_directory_works_from_another_directory(tmp_path):
    """A run started with a relative reward file and data files resumes and is evaluated from another directory:
    its config.yaml holds absolute paths and a copy of the reward file. Before: `reward.fn: no such file
    'my_rewards.py'` from anywhere but the launch directory."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_rewards.py").write_text("def score(prompt, completion, fields):\n    return 1.0\n")
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(16)]
    (project / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = run_cli(
        project,
        "--config",
        "tiny-cpu",
        "reward.fn=my_rewards.py:score",
        "data.train=train.jsonl",
        "data.eval=train.jsonl",
        "trainer.steps=2",
        "trainer.checkpoint_every=1",
        "trainer.eval_every=0",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run = project / "run"
    saved = (run / "config.yaml").read_text()
    assert f"fn: {run}/reward/my_rewards.py:score" in saved and f"train: {project}/train.jsonl" in saved
    (project / "my_rewards.py").unlink()  # the run keeps its own copy
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        "--resume",
        str(run),
        "trainer.steps=3",
        "logging.progress=false",
    ]
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    cmd = [sys.executable, "-m", "exgrpo.evaluate", "--like-run", str(run), "--num", "4", "--n", "1"]
    evaluated = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
