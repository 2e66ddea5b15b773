"""Ctrl-C keeps the work: the first SIGINT / SIGTERM during training asks the driver to stop at the next step
boundary (it then checkpoints; tests/exgrpo/loop/test_checkpoint_resume.py checks the resume loses no step), a second one stops at
once, and the handlers are put back afterwards. Before, the first Ctrl-C raised KeyboardInterrupt mid-step."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from exgrpo.runtime.recipe import TrainingRecipe


def _recipe() -> TrainingRecipe:
    recipe = TrainingRecipe.__new__(TrainingRecipe)  # only the driver is needed by stop_on_signals
    recipe.driver = SimpleNamespace(stop_requested=None)  # type: ignore[assignment]
    return recipe


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_asks_for_a_stop_second_stops_at_once(sig, capsys):
    recipe = _recipe()
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt), recipe.stop_on_signals():
        os.kill(os.getpid(), sig)
        assert recipe.driver.stop_requested == sig.name  # type: ignore[union-attr]
        assert "stopping at the next step boundary" in capsys.readouterr().err
        os.kill(os.getpid(), sig)
        pytest.fail("the second signal did not stop at once")
    assert signal.getsignal(sig) is before


def test_handlers_are_restored_after_a_normal_end():
    recipe = _recipe()
    before = signal.getsignal(signal.SIGINT)
    with recipe.stop_on_signals():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before and recipe.driver.stop_requested is None  # type: ignore[union-attr]


def test_a_second_signal_prints_the_resume_command_when_a_checkpoint_exists(tmp_path, monkeypatch, capsys):
    """Before: the run's default directory (no logging.run_dir) got a bare "interrupted" after a second Ctrl-C."""
    from exgrpo import run

    run_dir = tmp_path / "runs" / "20250101-000000"
    ckpt = run_dir / "checkpoints" / "step-000003"
    ckpt.mkdir(parents=True)
    (ckpt / "driver.json").write_text("{}")
    recipe = _recipe()
    recipe.driver.checkpointer = SimpleNamespace(root=run_dir / "checkpoints")  # type: ignore[union-attr]

    class Launch:
        @staticmethod
        def train(cfg, **kwargs):
            with recipe.stop_on_signals():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)

    from exgrpo.core.config_files import load_config

    monkeypatch.setenv("RAY_ADDRESS", "unused")  # no ray.shutdown in the CLI's finally
    assert run._train(Launch, load_config("tiny-cpu"), resume=None) == 130
    err = capsys.readouterr().err
    assert f"resume from {ckpt} with: python -m exgrpo.run --resume {run_dir}" in err
