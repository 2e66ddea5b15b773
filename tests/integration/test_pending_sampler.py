"""A sampler Ray cannot place never blocks a step, and scaling back down recovers.

On a 2-CPU cluster that configs/tiny-cpu.yaml fills exactly (2 samplers x 0.5 CPU + 1 learner), the
operator asks for a third sampler past the resource check (what `EXGRPO_SKIP_RESOURCE_CHECK=1 python -m
exgrpo.scale --samplers 3` does: the controller's `set_samplers`). Ray cannot place it, so it stays
PENDING_CREATION; the steps go on training on the two live samplers (the pool sends it nothing and waits
for nothing), and `set_samplers(n=2)` removes it; the run then finishes on two samplers.
"""

from __future__ import annotations

import pytest
import ray

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.core.names import CONTROLLER, NAMESPACE
from exgrpo.loop.observer import Observer
from exgrpo.runtime.env import ACTOR_ENV
from exgrpo.runtime.recipe import train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, UP, DOWN = 8, 1, 5  # scale up after step UP, back down after step DOWN


@pytest.fixture(scope="module")
def two_cpus():
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        namespace="exgrpo",
        runtime_env={"env_vars": ACTOR_ENV},
        configure_logging=False,
    )
    yield
    ray.shutdown()


class Operator(Observer):
    """Scales 2 -> 3 after step UP and 3 -> 2 after step DOWN; records the pool's state after every step."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_train_start(self, *, system, driver) -> None:
        self.pool = system.samplers
        self.controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)

    def on_step(self, *, record) -> None:
        step = record[M.STEP]
        self.seen.append(
            {
                "step": step,
                "members": sorted(self.pool.members()),
                "starting": self.pool.num_starting(),
                "free_cpus": ray.available_resources().get("CPU", 0.0),
                "wait_s": record[M.WAIT_TIME],
            }
        )
        if step == UP:
            ray.get(self.controller.set_samplers.remote(n=3))
        if step == DOWN:
            ray.get(self.controller.set_samplers.remote(n=2))


def test_an_unplaceable_sampler_never_blocks_a_step_and_scaling_down_removes_it(two_cpus, tmp_path):
    cfg = load_config(
        "tiny-cpu",
        [
            f"trainer.steps={STEPS}",
            "data.num_eval=0",
            "data.eval=",
            "logging.progress=false",
            f"logging.run_dir={tmp_path / 'run'}",
        ],
    )
    op = Operator()
    # a step that waited for the pending sampler would stall: fail in 120 s instead of the default 900 s
    result = train(cfg, checkpoints=False, observer=op, stall_timeout_s=120)
    assert [r[M.VERSION] for r in result.records] == list(range(1, STEPS + 1))
    live = ["exgrpo-sampler-0", "exgrpo-sampler-1"]
    pending = [s for s in op.seen if UP < s["step"] <= DOWN]  # steps that ran with the third one asked for
    assert pending and all(s["starting"] == 1 and s["members"] == live for s in pending), op.seen
    assert all(s["free_cpus"] < 0.5 for s in pending), op.seen  # Ray really could not place it
    assert all(r[M.SAMPLERS] == 3 for r in result.records if UP < r[M.STEP] <= DOWN)
    after = [s for s in op.seen if s["step"] > DOWN]
    assert after and all(s["starting"] == 0 and s["members"] == live for s in after), op.seen
    assert [r[M.SAMPLERS] for r in result.records if r[M.STEP] > DOWN] == [2] * (STEPS - DOWN - 1)
    print("\n", *op.seen, sep="\n")
