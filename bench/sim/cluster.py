"""Runs of the simulated cluster (`bench/sim/roles.py`) under the real driver, with what they measured.

`sim_system` builds one system from the builder parts of `exgrpo.runtime.parts` with `SimSampler`s and a
`SimLearnerGroup` in place of the engines and DeepSpeed ranks; `SimCluster` keeps it and runs a fresh real
`exgrpo.loop.driver.Driver` over it per configuration. What a run reports: docs/benchmarks.md, "Simulated
cluster".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.sim.roles import (
    CostModel,
    Difficulty,
    SimLearnerGroup,
    busy_fraction,
    sampler_factory,
    sim_prompts,
)
from exgrpo.core import metric_names as M
from exgrpo.core.config import Config
from exgrpo.loop.observer import Observer

if TYPE_CHECKING:
    from exgrpo.runtime.assembly import System


@dataclass
class SimRun:
    """What one simulated run measured (real seconds; steady state = the steps after `warmup`)."""

    samplers: int
    learners: int
    eta: int
    replay: bool
    overlap: bool  # async.overlap_update
    steps: int
    warmup: int
    step_s: float  # mean period between the starts of two updates on the learners, steady state
    record_step_s: float  # the same from the driver's step records (they lag the updates by a varying amount)
    gen_s: float  # generation of one step's rollouts spread over the samplers (cost model)
    update_s: float  # one update (cost model, per learner)
    ideal_s: float  # max(gen_s, update_s) for eta >= 1, gen_s + update_s for eta = 0
    learner_idle: float  # share of the steady-state window the learners were not busy (mean over ranks)
    staleness: dict[int, int]  # training version - sampling version -> groups (every step)
    groups_per_step: list[int]
    rollouts_per_step: float  # fresh rollouts generated per step (K per fresh, K - 1 per replay request)
    replayed_per_step: float  # replay groups per step
    replaced: int  # replay requests re-issued as fresh at pull time (question retired in flight), all steps
    trajectories: int  # stored trajectories in the shards at the end
    active: int  # replayable questions at the end
    driver: dict[str, float]  # mean seconds per step: wait, update, gap, sync, idle (driver records)
    calls: dict[str, float]  # mean seconds per steady-state step inside each role verb the driver called
    cpu: dict[
        str, float
    ]  # CPU seconds per steady-state step: driver, shards, samplers, learners, ray, machine

    @property
    def ideal_max_s(self) -> float:
        return max(self.gen_s, self.update_s)

    @property
    def ratio(self) -> float:
        return self.step_s / self.ideal_s


class _Timed:
    """Forwards every attribute to `inner`; the named methods also add their wall seconds to `seconds`
    (measurement only: the driver sees the same object behaviour)."""

    def __init__(self, inner: Any, names: Sequence[str], seconds: dict[str, float]) -> None:
        self._inner, self._names, self._seconds = inner, set(names), seconds

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0

        return timed


def _cpu_s(pids: Sequence[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


DRIVER_KEYS = {  # SimRun.driver: the driver's step-record keys averaged over the steady state
    "wait": M.WAIT_TIME,
    "update": M.UPDATE_TIME,
    "gap": M.UPDATE_GAP,
    "sync": M.SYNC_TIME,
    "idle": M.IDLE_TIME,
}
CPU_KEYS = ("driver", "shards", "samplers", "learners", "ray", "machine")


class Measure(Observer):
    """Every batch's composition and staleness; CPU and role-verb seconds (`seconds`, filled by the
    `_Timed` roles) at the ends of the steady-state window (the steps `warmup - 1` and `steps - 1`)."""

    def __init__(
        self, *, warmup: int, steps: int, pids: dict[str, list[int]], seconds: dict[str, float]
    ) -> None:
        import psutil

        self.warmup, self.steps, self.pids, self.seconds = warmup, steps, pids, seconds
        self.me = psutil.Process()
        ours = {p for v in pids.values() for p in v}
        self.ray_pids = [p.pid for p in self.me.children(recursive=True) if p.pid not in ours]  # raylet, gcs
        self.marks: dict[int, dict[str, Any]] = {}
        self.staleness: dict[int, int] = {}
        self.sizes: list[int] = []
        self.rollouts: list[int] = []
        self.replayed: list[int] = []

    def on_batch(self, *, batch: Any) -> None:
        self.sizes.append(len(batch.groups))
        self.rollouts.append(sum(len(g.trajectories) - (g.kind == "replay") for g in batch.groups))
        self.replayed.append(sum(g.kind == "replay" for g in batch.groups))
        for g in batch.groups:
            lag = batch.version - g.policy_version
            self.staleness[lag] = self.staleness.get(lag, 0) + 1

    def on_step(self, *, record: dict[str, Any]) -> None:
        import psutil

        step = int(record[M.STEP])
        if step in (self.warmup - 1, self.steps - 1):
            c = psutil.cpu_times()
            self.marks[step] = {
                "t": time.monotonic(),
                "seconds": dict(self.seconds),
                "driver": _cpu_s([self.me.pid]),
                "shards": _cpu_s(self.pids["shards"]),
                "samplers": _cpu_s(self.pids["samplers"]),
                "learners": _cpu_s(self.pids["learners"]),
                "ray": _cpu_s(self.ray_pids),
                "machine": c.user + c.system + getattr(c, "nice", 0.0),
            }


def sim_system(
    cfg: Config, *, cost: CostModel, difficulty: Difficulty, response_len: int, seed: int
) -> System:
    """The run's real parts (`make_replay`, `make_samplers`, `make_transport`, `make_controller`) around
    simulated samplers and learners. No start checks (`exgrpo.runtime.preflight.check_start`): the
    simulated roles load no model and reserve no CPU or GPU."""
    from exgrpo.runtime.assembly import System
    from exgrpo.runtime.env import remote_actor
    from exgrpo.runtime.parts import make_controller, make_replay, make_samplers, make_transport

    replay = make_replay(cfg)
    learners = SimLearnerGroup(num=cfg.learners.num, cost=cost, make_actor=remote_actor)
    spawn = sampler_factory(
        cost,
        replay=replay,
        difficulty=difficulty,
        response_len=response_len,
        seed=seed,
        num_cpus=cfg.samplers.num_cpus,
    )
    samplers = make_samplers(cfg, spawn=spawn)
    weights = make_transport(cfg, learners=learners, samplers=samplers)
    return System(
        replay=replay, samplers=samplers, learners=learners, weights=weights, scaling=make_controller(cfg)
    )


class SimCluster:
    """One simulated system (real shards, pool, transport; simulated samplers and learners) for many runs.

    `run(eta=, replay=, steps=)` drives a fresh real `Driver` over it; between runs the shards are restored
    to their empty snapshot, collection is switched off, the learners go back to version 0 and version 0
    is broadcast, so every run starts from the same state without restarting 64 actor processes.
    """

    def __init__(
        self,
        *,
        samplers: int,
        learners: int,
        cost: CostModel,
        questions_per_step: int = 128,
        rollouts_per_question: int = 8,
        requests_per_call: int = 2,
        shards: int = 2,
        difficulty: Difficulty | None = None,
        response_len: int = 32,
        questions: int = 4096,
        seed: int = 0,
        overrides: Sequence[str] = (),
    ) -> None:
        import tempfile

        self.cost, self.samplers, self.learners = cost, samplers, learners
        self.base = [
            f"trainer.questions_per_step={questions_per_step}",
            f"trainer.rollouts_per_question={rollouts_per_question}",
            f"trainer.seed={seed}",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            f"samplers.num={samplers}",
            "samplers.num_cpus=0",
            f"samplers.requests_per_call={requests_per_call}",
            f"learners.num={learners}",
            "learners.num_cpus=0.01",  # the sim ranks take 0; this passes validation
            f"replay.num_shards={shards}",
            "replay.wal=false",
            "async.weight_sync=object_store",
            "logging.progress=false",
            "logging.plots=false",
            "logging.report=false",
            "logging.ray_metrics=false",
            *overrides,
        ]
        self.prompts = sim_prompts(questions)
        self.system: Any = sim_system(
            self.config(eta=1, replay=True, steps=1),
            cost=cost,
            difficulty=difficulty or Difficulty(),
            response_len=response_len,
            seed=seed,
        )
        self._empty = tempfile.mkdtemp(prefix="sim-empty-replay-")
        self.system.replay.snapshot(path=self._empty)

    def config(self, *, eta: int, replay: bool, steps: int, overlap: bool = True) -> Any:
        from exgrpo.core.config_files import load_config

        return load_config(
            None,
            [
                *self.base,
                f"async.max_staleness={eta}",
                f"replay.enabled={str(replay).lower()}",
                f"trainer.steps={steps}",
                f"async.overlap_update={str(overlap).lower()}",
            ],
        )

    def scale(self, samplers: int) -> None:
        """Grow or drain the real pool (`SamplerPool.scale`)."""
        self.system.samplers.scale(num=samplers)
        self.samplers = samplers

    def reset(self) -> None:
        self.system.replay.restore(path=self._empty)
        self.system.replay.set_collect(on=False)
        self.system.learners.reset()
        self.system.weights.broadcast(version=0)

    def pids(self) -> dict[str, list[int]]:
        import ray

        def alive(
            refs: list[Any],
        ) -> list[int]:  # a sampler Ray killed (e.g. for memory) is replaced by the pool
            out = []
            for ref in refs:
                try:
                    out.append(ray.get(ref, timeout=60))
                except (ray.exceptions.RayError, TimeoutError):
                    continue
            return out

        s = self.system
        members = list(s.samplers.members().values())
        return {
            "shards": alive([h.pid.remote() for h in s.replay.shards]),
            "samplers": alive([h.pid.remote() for h in members]),
            "learners": alive([a.pid.remote() for a in s.learners.actors]),
        }

    def run(
        self,
        *,
        eta: int,
        replay: bool,
        steps: int,
        warmup: int = 2,
        overlap: bool = True,
    ) -> SimRun:
        """A fresh real `Driver` over the system for `steps` steps; what its steady state measured."""
        from exgrpo.loop.driver import Driver, Roles

        if steps <= warmup:
            raise ValueError(
                f"steps={steps} must exceed warmup={warmup} (the steady state is what follows it)"
            )
        self.reset()
        cfg = self.config(eta=eta, replay=replay, steps=steps, overlap=overlap)
        s, seconds = self.system, dict[str, float]()
        measure = Measure(warmup=warmup, steps=steps, pids=self.pids(), seconds=seconds)
        driver = Driver(
            cfg=cfg,
            roles=Roles(
                rollouts=_Timed(s.samplers, ("submit", "poll"), seconds),
                replay=_Timed(s.replay, ("sample_questions", "pull_batch"), seconds),
                learners=_Timed(s.learners, ("start_update",), seconds),
                weights=_Timed(s.weights, ("broadcast",), seconds),
            ),
            train=self.prompts,
            observer=measure,
            stall_timeout_s=120.0,
        )
        records = driver.train()
        return self._result(records, measure, eta=eta, replay=replay, overlap=overlap)

    def _result(
        self,
        records: list[dict[str, Any]],
        m: Measure,
        *,
        eta: int,
        replay: bool,
        overlap: bool,
    ) -> SimRun:
        """The run's `SimRun`: its window runs from the start of update warmup - 1 to the start of update
        steps - 1 (n updates)."""
        s, warmup, steps = self.system, m.warmup, m.steps
        a, b = m.marks[warmup - 1], m.marks[steps - 1]
        n = steps - warmup
        starts = s.learners.update_starts()
        t_a, t_b = starts[warmup - 1], starts[steps - 1]
        idle = 1.0 - float(np.mean([busy_fraction(iv, t_a, t_b) for iv in s.learners.busy()]))
        steady = records[warmup:]
        roll = float(np.mean(m.rollouts[warmup:]))
        stats = s.replay.stats()
        return SimRun(
            samplers=self.samplers,
            learners=self.learners,
            eta=eta,
            replay=replay,
            overlap=overlap,
            steps=steps,
            warmup=warmup,
            step_s=(t_b - t_a) / n,
            record_step_s=(b["t"] - a["t"]) / n,
            gen_s=self.cost.rollout_real_s(1) * roll / self.samplers,
            update_s=self.cost.update_real_s(self.learners),
            ideal_s=self.cost.ideal_step_s(
                samplers=self.samplers, learners=self.learners, rollouts=roll, eta=eta
            ),
            learner_idle=idle,
            staleness=dict(sorted(m.staleness.items())),
            groups_per_step=m.sizes,
            rollouts_per_step=roll,
            replayed_per_step=float(np.mean(m.replayed[warmup:])),
            replaced=int(sum(r[M.REPLACED] for r in records)),
            trajectories=stats.trajectories,
            active=stats.active,
            driver={k: float(np.mean([r[v] for r in steady])) for k, v in DRIVER_KEYS.items()},
            calls={k: (b["seconds"].get(k, 0.0) - a["seconds"].get(k, 0.0)) / n for k in b["seconds"]},
            cpu={k: (b[k] - a[k]) / n for k in CPU_KEYS},
        )

    def shutdown(self) -> None:
        import shutil

        self.system.shutdown()
        shutil.rmtree(self._empty, ignore_errors=True)
