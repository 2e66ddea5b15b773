"""Resume checks without Ray: config fingerprint, differing keys, finished runs, metrics rewind, messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from exgrpo.core.config import TrainerConfig
from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import (
    CONFIG_FILE,
    ResumeError,
    config_differences,
    config_fingerprint,
    dead_actor,
    fresh_run_dir_check,
    interrupted_message,
    latest_checkpoint,
    resume_checkpoint,
    rewind_metrics,
)


def _fake_checkpoint(run_dir: Path, step: int, cfg) -> Path:
    ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / CONFIG_FILE).write_text(
        json.dumps({"fingerprint": config_fingerprint(cfg), "config": cfg.to_dict()})
    )
    (ckpt / "driver.json").write_text("{}")
    return ckpt


def test_checkpoints_are_written_by_default():
    assert TrainerConfig().checkpoint_every > 0
    assert load_config("tiny-cpu").trainer.checkpoint_every > 0


def test_fingerprint_ignores_harmless_keys_only():
    base = load_config(None, ["trainer.steps=4"])
    assert config_fingerprint(base) == config_fingerprint(
        load_config(None, ["trainer.steps=40", "samplers.num=3", "logging.run_dir=/x"])
    )
    for change in (
        "trainer.rollouts_per_question=4",
        "trainer.questions_per_step=4",
        "replay.num_shards=3",
        "model.path=builtin:tiny",
        "learners.lr=1e-3",
    ):
        assert config_fingerprint(base) != config_fingerprint(
            load_config(None, ["trainer.steps=4", change])
        ), change


def test_resume_with_a_different_config_lists_the_keys(tmp_path):
    old = load_config(None, ["trainer.steps=4"])
    _fake_checkpoint(tmp_path, 2, old)
    new = load_config(
        None,
        [
            "trainer.steps=8",
            "trainer.rollouts_per_question=4",
            "trainer.questions_per_step=4",
            "replay.num_shards=3",
            "model.path=builtin:tiny",
        ],
    )
    with pytest.raises(ResumeError) as err:
        resume_checkpoint(tmp_path, new)
    text = str(err.value)
    for key in (
        "trainer.rollouts_per_question: 8 -> 4",
        "trainer.questions_per_step: 8 -> 4",
        "replay.num_shards: 2 -> 3",
        "model.path: 'builtin:arith-base' -> 'builtin:tiny'",
    ):
        assert key.split(":")[0] in text
    assert "trainer.steps" not in text.split("\n")[1:-1]  # steps is harmless and not listed
    assert config_differences(old.to_dict(), new) and len(config_differences(old.to_dict(), new)) == 4
    # harmless overrides pass
    assert (
        resume_checkpoint(tmp_path, load_config(None, ["trainer.steps=8", "samplers.num=1"])).name
        == "step-000002"
    )


def test_keys_unknown_to_an_old_checkpoint_are_not_compared(tmp_path):
    cfg = load_config(None, ["trainer.steps=4"])
    stored = cfg.to_dict()
    del stored["trainer"]["seed"]
    assert config_differences(stored, load_config(None, ["trainer.steps=4", "trainer.seed=3"])) == []


def test_resume_of_a_finished_run(tmp_path):
    cfg = load_config(None, ["trainer.steps=4"])
    _fake_checkpoint(tmp_path, 4, cfg)
    with pytest.raises(ResumeError, match=r"already finished 4 steps; pass trainer.steps=M>4 to continue"):
        resume_checkpoint(tmp_path, cfg)
    assert resume_checkpoint(tmp_path, load_config(None, ["trainer.steps=6"])).name == "step-000004"


def test_resume_without_checkpoint(tmp_path):
    with pytest.raises(ResumeError, match="no such run directory"):
        resume_checkpoint(tmp_path / "nope", load_config())
    with pytest.raises(ResumeError, match="holds no complete checkpoint"):
        resume_checkpoint(tmp_path, load_config())
    (tmp_path / "checkpoints" / ".step-000002.tmp").mkdir(parents=True)  # an interrupted write
    assert latest_checkpoint(tmp_path) is None


def test_fresh_run_refuses_a_dir_with_checkpoints(tmp_path):
    cfg = load_config(None, [f"logging.run_dir={tmp_path}"])
    fresh_run_dir_check(cfg)
    _fake_checkpoint(tmp_path, 2, cfg)
    with pytest.raises(ResumeError, match=f"--resume {tmp_path}"):
        fresh_run_dir_check(cfg)


def test_fresh_run_refuses_an_earlier_runs_records_without_a_checkpoint(tmp_path):
    """A run stopped before its first checkpoint (or run with checkpoints off) leaves metrics.jsonl: a fresh run
    there would append its steps to that run's; a recovery inside the same job goes on with its own."""
    cfg = load_config(None, [f"logging.run_dir={tmp_path}"])
    (tmp_path / "metrics.jsonl").write_text("")
    fresh_run_dir_check(cfg)  # an empty file holds no run
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ResumeError, match="records of an earlier run"):
        fresh_run_dir_check(cfg)
    fresh_run_dir_check(cfg, recovery=True)


