"""System assembly: the replay shards, learner group, sampler pool, weight transport and scaling controller of
one run, started as named Ray actors and wired together (`build_system`), and `System`, the roles it returns.

`build_system` is the start's checks (`exgrpo.runtime.preflight.check_start`) followed by the builder parts of
`exgrpo.runtime.parts`, in order; the CLI, the sweep, the integration tests and the benchmarks share it. The
simulated cluster (`bench/sim/cluster.py`) composes the same parts around its own samplers and learners.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config
from exgrpo.core.roles import WeightTransport
from exgrpo.reporting.console import PREFIX
from exgrpo.runtime.controller import ControllerClient
from exgrpo.runtime.parts import (
    LearnerGroupRole,
    SamplerPoolRole,
    SamplerSpawner,
    ShardedReplayRole,
    make_controller,
    make_learners,
    make_replay,
    make_samplers,
    make_transport,
    replay_ready,
)
from exgrpo.runtime.preflight import check_start


@dataclass
class System:
    """The live roles of one run (Ray-backed implementations of `exgrpo.core.roles`)."""

    replay: ShardedReplayRole  # buffers.sharded.ShardedReplay
    samplers: SamplerPoolRole  # actors.pool.SamplerPool
    learners: LearnerGroupRole  # learners.group.LearnerGroup (or the simulated group)
    weights: WeightTransport  # exgrpo.transport.broadcast transport
    scaling: ControllerClient  # over the Controller actor (`controller`: its current handle)

    @property
    def controller(self) -> Any:
        return self.scaling.handle

    def shutdown(self) -> None:
        import ray

        self.samplers.shutdown()
        self.learners.shutdown()
        for s in self.replay.shards:
            ray.kill(s)
        ray.kill(self.controller)


def build_system(cfg: Config, *, model_path: str, run_dir: str | Path | None = None) -> System:
    """Check the start, then start replay shards, learners, samplers and the scaling controller as named
    actors and wire the weight transport between learners and samplers. The shards and learners start
    while the samplers do; a start that fails stops the actors it started.

    With `run_dir` (and `replay.wal`), the shards log to `<run_dir>/replay-wal/` and Ray restarts a dead one."""
    model_path = check_start(cfg, model_path=model_path, run_dir=run_dir)
    # the shards and learners start (DeepSpeed) while the samplers build their engines: the start takes the
    # longest of the three, not their sum
    replay = make_replay(cfg, run_dir=run_dir, wait=False)
    learners = make_learners(cfg, model_path=model_path, wait=False)
    try:
        spawner = SamplerSpawner(cfg, model_path=model_path, replay=replay)
        samplers = make_samplers(cfg, spawn=spawner, on_removed=spawner.release)
        learners.ready()
        if cfg.learners.autocast != "off":  # the choice depends on the learner node's CPU: say what it was
            print(f"{PREFIX} learners compute in {learners.compute}", file=sys.stderr, flush=True)
        replay_ready(replay)
    except BaseException:
        _stop_started(learners, replay)
        raise
    weights = make_transport(cfg, learners=learners, samplers=samplers)
    return System(
        replay=replay, samplers=samplers, learners=learners, weights=weights, scaling=make_controller(cfg)
    )


def _stop_started(learners: LearnerGroupRole, replay: ShardedReplayRole) -> None:
    """A start that failed leaves no actor behind (a sampler pool that failed has stopped its samplers)."""
    import ray

    learners.shutdown()
    for s in replay.shards:
        ray.kill(s)
