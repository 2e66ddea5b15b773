"""Elastic samplers on Ray's real autoscaler (fake multi-node provider, one machine;
`bench/sim/autoscaler.py`).

The run is the simulated cluster (`bench/sim`: the real driver, replay shards, sampler pool, transport and
controller; sleeping samplers of 1 CPU each, sleeping learners of 0 CPUs) with `samplers.autoscale` on. The
head has one CPU, for the first sampler; every further sampler needs a worker node that the autoscaler launches.

- fast: it starts with no worker node; the learners wait for generation, the policy grows the fleet to 3,
  the pool asks the autoscaler for 3 sampler bundles and the 2 nodes the head cannot hold arrive while the
  steps go on.
- slow: a node is killed mid-step (its raylet SIGKILLed): the run heals, nothing lost, the death counted as a
  preemption; a node is drained with a deadline (a spot notice): its sampler takes no request from then on,
  a replacement starts elsewhere, the node is reclaimed at its deadline with nothing lost; the learners
  become the bottleneck: the fleet shrinks to 1 and the autoscaler terminates the idle nodes.

Every step's batch must be whole (`replay/n_fresh` = questions per step): a lost group would stall the step
(the driver waits for every admitted request) or shrink its batch.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

from bench.sim.autoscaler import FakeAutoscaler
from exgrpo.core import metric_names as M
from exgrpo.loop.observer import Observer

pytestmark = [pytest.mark.integration]  # the slow cases are marked one by one

B, K, MAX = 8, 4, 3
EVENTS: list[tuple[float, str]] = []  # the module's node launches, kills, drains, terminations, decisions


@pytest.fixture(scope="module")
def elastic():
    import conftest

    from bench.sim.cluster import SimCluster
    from bench.sim.roles import CostModel

    if conftest._CLUSTER:  # the shared local cluster of earlier modules: this module runs its own
        conftest._stop_cluster()
    fa = FakeAutoscaler(max_workers=MAX + 1, idle_timeout_minutes=0.1, head_cpus=1)
    fa.start()
    try:
        ray.init(address=fa.address, namespace="exgrpo", logging_level="ERROR", configure_logging=False)
        # one sampler generates a step's 32 rollouts in 1.2 s; the update takes 0.2 s: the learners wait
        cost = CostModel(gen_s=800.0, update_s=130.0, time_scale=0.0015, batch_rollouts=B * K)
        sim = SimCluster(
            samplers=1,
            learners=1,
            cost=cost,
            questions_per_step=B,
            rollouts_per_question=K,
            requests_per_call=2,
            shards=1,
            questions=2048,
            overrides=[
                "samplers.num_cpus=1",
                "samplers.autoscale=true",
                "samplers.autoscale_min=1",
                f"samplers.autoscale_max={MAX}",
                "samplers.autoscale_hysteresis=1",
                "samplers.autoscale_cooldown=2",
                "samplers.preempt_grace_s=2",
            ],
        )
        fa.note(f"initial sampler placed: {len(fa.worker_nodes())} worker node(s)")
        yield fa, sim, cost
        sim.shutdown()
    finally:
        ray.shutdown()
        fa.stop()
        EVENTS.extend(fa.events)
        print("\nelastic autoscaler events (s since the head started):")
        for t, what in fa.events:
            print(f"  {t:7.1f}  {what}")


class Watch(Observer):
    """Records every step and notes node-count changes; `at` maps a step to an action run after it."""

    def __init__(self, fa: FakeAutoscaler, sim: Any, at: dict[int, Any] | None = None) -> None:
        self.fa, self.sim, self.at = fa, sim, at or {}
        self.records: list[dict[str, Any]] = []
        self.nodes = len(fa.worker_nodes())
        self.target: float | None = None

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.records.append(record)
        if record[M.SAMPLERS_TARGET] != self.target and self.target is not None:
            self.fa.note(
                f"step {record[M.STEP]}: target {self.target:g} -> {record[M.SAMPLERS_TARGET]:g} samplers"
            )
        self.target = record[M.SAMPLERS_TARGET]
        nodes = len(self.fa.worker_nodes())
        if nodes != self.nodes:
            self.fa.note(f"step {record[M.STEP]}: worker nodes {self.nodes} -> {nodes}")
            self.nodes = nodes
        if (action := self.at.get(int(record[M.STEP]))) is not None:
            action()


def run(sim: Any, watch: Watch, steps: int) -> list[dict[str, Any]]:
    from exgrpo.loop.driver import Driver, Roles

    sim.reset()
    driver = Driver(
        cfg=sim.config(eta=1, replay=False, steps=steps),
        roles=Roles(
            rollouts=sim.system.samplers,
            replay=sim.system.replay,
            learners=sim.system.learners,
            weights=sim.system.weights,
        ),
        train=sim.prompts,
        observer=watch,
        stall_timeout_s=120.0,
    )
    driver.train()
    for d in driver.fleet.decisions:
        watch.fa.note(f"step {d.step}: policy {d.old} -> {d.new} samplers ({d.reason})")
    assert len(watch.records) == steps
    assert all(r[M.N_FRESH] + r[M.N_REPLAY] == B for r in watch.records), "a step lost a group"
    return watch.records


def test_the_policy_grows_the_fleet_and_the_autoscaler_launches_its_nodes(elastic):
    fa, sim, _ = elastic
    assert len(fa.worker_nodes()) == 0  # the initial sampler is on the head
    watch = Watch(fa, sim)
    records = run(sim, watch, steps=14)
    assert max(r[M.SAMPLERS_TARGET] for r in records) == MAX
    fa.wait_nodes(MAX - 1, timeout_s=30)
    sim.system.samplers.wait_started(timeout_s=30)
    assert len(sim.system.samplers.members()) == MAX
    fa.note(f"grown: {MAX} samplers on {len(fa.worker_nodes())} worker nodes")


def _sampler_node(fa: FakeAutoscaler, sim: Any) -> str:
    """A worker node running a live sampler (never the head)."""
    pool, workers = sim.system.samplers, {n["NodeID"] for n in fa.worker_nodes()}
    return next(n for a, n in pool._nodes.items() if n in workers and a not in pool._draining)


@pytest.mark.slow
def test_a_node_killed_mid_step_heals_with_nothing_lost(elastic):
    fa, sim, _ = elastic
    pool = sim.system.samplers
    before = (pool.preemptions, pool.restarts)
    watch = Watch(fa, sim, at={3: lambda: fa.kill_node(_sampler_node(fa, sim))})
    run(sim, watch, steps=16)
    assert pool.preemptions == before[0] + 1 and pool.restarts == before[1]
    fa.wait_nodes(MAX - 1, timeout_s=60)
    pool.wait_started(timeout_s=60)
    fa.note(f"healed: {len(pool.members())} samplers, {len(fa.worker_nodes())} worker nodes")


@pytest.mark.slow
def test_a_node_drained_with_a_deadline_stops_taking_requests_and_hands_back(elastic):
    fa, sim, _ = elastic
    pool = sim.system.samplers
    before = pool.preemptions
    seen: dict[str, Any] = {}

    def drain() -> None:
        node = _sampler_node(fa, sim)
        seen["node"], seen["t"] = node, time.monotonic()
        assert fa.drain_node(node, deadline_s=6.0)

    def after_drain() -> (
        None
    ):  # a step later (>= 1 s): the sampler on the drained node is out of the rotation
        node = seen["node"]
        live_on_node = [a for a in pool._live() if pool._nodes.get(a) == node]
        seen["live_on_node"] = live_on_node
        fa.note(
            f"{time.monotonic() - seen['t']:.1f} s after the drain: {len(live_on_node)} live samplers on it"
        )

    def reclaim() -> None:  # the deadline: the provider takes the node back
        left = 6.0 - (time.monotonic() - seen["t"])
        time.sleep(max(0.0, left))
        fa.kill_node(seen["node"])

    watch = Watch(fa, sim, at={2: drain, 4: after_drain, 6: reclaim})
    run(sim, watch, steps=16)
    assert seen["live_on_node"] == []
    assert pool.preemptions == before + 1
    fa.wait_nodes(MAX - 1, timeout_s=60)


@pytest.mark.slow
def test_the_learners_become_the_bottleneck_the_fleet_shrinks_and_idle_nodes_go(elastic):
    fa, sim, cost = elastic
    from dataclasses import replace

    sim.system.learners.set_cost(replace(cost, update_s=2000.0))  # 3 s updates: generation waits on them
    try:
        watch = Watch(fa, sim)
        records = run(sim, watch, steps=8)
    finally:
        sim.system.learners.set_cost(cost)
    assert records[-1][M.SAMPLERS_TARGET] < MAX
    assert len(sim.system.samplers.members()) == records[-1][M.SAMPLERS_TARGET]
    t = fa.wait_nodes(int(records[-1][M.SAMPLERS_TARGET]) - 1, timeout_s=90, at_most=True)  # one on the head
    fa.note(
        f"shrunk to {records[-1][M.SAMPLERS_TARGET]:g} samplers; idle nodes terminated {t:.1f} s after the run"
    )
