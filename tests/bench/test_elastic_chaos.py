"""bench_elastic's parts without Ray: the step trace (an observer that only watches), the chaos thread that kills
nodes read from the pool's public `nodes()`, and the typed run record whose `asdict` is the JSON row."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from bench.system.elastic_watch import Chaos, ElasticRun, StepTrace, budget, recoveries
from exgrpo.core import metric_names as M

# the keys of the per-run dict that the JSON held before the record was typed
OLD_KEYS = {
    "samplers", "settle_s", "start_s", "preempt", "steps", "wall_s", "groups_per_s", "lost", "preempted",
    "preempted_samplers", "samplers_over_time", "step_times", "decisions", "first_growth_step",
    "growth_node_joins_s", "at_target_s", "kills", "replace_node_s", "node_cpu_s", "replacement_cpu_s",
    "recover_s", "seen_lost_s",
}  # fmt: skip


class Pool:
    """The two public reads the bench makes of the sampler pool: members and the node each runs on."""

    def __init__(self, where: dict[str, str]) -> None:
        self.where = dict(where)

    def members(self) -> dict[str, object]:
        return {name: object() for name in self.where}

    def nodes(self) -> dict[str, str | None]:
        return dict(self.where)


class Provider:
    """A fake autoscaler: its worker nodes (the head is not one) and a kill that takes a node's samplers with it."""

    def __init__(self, pool: Pool, workers: list[str]) -> None:
        self.pool, self.workers, self.killed_nodes = pool, workers, []

    def worker_nodes(self) -> list[dict[str, str]]:
        return [{"NodeID": n} for n in self.workers]

    def kill_node(self, node: str) -> None:
        self.killed_nodes.append(node)
        self.workers.remove(node)
        self.pool.where = {s: n for s, n in self.pool.where.items() if n != node}


def test_chaos_kills_a_quarter_of_the_worker_nodes_every_few_steps():
    pool = Pool({"s0": "head", "s1": "n1", "s2": "n1", "s3": "n2", "s4": "n3", "s5": "n4", "s6": "n5"})
    fa = Provider(pool, ["n1", "n2", "n3", "n4", "n5"])
    trace = StepTrace(pool)
    chaos = Chaos(trace, pool, every=2, fa=fa)
    chaos.start()
    try:
        for step in range(5):  # kills after the records of steps 2 and 4, not after step 0
            trace.on_step(record={M.STEP: step, M.SAMPLERS_TARGET: 7})
            if step in (2, 4):
                deadline = time.monotonic() + 10
                while len(chaos.kills) < step // 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
    finally:
        chaos.stop.set()
        chaos.join(timeout=10)
    assert not chaos.is_alive()
    # step 2: 5 worker nodes -> 2 killed (n1 with two samplers, n2); step 4: 3 left -> 1 (n3); the head never
    assert fa.killed_nodes == ["n1", "n2", "n3"] and chaos.killed == 3
    assert [(k["nodes"], k["samplers"], k["live"]) for k in chaos.kills] == [(2, 3, 7), (1, 1, 4)]
    assert trace.samplers == [7, 7, 7, 4, 4] and trace.steps == [0, 1, 2, 3, 4]  # live before each kill


def test_recoveries_wait_until_the_pool_noticed_and_is_back_at_its_count():
    trace = StepTrace(Pool({}))
    trace.times, trace.samplers, trace.targets = [1.0, 2.0, 3.0, 4.0, 5.0], [4, 4, 3, 4, 4], [4.0] * 5
    kills = [{"t": 1.5, "nodes": 1, "samplers": 1, "live": 4}]
    assert recoveries(trace, kills, end=9.0) == [2.5]  # noticed at 3.0 (3 live), back at 4.0
    assert recoveries(trace, [{**kills[0], "t": 4.5}], end=9.0) == [0.5]  # never noticed: the next record


def _run(**changes: object) -> ElasticRun:
    base = ElasticRun(
        arm="fixed", samplers=4, settle_s=0.0, start_s=1.0, preempt=True, steps=10, wall_s=20.0,
        groups_per_s=8.0, lost=0, preempted=1, preempted_samplers=2, samplers_over_time=(4, 2, 4),
        step_times=(1.0, 2.0, 3.0), decisions=((1, 1, 4, "grow"),), first_growth_step=None,
        growth_node_joins_s=(), at_target_s=None, kills=({"at_s": 5.0, "nodes": 1, "samplers": 2, "live": 4},),
        replace_node_s=(6.0,), node_cpu_s=None, replacement_cpu_s=None, recover_s=(4.0,), seen_lost_s=(0.5,),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_a_run_is_a_frozen_record_whose_json_keeps_the_old_keys():
    run = _run()
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.lost = 3  # type: ignore[misc]
    row = json.loads(json.dumps(dataclasses.asdict(run)))
    assert set(row) == OLD_KEYS | {"arm", "round"}
    assert row["kills"] == [{"at_s": 5.0, "nodes": 1, "samplers": 2, "live": 4}]
    assert (run.name, _run(arm="elastic", samplers=8).name) == ("4", "elastic")
    assert budget(run) == pytest.approx(2 / 4 * 4.0 / 20.0)  # preempted share x time back, over the wall
