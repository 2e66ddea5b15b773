"""A learner killed mid-run ends the run (on a local cluster `trainer.max_failures` defaults to 0) with a
message naming the checkpoint and the exact resume command; `--resume` (here `train(resume=True)`) then
continues from that checkpoint to the last step. In-job recovery: tests/integration/test_self_healing.py."""

from __future__ import annotations

import json
import os
import signal

import pytest
import ray

from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import RunInterrupted
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

pytestmark = pytest.mark.integration


def _pid(actor) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid())))


def test_killed_learner_names_the_checkpoint_and_resume_continues(ray_cluster, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "trainer.steps=4",
        "trainer.checkpoint_every=1",
        "samplers.num=1",
        "data.num_eval=8",
        "logging.progress=false",
        f"logging.run_dir={run_dir}",
    ]
    cfg = load_config("tiny-cpu", overrides)

    class KillLearner(Observer):
        def on_train_start(self, *, system, driver):
            self.system, self.pid = system, None

        def on_step(self, *, record):
            if record["step"] == 1 and self.pid is None:  # step 1 trained; the checkpoint of step 1 exists
                self.pid = _pid(self.system.learners.actors[0])
                os.kill(self.pid, signal.SIGKILL)

    with pytest.raises(RunInterrupted) as err:
        train(cfg, observer=KillLearner())
    text = str(err.value)
    assert "learner exgrpo-learner-0 died at step 2" in text, text
    # trainer.max_failures is null: 0 recoveries on a local cluster, so the run stops as before
    assert "the run stopped (trainer.max_failures=0: no recovery inside the job)" in text, text
    assert "checkpoints/step-000001" in text and f"python -m exgrpo.run --resume {run_dir}" in text
    assert err.value.checkpoint.name == "step-000001"

    result = train(load_config("tiny-cpu", overrides), resume=True)
    assert [r["step"] for r in result.records] == [1, 2, 3]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the record of step 1 written before the kill was rewound, not duplicated (-1: the first evaluation)
    assert steps == [-1, 0, 1, 2, 3]
    assert (run_dir / "checkpoints" / "step-000004" / "driver.json").exists()
    assert (run_dir / "final" / "model.safetensors").exists()
