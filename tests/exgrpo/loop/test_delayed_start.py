"""The delayed start of replay and the clip switch; on-policy GRPO (replay off) never starts, stores nor retires.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

from collections import Counter

import pytest
from loop_harness import (
    build,
    check_batches,
    config,
    qnum,
)

from exgrpo.core import metric_names as M


@pytest.mark.parametrize("remove_clip", [True, False])
def test_delayed_start_latches_and_clip_is_removed_from_the_next_step(remove_clip):
    # fresh solve ratio per step (eta = 0: step t sampled at version t): 1/4, 1/4, 2/4, 2/4, 0, 0
    # threshold 0.3: step 2 (0.5 > 0.3) triggers; it is still trained with clip=True, step 3 on without;
    # the ratio falling to 0 later does not switch replay off.
    def reward(r, i, v):
        return float(i < (1 if v < 2 else 2 if v < 4 else 0))

    cfg = config("replay.start_solve_ratio=0.3", f"loss.remove_clip_after_replay={str(remove_clip).lower()}")
    driver, rollouts, learners, shards = build(cfg, reward)
    records = driver.train()
    check_batches(records, learners)
    assert [r[M.SOLVE_RATIO] for r in records] == [0.25, 0.25, 0.5, 0.5, 0.0, 0.0]
    assert [r[M.REPLAY_STARTED] for r in records] == [0, 0, 1, 1, 1, 1]
    clip = [b.clip for b in learners.batches]
    assert clip == ([True, True, True, False, False, False] if remove_clip else [True] * 6)
    assert driver.scheduler.delayed_start.started and all(s.collect for s in shards)
    # trajectories are stored from step 3's groups on (collection switched on after step 2's update);
    # step 3 is scheduled after the switch but the pool is still empty, so replay begins at step 4
    assert [r[M.TRAJECTORIES] > 0 for r in records] == [False, False, False, True, True, True]
    assert [r[M.N_REPLAY] for r in records] == [0, 0, 0, 0, 4, 4]


def test_replay_disabled_never_starts():
    cfg = config("replay.enabled=false", "replay.start_solve_ratio=0.0")
    driver, rollouts, learners, shards = build(cfg, lambda r, i, v: float(i < 2))
    records = driver.train()
    assert [r[M.REPLAY_STARTED] for r in records] == [0] * 6 and all(b.clip for b in learners.batches)
    assert all(r[M.N_REPLAY] == 0 for r in records) and not any(s.collect for s in shards)


@pytest.mark.parametrize(
    "overrides, on_policy",
    [
        ([], False),
        (["replay.enabled=false"], True),
        (["replay.rho=0"], True),
        (["replay.retire=false"], None),
    ],
)
def test_on_policy_grpo_never_retires_nor_stores_and_exgrpo_retires(overrides, on_policy):
    # q0..q5 are solved K/K at every try. 16 questions, B = 8, fresh_take=batch: an epoch is 2 steps.
    # ExGRPO retires them at their first group and the stream skips them from the next epoch; on-policy
    # GRPO (replay off, or rho 0) keeps drawing them every epoch and stores nothing. `replay.retire=false`
    # keeps them with replay on (on_policy None: replay runs, nothing retires).
    def reward(r, i, v):
        return float(qnum(r) < 6 or i < 1)

    cfg = config("data.fresh_take=batch", *overrides)
    driver, rollouts, learners, shards = build(cfg, reward)
    records = driver.train()
    solved = Counter(
        g.qid for b in learners.batches for g in b.groups if g.kind == "fresh" and int(g.qid[1:]) < 6
    )
    if on_policy is False:
        assert driver.replay.stats().retired == 6 and all(n == 1 for n in solved.values())
        assert any(r[M.N_REPLAY] for r in records) and any(s.pool.num_trajectories() for s in shards)
        return
    assert driver.replay.stats().retired == 0 and records[-1][M.RETIRED] == 0 and len(records) == 6
    if on_policy is None:  # replay takes some of the stream's slots, yet solved questions come back
        assert any(r[M.N_REPLAY] for r in records) and max(solved.values()) > 1
        return
    assert sum(solved.values()) == 6 * 3  # 3 epochs, each solved question in every one
    assert all(r[M.N_REPLAY] == 0 for r in records) and not any(s.collect for s in shards)
    assert sum(s.pool.num_trajectories() for s in shards) == 0