def test_rewind_metrics_drops_steps_after_the_checkpoint(tmp_path):
    lines = [json.dumps({"step": i, "x": i}) for i in range(5)] + ['{"step": 5, "x"']  # torn last line
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert rewind_metrics(tmp_path, 3) == 3
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        0,
        1,
        2,
    ]
    assert rewind_metrics(tmp_path, 3) == 0
    assert rewind_metrics(tmp_path / "none", 0) == 0


def test_interrupted_message_names_checkpoint_and_command(tmp_path):
    assert "no checkpoint was written yet" in interrupted_message(tmp_path, what="x died", step=1)
    ckpt = _fake_checkpoint(tmp_path, 2, load_config())
    text = interrupted_message(
        tmp_path, what=dead_actor("ActorDiedError: ... name: exgrpo-learner-0, ..."), step=3
    )
    assert text.startswith("learner exgrpo-learner-0 died at step 3")
    assert str(ckpt) in text and f"python -m exgrpo.run --resume {tmp_path}" in text
    assert dead_actor("name: exgrpo-replay-1") == "replay shard exgrpo-replay-1 died"
    assert dead_actor("something else") == "a Ray actor of the run died"


def test_a_resumed_runs_model_outlives_the_rotation_of_its_checkpoint(tmp_path):
    """The weights a resumed run's actors load are pinned in the run dir: a sampler started after checkpoint
    rotation deleted `checkpoints/step-N` (a replacement, a scale-up) still finds them."""
    from exgrpo.loop.checkpoint import RESUMED_MODEL, pin_model
    from exgrpo.models.resolve import check_model_dir

    ckpt = tmp_path / "checkpoints" / "step-000010"
    (ckpt / "model" / "deepspeed").mkdir(parents=True)
    files = {"model.safetensors": b"weights", "config.json": b"{}", "tokenizer.json": b"{}"}
    for name, data in files.items():
        (ckpt / "model" / name).write_bytes(data)
    (ckpt / "model" / "deepspeed" / "optim.pt").write_bytes(b"optimiser state")
    pinned = pin_model(ckpt, tmp_path)
    assert pinned == tmp_path / RESUMED_MODEL and sorted(p.name for p in pinned.iterdir()) == sorted(files)
    shutil.rmtree(tmp_path / "checkpoints")  # rotation
    assert {p.name: p.read_bytes() for p in pinned.iterdir()} == files
    check_model_dir(pinned)  # what a sampler's start checks
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "model.safetensors").write_bytes(b"newer")
    assert [p.name for p in pin_model(ckpt, tmp_path).iterdir()] == [
        "model.safetensors"
    ]  # a later resume replaces it
