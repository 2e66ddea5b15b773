"""A transport's `prepare(version)` queues that version's export; `broadcast(version)` sends that one.

With `async.overlap_update` the driver prepares t+1 and may prepare t+2 before it broadcasts t+1: each
broadcast must send the export made behind its own update (a later prepare once overwrote an earlier one,
so t+1 went out as a fresh export taken behind t+2's update). Small fakes for the learner group and the
pool; the object-store transport's refs are real (a local Ray cluster).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray

from exgrpo.core.roles import Done
from exgrpo.transport.broadcast import ObjectStoreTransport, VLLMTransport


class Exports:
    """A learner group whose every export is numbered: export k holds {"export": k}."""

    def __init__(self) -> None:
        self.exports = 0
        self.pushes: list[tuple[int, tuple[str, ...]]] = []  # (version, member ids) per start_push_weights

    def get_weights_ref(self) -> Any:
        self.exports += 1
        return ray.put({"export": self.exports})

    def start_push_weights(self, *, version: int, members, timeout_s=None) -> Done:
        self.pushes.append((version, tuple(members)))
        return Done({"apply_s": [0.01 * version] * len(members)})

    def version(self) -> int:
        return 0


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file


class Recorder:
    """A sampler's object-store loads, recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []  # (version, export number)

    def load_weights(self, *, weights: dict, version: int) -> float:
        self.seen.append((version, weights["export"]))
        return 0.0

    def get(self) -> list[tuple[int, int]]:
        return self.seen


Loads = ray.remote(num_cpus=0)(Recorder)


class Members:
    def __init__(self, members: dict[str, Any]) -> None:
        self.now = members

    def members(self) -> dict[str, Any]:
        return dict(self.now)


@pytest.mark.integration
def test_object_store_sends_each_version_the_export_prepared_for_it(ray_cluster):
    learners, sampler = Exports(), Loads.remote()
    transport = ObjectStoreTransport(learners=learners, samplers=Members({"s0": sampler}))
    transport.prepare(version=1)  # export 1, behind update 1
    transport.prepare(version=2)  # export 2, behind update 2: must not replace version 1's
    transport.broadcast(version=1)
    transport.broadcast(version=2)
    transport.broadcast(version=3)  # nothing prepared: exported now (export 3)
    transport.prepare(version=4)  # export 4, never broadcast: dropped once a later version goes out
    transport.broadcast(version=5)  # export 5
    transport.broadcast(version=4)  # an older version after a newer one: not the stale export 4
    assert ray.get(sampler.get.remote()) == [(1, 1), (2, 2), (3, 3), (5, 5), (4, 6)]
    assert learners.exports == 6


@ray.remote(num_cpus=0)
class FailingLoads:
    """A sampler whose loads raise until `heal`, as a sampler whose engine cannot take the weights."""

    def __init__(self) -> None:
        self.ok = False

    def load_weights(self, *, weights: dict, version: int) -> float:
        if not self.ok:
            raise RuntimeError(f"cannot load version {version}")
        return 0.0

    def heal(self) -> None:
        self.ok = True


def _drain(transport: ObjectStoreTransport, version: int) -> None:
    """Broadcast `version`, then wait for its loads and collect them (as the next broadcast would)."""
    transport.broadcast(version=version)
    ray.wait(transport._loads._refs, num_returns=len(transport._loads._refs), timeout=30)
    transport._loads.take()


@pytest.mark.integration
def test_failed_loads_in_a_row_stop_the_run_with_the_cause_and_a_success_resets_the_count(ray_cluster):
    from exgrpo.transport.broadcast import WeightSyncFailed

    sampler = FailingLoads.remote()
    transport = ObjectStoreTransport(learners=Exports(), samplers=Members({"s0": sampler}), max_failures=3)
    _drain(transport, 1)
    _drain(transport, 2)
    assert transport._loads.failed_in_a_row == 2
    ray.get(sampler.heal.remote())
    _drain(transport, 3)  # a load that succeeds: the count starts again
    assert transport._loads.failed_in_a_row == 0 and transport._loads.failures == 2
    broken = FailingLoads.remote()
    transport = ObjectStoreTransport(learners=Exports(), samplers=Members({"s0": broken}), max_failures=3)
    _drain(transport, 1)
    _drain(transport, 2)
    with pytest.raises(
        WeightSyncFailed, match=r"3 weight loads/updates failed in a row.*cannot load version 3"
    ):
        _drain(transport, 3)


