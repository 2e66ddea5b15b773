"""The simulated cluster (`bench/sim/roles.py`) on a real local Ray cluster: the real driver, replay shards,
sampler pool and object-store transport with 8 sleeping samplers and 2 sleeping learners.

Cost model (time_scale 0.003, B = 32, K = 8): one sampler needs 800 simulated s for a batch, so 8 samplers
take 100 s = 0.3 real s per step; one learner needs 440 s, so 2 take 220 s = 0.66 s. Ideal step: 0.66 s
at eta = 1 (generation hides under the update), 0.96 s at eta = 0; predicted speed-up 0.96 / 0.66 = 1.45.
The driver's plumbing adds about 0.1 s per step on two busy cores (ratios 1.18-1.31 seen at time_scale 0.002).
"""

from __future__ import annotations

import pytest

from bench.sim.cluster import SimCluster
from bench.sim.roles import CostModel

# slow: 78 s in CI, and its timed block holds the other worker idle; it checks the simulated cluster (a harness)
pytestmark = [pytest.mark.integration, pytest.mark.timed, pytest.mark.slow]

B, K, STEPS = 32, 8, 6
# measured steady-state step <= FACTOR[eta] x ideal. The driver's plumbing (broadcast, submit, poll, pull, the
# update call) is ~0.1 s per step on two idle cores; at eta = 0 every bit of it is on the critical path, and a CI
# machine under load measured 1.62 x ideal there (0.58 s of plumbing per step). At eta = 1 it mostly hides
# under the update (1.10 on that machine).
FACTOR = {1: 1.5, 0: 2.0}


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    cost = CostModel(gen_s=800.0, update_s=440.0, time_scale=0.003, batch_rollouts=B * K)
    c = SimCluster(
        samplers=8,
        learners=2,
        cost=cost,
        questions_per_step=B,
        rollouts_per_question=K,
        requests_per_call=2,
        questions=1024,
    )
    c.run(eta=1, replay=True, steps=3, warmup=2)  # the actors' first calls are slow (imports, connections)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def runs(cluster, alone):
    # alone: the step times are compared with the cost model, which a test in the other worker would perturb (the
    # cluster's start and warm-up above overlap it)
    with alone():
        return {
            (eta, replay): cluster.run(eta=eta, replay=replay, steps=STEPS, warmup=2)
            for eta, replay in ((1, True), (1, False), (0, True))
        }


def test_ideal_of_the_cost_model_derived_by_hand(cluster):
    cost = cluster.cost
    assert cost.rollout_real_s(B * K) == pytest.approx(2.4)  # 800 s x 0.003 for one sampler
    assert cost.ideal_step_s(samplers=8, learners=2, rollouts=B * K, eta=1) == pytest.approx(0.66)
    assert cost.ideal_step_s(samplers=8, learners=2, rollouts=B * K, eta=0) == pytest.approx(0.96)


@pytest.mark.parametrize("key", [(1, True), (1, False), (0, True)])
def test_every_step_trains_B_groups_within_eta(runs, key):
    run = runs[key]
    eta = key[0]
    assert run.groups_per_step == [B] * STEPS
    assert max(run.staleness) <= eta
    assert sum(run.staleness.values()) == B * STEPS
    if eta == 1:  # pipelined: after step 0 every group was sampled one version back
        assert run.staleness.get(1, 0) >= B * (STEPS - 2)


@pytest.mark.parametrize("key", [(1, True), (1, False), (0, True)])
def test_step_time_within_factor_of_ideal(runs, key):
    run = runs[key]
    assert 0.97 * run.ideal_s <= run.step_s <= FACTOR[key[0]] * run.ideal_s, run
    assert 0.0 <= run.learner_idle < 1.0


def test_replay_fills_when_on_and_stays_empty_when_off(runs):
    on, off = runs[(1, True)], runs[(1, False)]
    assert on.trajectories > 0 and on.active > 0 and on.replayed_per_step > 0
    assert off.trajectories == 0 and off.active == 0 and off.replayed_per_step == 0
    assert off.rollouts_per_step == B * K  # no replay request (K - 1 rollouts) was issued
    assert on.rollouts_per_step < B * K


def test_eta1_is_faster_than_eta0(runs):
    # predicted (0.3 + 0.66) / 0.66 = 1.45; the driver's per-step plumbing is paid in both
    assert runs[(0, True)].step_s / runs[(1, True)].step_s >= 1.2
