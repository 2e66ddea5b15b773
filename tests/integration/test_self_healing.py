"""Self-healing runs on a real local Ray cluster: an actor the run cannot lose is SIGKILLed mid-run and the same
`train()` call restores the latest checkpoint (or restarts at step 0 before the first one) and finishes every
step, each recorded once (`trainer.max_failures`, exgrpo/runtime/healing.py)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import ray

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.core.names import CONTROLLER
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _pid(actor) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid())))


def _overrides(run_dir, *more: str) -> list[str]:
    return [
        "trainer.steps=4",
        "samplers.num=1",
        "data.num_eval=8",
        "logging.progress=false",
        f"logging.run_dir={run_dir}",
        *more,
    ]


def _metric_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class KillOnce(Observer):
    """SIGKILLs the actor `pick(system)` once in the whole job, after step `at` was trained; at the end, starts
    one more sampler (as a scale-up would) and checks that it finds its weights."""

    def __init__(self, *, at: int, pick, scale_to: int | None = None) -> None:
        self.at, self.pick, self.killed, self.starts, self.new_sampler_version = at, pick, False, 0, None
        self.scale_to, self.samplers_at_end = scale_to, None  # an operator's exgrpo.scale before the kill
        self.t_kill = self.t_back = None  # the kill, and the first step record after it (recovery time)

    def on_train_start(self, *, system, driver):
        self.system, self.starts = system, self.starts + 1

    def on_step(self, *, record):
        if self.scale_to is not None and record["step"] == 0 and not self.killed:
            ray.get(self.system.controller.set_samplers.remote(n=self.scale_to))  # what exgrpo.scale calls
        if self.killed and self.t_back is None and self.starts == 2:
            self.t_back = time.perf_counter()
        if record["step"] == self.at and not self.killed:
            self.killed = True
            self.t_kill = time.perf_counter()
            os.kill(_pid(self.pick(self.system)), signal.SIGKILL)

    def on_train_end(self, *, system, driver):
        self.samplers_at_end = (system.samplers.size(), ray.get(system.controller.desired_samplers.remote()))
        system.samplers.scale(num=system.samplers.size() + 1)
        newest = list(system.samplers.members().values())[-1]
        self.new_sampler_version = ray.get(newest.version.remote(), timeout=300)


def test_a_killed_learner_is_recovered_from_its_checkpoint_in_the_same_call(ray_cluster, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config("tiny-cpu", _overrides(run_dir, "trainer.checkpoint_every=1", "trainer.max_failures=1"))
    kill = KillOnce(  # after step 1, whose checkpoint exists; the operator scaled 1 -> 2 samplers before it
        at=1, pick=lambda system: system.learners.actors[0], scale_to=2
    )

    result = train(cfg, observer=kill)
    assert kill.killed and kill.starts == 2
    assert result.recoveries == 1
    assert [r["step"] for r in result.records] == [0, 1, 2, 3]  # the job's steps, each once
    assert [r[M.RECOVERIES] for r in result.records] == [0, 1, 1, 1]  # step 1 was trained again after it
    # the recovery started the 2 samplers the operator had set, and its controller holds that count
    assert kill.samplers_at_end == (2, 2) and [r[M.SAMPLERS] for r in result.records][1:] == [2, 2, 2]
    # the record of step 1 written before the kill was rewound, not duplicated (-1: the first evaluation)
    assert _metric_steps(run_dir) == [-1, 0, 1, 2, 3]
    assert json.loads((run_dir / "summary.json").read_text())["recoveries"] == 1
    assert (run_dir / "final" / "model.safetensors").exists() and (run_dir / "report.html").exists()
    # the recovery restored step-000001 and pinned its weights; rotation (keep 2) deleted that checkpoint since,
    # and a sampler started after it (a scale-up) still loaded them and caught up to the final version
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step-000003", "step-000004"], checkpoints
    assert (run_dir / "resumed-model" / "model.safetensors").exists()
    assert kill.new_sampler_version == 4


def test_a_killed_controller_is_replaced_and_the_run_goes_on(ray_cluster, tmp_path):
    """The controller holds only the desired sampler count: its death costs no recovery, not even with
    max_failures=0; a new controller holding the last count answers under the same name."""
    run_dir = tmp_path / "run"
    cfg = load_config("tiny-cpu", _overrides(run_dir, "trainer.checkpoint_every=0", "trainer.max_failures=0"))
    kill = KillOnce(at=0, pick=lambda system: ray.get_actor(CONTROLLER, namespace="exgrpo"))

    result = train(cfg, observer=kill)
    assert kill.killed and kill.starts == 1 and result.recoveries == 0
    assert [r["step"] for r in result.records] == [0, 1, 2, 3]
    assert kill.system.scaling.replaced == 1
    assert (run_dir / "final" / "model.safetensors").exists()


def test_a_killed_rank_of_a_two_rank_deepspeed_group_is_recovered(ray_cluster, tmp_path):
    """A real two-rank DeepSpeed learner group (ZeRO-2, gloo): rank 1 is SIGKILLed after step 1; the job
    restarts from step 1's checkpoint with a new group of two and trains every step once."""
    run_dir = tmp_path / "run"
    cfg = load_config(
        "tiny-cpu",
        _overrides(
            run_dir,
            "learners.num=2",
            "learners.zero_stage=2",
            "learners.num_cpus=1",
            "trainer.checkpoint_every=1",
            "trainer.max_failures=1",
        ),
    )
    kill = KillOnce(at=1, pick=lambda system: system.learners.actors[1])
    result = train(cfg, observer=kill)
    assert kill.killed and kill.starts == 2 and result.recoveries == 1
    assert [r["step"] for r in result.records] == [0, 1, 2, 3]  # nothing lost, nothing trained twice
    assert [r[M.RECOVERIES] for r in result.records] == [0, 1, 1, 1]
    assert [r[M.VERSION] for r in result.records] == [1, 2, 3, 4]
    assert _metric_steps(run_dir) == [-1, 0, 1, 2, 3]
    assert (run_dir / "final" / "model.safetensors").exists()
    assert kill.new_sampler_version == 4
    print(
        f"two-rank recovery: {kill.t_back - kill.t_kill:.1f} s from the kill to the first step trained again"
    )
