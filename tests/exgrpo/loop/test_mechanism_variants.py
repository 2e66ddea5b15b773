"""The experiment knobs: the official fresh stream, the curriculum alone, an age cap, equal fresh data.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

from collections import Counter

import pytest
from loop_harness import (
    B,
    K,
    build,
    config,
    stream_drawn,
)

from exgrpo.core import metric_names as M


def test_fresh_take_batch_draws_b_questions_every_step_like_the_official_stream():
    # "batch": every step takes B questions from the stream and uses the first B - n_replay, so the
    # stream position after step t is (t + 1) * B whatever was replayed; "needed" advances by B - n_replay.
    def reward(r, i, v):
        return float(i < 2)  # k = 2 of 4 everywhere: every question stays replayable

    for take in ("batch", "needed"):
        driver, rollouts, learners, shards = build(
            config("trainer.steps=4", f"data.fresh_take={take}"), reward
        )
        records = driver.train()
        n_fresh = [r[M.N_FRESH] for r in records]
        assert sum(r[M.N_REPLAY] for r in records) > 0
        position = driver.scheduler.stream.state_dict()
        used = sum(n_fresh)
        drawn = driver.cfg.trainer.questions_per_step * len(records) if take == "batch" else used
        assert stream_drawn(position) == drawn, (take, position, n_fresh)


def every_question_replayable(r, i, v):
    return float(i < 2)  # k = 2 of 4 fresh (or 2 of 3 + the slot): every question stays replayable


def test_questions_only_revisits_replayed_questions_with_k_fresh_rollouts_and_no_stored_one():
    driver, rollouts, learners, shards = build(
        config("replay.replay_trajectories=false"), every_question_replayable
    )
    records = driver.train()
    assert sum(r[M.N_REPLAY] for r in records) > 0  # questions were drawn from replay...
    groups = [g for b in learners.batches for g in b.groups]
    assert all(g.kind == "fresh" and len(g.trajectories) == K for g in groups)  # ...revisited fresh
    assert not any(t.replayed for g in groups for t in g.trajectories)
    assert learners.scored == []  # no stored trajectory is scored
    counts = Counter(g.qid for g in groups)
    assert max(counts.values()) > 1  # a question was revisited


@pytest.mark.parametrize("max_age", [0, 100])
def test_max_age_replays_only_stored_trajectories_young_enough(max_age):
    # eta = 0: a trajectory stored at version v is replayed at version >= v + 1, so age 0 admits none
    driver, rollouts, learners, shards = build(config(f"replay.max_age={max_age}"), every_question_replayable)
    records = driver.train()
    assert sum(r[M.N_REPLAY] for r in records) > 0
    for b in learners.batches:
        for g in b.groups:
            if g.kind == "replay":
                assert g.trajectories[0].replayed
                assert b.version - g.trajectories[0].policy_version <= max_age + 1  # admitted at <= max_age
    replayed = sum(g.kind == "replay" for b in learners.batches for g in b.groups)
    assert (replayed == 0) if max_age == 0 else (replayed > 0)


def test_fresh_per_step_caps_the_fresh_questions_and_the_stream_draw():
    driver, rollouts, learners, shards = build(
        config("data.fresh_per_step=3", "data.fresh_take=batch"), every_question_replayable
    )
    records = driver.train()
    assert [r[M.N_FRESH] for r in records] == [3] * len(records)
    assert records[0][M.N_REPLAY] == 0 and any(r[M.N_REPLAY] == B // 2 for r in records)
    assert stream_drawn(driver.scheduler.stream.state_dict()) == 3 * len(records)
