"""The training recipe's stages in order, with fakes for what `setup` builds (no Ray cluster)."""

from __future__ import annotations

import pytest

from exgrpo.core.config_files import load_config
from exgrpo.runtime.recipe import TrainingRecipe


class _Scaling:
    def current(self) -> int:
        return 3  # the operator's count when the attempt stops (what a recovery starts with)


class _System:
    def __init__(self) -> None:
        self.stopped = 0
        self.scaling = _Scaling()

    def shutdown(self) -> None:
        self.stopped += 1


class _Closing:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _recipe(tmp_path) -> TrainingRecipe:
    return TrainingRecipe(load_config(None, [f"logging.run_dir={tmp_path}", "logging.progress=false"]))


def test_a_setup_that_fails_after_starting_the_actors_stops_them(tmp_path, monkeypatch):
    recipe, system, logger = _recipe(tmp_path), _System(), _Closing()

    def setup() -> None:
        recipe.system, recipe.logger = system, logger  # the actors and the logger are up ...
        raise OSError("disk full while writing run.json")  # ... and the next part fails

    monkeypatch.setattr(recipe, "setup", setup)
    monkeypatch.setattr(recipe, "train", lambda: pytest.fail("train after a failed setup"))
    with pytest.raises(OSError, match="disk full"):
        recipe.run()
    assert system.stopped == 1 and logger.closed == 1


def test_a_failed_train_stops_the_actors_and_writes_no_report(tmp_path, monkeypatch):
    recipe, system, logger, progress = _recipe(tmp_path), _System(), _Closing(), _Closing()

    def setup() -> None:
        recipe.system, recipe.logger, recipe.progress = system, logger, progress

    def train() -> list:
        raise ValueError("a bug in a step")

    monkeypatch.setattr(recipe, "setup", setup)
    monkeypatch.setattr(recipe, "train", train)
    monkeypatch.setattr(recipe, "report", lambda: pytest.fail("a report for a failed run"))
    with pytest.raises(ValueError, match="a bug in a step"):
        recipe.run()
    assert system.stopped == 1 and logger.closed == 1 and progress.closed == 1
    assert recipe.job.samplers == 3  # kept for a recovery: the controller's count when it stopped


def test_a_setup_that_fails_before_anything_started_raises_its_own_error(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path)
    monkeypatch.setattr(recipe, "setup", lambda: (_ for _ in ()).throw(FileNotFoundError("no such model")))
    with pytest.raises(FileNotFoundError, match="no such model"):  # not "call setup() first"
        recipe.run()


def test_a_submitted_job_with_a_working_dir_is_recognised(monkeypatch):
    import json

    from exgrpo.runtime.run_dir import submitted_with_working_dir

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert not submitted_with_working_dir()
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"env_vars": {"A": "1"}}}))
    assert not submitted_with_working_dir()
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}, "metadata": {}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert submitted_with_working_dir()


def test_a_submitted_job_without_a_run_dir_gets_an_absolute_one_that_outlives_it(tmp_path, monkeypatch):
    import json
    from pathlib import Path

    from exgrpo.core.config import ConfigError
    from exgrpo.core.config_files import load_config
    from exgrpo.runtime.run_dir import check_run_dir, job_run_dir, shared_run_dir_note

    cfg = load_config("tiny-cpu")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert job_run_dir(cfg) is cfg  # a local run keeps runs/<time>
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    monkeypatch.setenv("EXGRPO_RUNS_DIR", str(tmp_path / "runs"))
    run_dir = Path(job_run_dir(cfg).logging.run_dir)
    assert run_dir.is_absolute() and run_dir.parent == tmp_path / "runs"
    check_run_dir(job_run_dir(cfg))  # accepted, where the unset one was refused
    monkeypatch.delenv("EXGRPO_RUNS_DIR")
    assert Path(job_run_dir(cfg).logging.run_dir).parent == Path("~/exgrpo-runs").expanduser().resolve()
    explicit = load_config("tiny-cpu", ["logging.run_dir=/data/runs/x"])
    assert job_run_dir(explicit) is explicit  # a run dir the user set is kept
    with pytest.raises(ConfigError, match="relative but this is a job submitted with --working-dir"):
        check_run_dir(load_config("tiny-cpu", ["logging.run_dir=runs/x"]))
    note = shared_run_dir_note(run_dir, nodes=2)
    assert f"{run_dir}/checkpoints" in note and "every node mounts" in note and "EXGRPO_RUNS_DIR" in note
