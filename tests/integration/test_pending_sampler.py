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

STEPS, UP, DOWN = 10, 1, 5  # ask for 3 samplers after step UP, for 2 after step DOWN
# (the driver reads the controller without blocking, so it applies a change one or two steps later)


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
    print("\n", *op.seen, sep="\n")
    live = ["exgrpo-sampler-0", "exgrpo-sampler-1"]
    assert all(s["members"] == live for s in op.seen), op.seen  # the third one never took a request
    pending = [s["step"] for s in op.seen if s["starting"] == 1]  # steps trained with it pending
    assert len(pending) >= 2 and pending == list(range(pending[0], pending[-1] + 1)), op.seen
    assert pending[0] > UP and pending[-1] < STEPS - 2, op.seen  # asked for after UP, gone before the end
    placeable = [s for s in op.seen if s["step"] in pending and s["free_cpus"] >= 0.5]
    assert placeable == [], op.seen  # Ray really could not place it
    samplers = {r[M.STEP]: r[M.SAMPLERS] for r in result.records}
    assert all(samplers[t] == 3 for t in pending) and samplers[STEPS - 1] == 2
    assert op.seen[-1]["starting"] == 0  # the pool shut down after the run: read what it was then
