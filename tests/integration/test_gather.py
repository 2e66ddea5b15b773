"""`learners.group.gather` on a real local Ray cluster with small rank stand-ins: a rank that dies is reported as
its death (`RayActorError`, which the recipe recovers from) although its peers block or fail first."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from learners.group import gather

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0)
class Rank:
    def pid(self) -> int:
        return os.getpid()

    def value(self, x: int) -> int:
        return x

    def block(self, seconds: float) -> None:  # a peer waiting in a collective for a dead rank
        time.sleep(seconds)

    def fail(self) -> None:  # a peer whose collective lost its connection
        raise ConnectionResetError("gloo: connection reset by peer")

    def die_in(self, seconds: float) -> None:
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGKILL)


def test_values_come_back_in_rank_order(ray_cluster):
    ranks = [Rank.remote() for _ in range(3)]
    assert gather([r.value.remote(i) for i, r in enumerate(ranks)]) == [0, 1, 2]


def test_a_dead_rank_is_reported_while_its_peer_still_blocks(ray_cluster):
    blocked, dying = Rank.remote(), Rank.remote()
    ray.get([blocked.pid.remote(), dying.pid.remote()])
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        gather([blocked.block.remote(300), dying.die_in.remote(0.5)])  # rank 0 first, as the group calls them
    assert time.monotonic() - t0 < 60  # not the 300 s the blocked peer would take
    ray.kill(blocked)


def test_a_death_wins_over_a_peer_that_failed_first_and_a_bug_is_a_bug(ray_cluster):
    failing, dying = Rank.remote(), Rank.remote()
    ray.get([failing.pid.remote(), dying.pid.remote()])
    with pytest.raises(ray.exceptions.RayActorError):
        gather([failing.fail.remote(), dying.die_in.remote(1.0)])
    with pytest.raises(ray.exceptions.RayTaskError, match="connection reset"):  # no death: the error itself
        gather([failing.fail.remote(), failing.value.remote(1)], grace_s=1.0)
