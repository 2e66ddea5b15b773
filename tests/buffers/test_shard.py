"""ReplayShard in-process: recording, candidates attached before recording, ready queue, snapshots."""

import numpy as np
import pytest

from buffers.shard import ReplayShard
from exgrpo.types import Group, Trajectory

K = 4


def _group(qid, rewards, *, rid, kind="fresh", tag=0):
    trajs = tuple(Trajectory(qid=qid, response_ids=(tag, i, r), logprobs=(-0.1, -0.2, -0.3), reward=float(r),
                             policy_version=0, group_id=f"g{rid}") for i, r in enumerate(rewards))
    return Group(qid=qid, prompt_ids=(1, 2), trajectories=trajs, kind=kind, request_id=rid, group_id=f"g{rid}")


def test_push_records_and_queues():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1), _group("b", [1, 1, 1, 1], rid=2)])
    assert shard.pool.bucket_of("a") == 2
    assert shard.pool.is_retired("b")
    assert {e.request_id for e in shard.ready()} == {1, 2}
    got = shard.take(request_ids=[2])
    assert got[0].qid == "b" and len(shard.ready()) == 1
    with pytest.raises(KeyError, match="not finished"):
        shard.take(request_ids=[99])


def test_replay_group_gets_earlier_candidates_only():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1, tag=7)])
    stored = shard.candidates(qid="a")
    assert len(stored) == 1
    # replay group: K - 1 = 3 fresh rollouts; one of them is correct and must not be its own candidate
    shard.push(groups=[_group("a", [0, 1, 0], rid=2, kind="replay", tag=8)])
    (g,) = shard.take(request_ids=[2])
    assert g.kind == "replay"
    assert [c.response_ids for c in g.candidates] == [stored[0].response_ids]
    # k = 1 fresh correct + the replay slot = 2
    assert shard.pool.bucket_of("a") == 2
    assert len(shard.candidates(qid="a")) == 2


def test_no_collection_before_delayed_start():
    shard = ReplayShard(k_rollouts=K)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1)])
    assert shard.candidates(qid="a") == []
    assert shard.bucket_sizes() == {}


def test_replay_group_without_candidates_becomes_fresh():
    shard = ReplayShard(k_rollouts=K)
    shard.push(groups=[_group("z", [0, 1, 0], rid=5, kind="replay")])
    (g,) = shard.take(request_ids=[5])
    assert g.kind == "fresh" and len(g.trajectories) == 3


def test_snapshot_restore(tmp_path):
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group(f"q{i}", [1, 0, 0, i % 2], rid=i) for i in range(6)])
    shard.take(request_ids=[0, 1])
    shard.push(groups=[_group("q0", [0, 1, 0], rid=9, kind="replay")])
    path = tmp_path / "shard.parquet"
    assert shard.snapshot(path=str(path)) > 0
    other = ReplayShard(k_rollouts=K)
    other.restore(path=str(path))
    assert other.bucket_sizes() == shard.bucket_sizes()
    assert other.pool == shard.pool
    assert sorted(e.request_id for e in other.ready()) == [2, 3, 4, 5, 9]
    assert other.take(request_ids=[9, 3]) == shard.take(request_ids=[9, 3])
    rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
    assert other.pool.sample_questions(3, rng=rng_a) == shard.pool.sample_questions(3, rng=rng_b)


def test_candidates_pinned_at_sampling_survive_retirement():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1, tag=7)])
    assert shard.sample_from_buckets(counts={1: 1}, seed=0) == ["a"]
    stored = shard.candidates(qid="a")
    shard.push(groups=[_group("a", [1, 1, 1, 1], rid=2, tag=8)])  # solved K/K meanwhile: retired
    assert shard.pool.is_retired("a") and shard.candidates(qid="a") == []
    shard.push(groups=[_group("a", [0, 1, 0], rid=3, kind="replay", tag=9)])
    (g,) = shard.take(request_ids=[3])
    assert g.kind == "replay" and list(g.candidates) == stored
