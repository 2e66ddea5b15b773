"""The in-job recovery policy (`exgrpo.runtime.healing`) with fake attempts: no Ray, no actors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import RunInterrupted
from exgrpo.runtime.healing import Attempt, Job, resolve_max_failures, supervise


def _checkpoint(run_dir: Path, step: int) -> Path:
    ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "driver.json").write_text(json.dumps({"step": step}))
    return ckpt


def _death(run_dir: Path, step: int, what: str = "learner exgrpo-learner-0 died") -> RunInterrupted:
    return RunInterrupted(f"{what} at step {step}", run_dir=run_dir, checkpoint=None, what=what, step=step)


class Attempts:
    """A fake `start`: each call records its attempt, then plays the next scripted outcome (an exception to
    raise, or a value to return); a callable outcome is called first (it writes checkpoints)."""

    def __init__(self, *outcomes) -> None:
        self.outcomes, self.seen = list(outcomes), []

    def __call__(self, attempt: Attempt):
        self.seen.append(attempt)
        outcome = self.outcomes.pop(0)
        if callable(outcome) and not isinstance(outcome, BaseException):
            outcome = outcome()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_auto_limit_is_three_on_an_existing_cluster_and_zero_locally():
    auto, two = load_config("tiny-cpu"), load_config("tiny-cpu", ["trainer.max_failures=2"])
    assert auto.trainer.max_failures is None
    assert resolve_max_failures(auto, environ={}) == 0
    assert resolve_max_failures(auto, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == 3
    assert resolve_max_failures(auto, environ={"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"}) == 3
    assert resolve_max_failures(two, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == 2
    assert (
        resolve_max_failures(
            load_config("tiny-cpu", ["trainer.max_failures=0"]), environ={"RAY_ADDRESS": "x"}
        )
        == 0
    )
    with pytest.raises(ConfigError, match="trainer.max_failures"):
        load_config("tiny-cpu", ["trainer.max_failures=-1"])


def test_each_death_restores_the_latest_checkpoint_until_the_run_finishes(tmp_path, caplog):
    def die_after_checkpoint(step: int, at: int):
        return lambda: (_checkpoint(tmp_path, step), _death(tmp_path, at))[1]

    start = Attempts(die_after_checkpoint(2, 3), die_after_checkpoint(4, 5), "done")
    with caplog.at_level("WARNING", logger="exgrpo"):
        assert supervise(start, first=Attempt(), max_failures=2, steps=10) == "done"
    first, one, two = start.seen
    assert first == Attempt()
    assert (one.recovery, one.resume, one.run_dir, one.from_step) == (1, True, tmp_path, 2)
    assert (two.recovery, two.resume, two.run_dir, two.from_step) == (2, True, tmp_path, 4)
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        "recovery 1 of 2: learner exgrpo-learner-0 died at step 3; restoring" in m and "step-000002" in m
        for m in lines
    ), lines
    assert any("recovery 2 of 2" in m and "step-000004 (step 4)" in m for m in lines), lines


def test_beyond_the_limit_the_run_stops_with_the_resume_command(tmp_path):
    _checkpoint(tmp_path, 2)
    start = Attempts(_death(tmp_path, 3), _death(tmp_path, 4), "never reached")
    with pytest.raises(RunInterrupted) as err:
        supervise(start, first=Attempt(), max_failures=1, steps=10)
    assert len(start.seen) == 2
    text = str(err.value)
    assert text.startswith(
        "learner exgrpo-learner-0 died at step 4; the run stopped (trainer.max_failures=1 reached)"
    )
    assert f"python -m exgrpo.run --resume {tmp_path}" in text and "step-000002" in text
    assert err.value.checkpoint == tmp_path / "checkpoints" / "step-000002" and err.value.step == 4


def test_no_recovery_with_max_failures_zero(tmp_path):
    _checkpoint(tmp_path, 1)
    start = Attempts(_death(tmp_path, 2, what="controller exgrpo-controller died"))
    with pytest.raises(
        RunInterrupted,
        match=r"controller exgrpo-controller died at step 2; the run stopped "
        r"\(trainer.max_failures=0: no recovery inside the job\)\. Resume it from",
    ):
        supervise(start, first=Attempt(), max_failures=0, steps=10)
    assert len(start.seen) == 1


@pytest.mark.parametrize("error", [ConfigError("bad setting"), ValueError("a bug"), KeyboardInterrupt()])
def test_errors_that_are_not_actor_deaths_are_never_retried(tmp_path, error):
    start = Attempts(error, "never reached")
    with pytest.raises(type(error)):
        supervise(start, first=Attempt(), max_failures=3, steps=10)
    assert len(start.seen) == 1


def test_without_a_checkpoint_it_restarts_at_step_zero_and_not_twice_without_progress(tmp_path):
    start = Attempts(_death(tmp_path, 2), _death(tmp_path, 0), "never reached")
    with pytest.raises(RunInterrupted) as err:
        supervise(start, first=Attempt(), max_failures=3, steps=10)
    restart = start.seen[1]
    assert (restart.recovery, restart.resume, restart.run_dir, restart.from_step) == (1, False, tmp_path, 0)
    assert len(start.seen) == 2  # the restart died at step 0 again: no third attempt although 3 are allowed
    assert "not recovered again: it died before training a step since recovery 1 restarted at step 0" in str(
        err.value
    )
    assert "no checkpoint was written yet" in str(err.value)


def test_a_recovery_that_made_progress_may_recover_again(tmp_path):
    start = Attempts(_death(tmp_path, 1), _death(tmp_path, 2), "done")  # no checkpoint: each restarts at 0
    assert supervise(start, first=Attempt(), max_failures=3, steps=10) == "done"
    assert [a.recovery for a in start.seen] == [0, 1, 2]


def test_no_recovery_when_the_last_checkpoint_holds_every_step(tmp_path):
    _checkpoint(tmp_path, 10)  # the final save died after the last step's checkpoint
    start = Attempts(_death(tmp_path, 10), "never reached")
    with pytest.raises(RunInterrupted, match="its last checkpoint holds all 10 steps"):
        supervise(start, first=Attempt(), max_failures=3, steps=10)
    assert len(start.seen) == 1


def test_an_attempt_pins_the_run_dir_and_the_job_keeps_each_step_once(tmp_path):
    cfg = load_config("tiny-cpu")  # logging.run_dir unset: runs/<time>, which a recovery must not move
    assert Attempt().config(cfg) is cfg
    assert Attempt(recovery=1, resume=True, run_dir=tmp_path).config(cfg).logging.run_dir == str(tmp_path)
    job = Job()
    for step in range(4):
        job.on_step(record={"step": step})
    job.rewind(2)  # a recovery restores the checkpoint of step 2
    for step in range(2, 5):
        job.on_step(record={"step": step})
    assert [r["step"] for r in job.records] == [0, 1, 2, 3, 4]
    assert job.wall_s() > 0