class PushFails:
    """A pending push that failed (rank 0's report of a world that could not open or a send that timed out)."""

    def wait(self, *, timeout_s: float) -> bool:
        return True

    def result(self) -> Any:
        raise ray.exceptions.GetTimeoutError("opening the weight-transfer world took more than 300 s")


class BrokenCollective(Exports):
    """A learner group whose every collective push fails (its object-store exports work)."""

    def start_push_weights(self, *, version: int, members, timeout_s=None) -> Any:
        self.pushes.append((version, tuple(members)))
        return PushFails()


@ray.remote(num_cpus=0)
class IdleSampler(Recorder):
    """A sampler that takes object-store loads and runs no weight-transfer call."""

    def weight_call(self) -> None:
        return None

    def join_world(self, *, deadline: float) -> bool:
        self.joined = getattr(self, "joined", 0) + 1
        return True

    def joins(self) -> int:
        return getattr(self, "joined", 0)


@pytest.mark.integration
def test_a_collective_path_that_fails_every_version_stops_the_run_though_each_fallback_loads(ray_cluster):
    """The fallback loads succeed at every version, so they must not reset the count of failed broadcasts:
    at `max_failures` failed versions in a row the run stops with the cause (it used to train on, each
    version paying a failed world and a fallback)."""
    from exgrpo.transport.broadcast import WeightSyncFailed

    sampler = IdleSampler.remote()
    transport = VLLMTransport(learners=BrokenCollective(), samplers=Members({"s0": sampler}), max_failures=3)
    _drain(transport, 1)  # type: ignore[arg-type]
    _drain(transport, 2)  # type: ignore[arg-type]
    assert ray.get(sampler.get.remote()) == [(0, 1), (0, 2)]  # both fallbacks loaded
    with pytest.raises(WeightSyncFailed, match=r"failed 3 versions in a row.*more than 300 s.*object_store"):
        _drain(transport, 3)  # type: ignore[arg-type]


@pytest.mark.integration
def test_the_object_store_setting_moves_a_failing_collective_run_there_for_good(ray_cluster, caplog):
    learners, sampler = BrokenCollective(), IdleSampler.remote()
    transport = VLLMTransport(
        learners=learners, samplers=Members({"s0": sampler}), max_failures=2, on_failure="object_store"
    )
    for version in (1, 2, 3, 4):
        _drain(transport, version)  # type: ignore[arg-type]
    assert transport.switched and transport.fallbacks == 2
    assert [v for v, _ in learners.pushes] == [1, 2]  # no collective push after the switch
    assert "the collective transport is off for the rest of this run" in caplog.text
    assert [v for v, _ in ray.get(sampler.get.remote())] == [
        0,
        0,
        3,
        4,
    ]  # fallbacks tag the learner's version
    late = IdleSampler.remote()
    transport.catch_up(late)  # a newcomer gets the last published weights
    ray.wait(transport._loads._refs, num_returns=len(transport._loads._refs), timeout=30)
    assert ray.get(late.get.remote()) == [(4, learners.exports)]


@pytest.mark.integration
def test_collective_sends_each_version_to_the_members_it_was_prepared_for(ray_cluster):
    learners, pool = Exports(), Members({"s0": IdleSampler.remote(), "s1": IdleSampler.remote()})
    transport = VLLMTransport(learners=learners, samplers=pool)
    transport.prepare(version=1)
    pool_s0 = pool.now["s0"]
    pool.now = {"s1": pool.now["s1"]}  # s0 leaves between the two prepares
    transport.prepare(version=2)
    transport.broadcast(version=1)
    assert transport.last == {"apply_s": [0.01, 0.01]}  # the push prepared for version 1, to both
    transport.broadcast(version=2)
    assert transport.last == {"apply_s": [0.02]}
    transport.broadcast(version=3)  # nothing prepared: pushed now, to the members of now
    assert learners.pushes == [(1, ("s0", "s1")), (2, ("s1",)), (3, ("s1",))]
    # each new world was acknowledged before its push was queued: {s0, s1} for version 1, {s1} for 2
    assert ray.get([h.joins.remote() for h in (pool_s0, pool.now["s1"])]) == [1, 2]
