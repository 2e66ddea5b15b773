"""ReplayShard and ShardedReplay in-process: recording, idempotent push, take (with dropped replay
groups), sampling under concurrent pushes, snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from buffers.shard import ReplayShard
from buffers.sharded import ShardedReplay, local_invoke, shard_of
from exgrpo.core.records import Group, PulledBatch, ReplayPick, Trajectory

K = 4


def _traj(qid, ids, reward, *, group_id):
    return Trajectory(
        qid=qid,
        response_ids=tuple(ids),
        logprobs=tuple(-0.5 for _ in ids),
        reward=float(reward),
        policy_version=0,
        group_id=group_id,
    )


def _group(qid, rewards, *, rid, kind="fresh", tag=0, candidates=()):
    """One group of request `rid`: rollout i has ids (tag, i, reward) (distinct per tag and index)."""
    trajs = tuple(_traj(qid, (tag, i, r), r, group_id=f"g{rid}") for i, r in enumerate(rewards))
    return Group(
        qid=qid,
        prompt_ids=(1, 2),
        trajectories=trajs,
        kind=kind,
        request_id=rid,
        group_id=f"g{rid}",
        candidates=tuple(candidates),
    )


def _ids(trajs):
    return [t.response_ids for t in trajs]


def test_push_records_and_queues_and_take_returns_a_pulled_batch():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    assert shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1), _group("b", [1, 1, 1, 1], rid=2)]) == 2
    assert shard.pool.bucket_of("a") == 2 and shard.pool.is_retired("b")
    assert shard.stats().ready == 2
    got = shard.take(request_ids=[2, 99])  # 99: not here (another shard's, or unknown): ignored
    assert isinstance(got, PulledBatch)
    assert [g.request_id for g in got.groups] == [
        2
    ] and got.dropped == ()  # a fresh group of a retired q is kept
    assert got.stats.ready == 1 and got.stats.retired == 1 and got.stats.active == 1
    assert got.stats.bucket_sizes == {2: 1} and got.stats.trajectories == 2
    assert shard.take(request_ids=[2]).groups == ()  # taken once


def test_push_rejects_a_replay_group_without_candidates_and_a_wrong_group_size():
    shard = ReplayShard(k_rollouts=K)
    with pytest.raises(ValueError, match="candidates"):
        shard.push(groups=[_group("z", [0, 1, 0], rid=5, kind="replay")])
    with pytest.raises(ValueError, match="K=4"):
        shard.push(groups=[_group("z", [0, 1, 0], rid=6)])
    assert shard.stats().ready == 0


def test_no_collection_before_delayed_start():
    shard = ReplayShard(k_rollouts=K)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1)])
    assert shard.pool.bucket_of("a") == 1  # statistics are kept
    assert shard.pool.candidates("a") == [] and shard.bucket_sizes() == {}


def test_replay_group_keeps_the_candidates_pinned_by_its_request():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1, tag=7)])
    picks, left = shard.sample(counts={1: 1}, seed=0)
    assert picks == [ReplayPick(qid="a", candidates=(shard.pool.candidates("a")[0],))] and left == {}
    # replay group: K - 1 = 3 fresh rollouts, one correct; it must come back with exactly the pinned ones
    shard.push(groups=[_group("a", [0, 1, 0], rid=2, kind="replay", tag=8, candidates=picks[0].candidates)])
    (g,) = shard.take(request_ids=[2]).groups
    assert g.kind == "replay" and g.candidates == picks[0].candidates
    assert all(c.group_id != g.group_id for c in g.candidates)
    assert shard.pool.bucket_of("a") == 2  # k = 1 fresh correct + the replay slot
    assert _ids(shard.pool.candidates("a")) == [(7, 0, 1), (8, 1, 1)]


def test_idempotent_push_records_k_once_and_queues_one_copy():
    """Regression: a request re-issued after a sampler failure is pushed twice; the second copy (here
    with other rewards: k = 3, then K/K) must change neither the statistics nor the stored trajectories."""
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    first = _group("a", [1, 0, 0, 0], rid=1, tag=1)
    assert shard.push(groups=[first]) == 1
    before = (shard.pool.bucket_of("a"), shard.bucket_sizes(), shard.pool.num_trajectories(), shard.stats())
    assert before[:3] == (1, {1: 1}, 1)
    assert shard.push(groups=[_group("a", [1, 1, 1, 0], rid=1, tag=2)]) == 0
    assert shard.push(groups=[_group("a", [1, 1, 1, 1], rid=1, tag=3), _group("b", [1, 0, 0, 0], rid=2)]) == 1
    assert not shard.pool.is_retired("a")
    assert (shard.pool.bucket_of("a"), shard.pool.num_trajectories()) == (1, 2)  # b's one trajectory added
    assert _ids(shard.pool.candidates("a")) == [(1, 0, 1)]
    assert shard.stats().ready == 2
    got = shard.take(request_ids=[1, 2])
    assert [g.request_id for g in got.groups] == [1, 2] and got.groups[
        0
    ] == first  # the first copy is trained
    # a late copy after the take is still ignored (not queued again)
    assert shard.push(groups=[_group("a", [1, 1, 0, 0], rid=1, tag=4)]) == 0
    assert shard.stats().ready == 0 and shard.pool.bucket_of("a") == 1


def test_take_drops_a_replay_group_whose_question_retired():
    """Regression: replay request 3 of "a" was sampled with a's candidates; a fresh group (request 2)
    solves a K/K before request 3 is taken -> take reports 3 in `dropped`, never hands it out."""
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1, tag=7), _group("b", [1, 0, 0, 0], rid=4)])
    (pick,), _ = shard.sample(counts={1: 1}, seed=0, exclude=["b"])
    assert pick.qid == "a"
    shard.push(groups=[_group("a", [1, 1, 1, 1], rid=2, tag=8)])  # retired meanwhile
    assert shard.pool.is_retired("a") and shard.pool.candidates("a") == []
    shard.push(groups=[_group("a", [0, 1, 0], rid=3, kind="replay", tag=9, candidates=pick.candidates)])
    (pick_b,), _ = shard.sample(counts={1: 1}, seed=0)
    shard.push(groups=[_group("b", [0, 0, 0], rid=5, kind="replay", candidates=pick_b.candidates)])
    got = shard.take(request_ids=[1, 2, 3, 4, 5])
    assert [g.request_id for g in got.groups] == [1, 2, 4, 5]  # b's replay group (not retired) is handed out
    assert got.dropped == (3,)
    assert got.stats.ready == 0
    assert shard.take(request_ids=[3]) == PulledBatch(
        groups=(), dropped=(), stats=shard.stats()
    )  # gone for good


def test_take_keeps_a_replay_group_that_retired_its_own_question(tmp_path):
    """A replay group whose K - 1 rollouts are all correct makes k = K with its slot 0: it is the group
    that retired the question, not one replaying a retired question, so it is handed out (advantages 0)
    rather than re-issued; the distinction survives a snapshot/restore."""
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 0], rid=1)])
    (pick,), _ = shard.sample(counts={1: 1}, seed=0)
    shard.push(groups=[_group("a", [1, 1, 1], rid=2, kind="replay", candidates=pick.candidates)])
    assert shard.pool.is_retired("a")
    shard.snapshot(path=str(tmp_path / "s.parquet"))
    restored = ReplayShard(k_rollouts=K)
    restored.restore(path=str(tmp_path / "s.parquet"))
    for s in (shard, restored):
        got = s.take(request_ids=[1, 2])
        assert [g.request_id for g in got.groups] == [1, 2] and got.dropped == ()


def test_sample_gives_what_a_bucket_has_and_reports_what_is_left():
    shard = ReplayShard(k_rollouts=K)
    shard.set_collect(on=True)
    for i, q in enumerate("abc"):
        shard.push(groups=[_group(q, [1, 0, 0, 0], rid=i, tag=i)])
    shard.push(groups=[_group("d", [1, 1, 0, 0], rid=9, tag=9)])
    picks, left = shard.sample(counts={1: 5, 3: 2}, seed=1, exclude=["b"])
    assert sorted(p.qid for p in picks) == ["a", "c"] and left == {2: 1}  # b excluded, d not asked for
    assert all(len(p.candidates) == 1 and p.candidates[0].qid == p.qid for p in picks)


def test_snapshot_restore_round_trips_pool_ready_queue_and_seen_ids(tmp_path):
    shard = ReplayShard(k_rollouts=K, max_trajectories_per_question=2)
    shard.set_collect(on=True)
    shard.push(groups=[_group(f"q{i}", [1, 0, 0, i % 2], rid=i, tag=i) for i in range(6)])
    shard.push(groups=[_group("q5", [1, 1, 1, 1], rid=6, tag=6)])  # q5 retired
    shard.take(request_ids=[0, 1])
    (pick,), _ = shard.sample(counts={1: 1}, seed=0)
    shard.push(groups=[_group(pick.qid, [0, 1, 0], rid=9, kind="replay", tag=9, candidates=pick.candidates)])
    path = tmp_path / "shard.parquet"
    assert shard.snapshot(path=str(path)) > 0
    other = ReplayShard(k_rollouts=K, max_trajectories_per_question=2)
    other.restore(path=str(path))
    assert other.pool == shard.pool and other.stats() == shard.stats()
    assert other.stats().ready == 6  # 2, 3, 4, 5, 6, 9
    # seen ids survive: 0 (taken before the snapshot) and 9 (queued) are ignored when pushed again
    assert (
        other.push(groups=[_group("q0", [1, 1, 1, 1], rid=0, tag=50), _group("q2", [1, 1, 1, 0], rid=9)]) == 0
    )
    assert not other.pool.is_retired("q0") and other.pool == shard.pool
    assert other.push(groups=[_group("q7", [1, 0, 0, 0], rid=10, tag=10)]) == 1  # a new id is recorded
    ours, theirs = shard.take(request_ids=[9, 3, 2, 4, 5, 6]), other.take(request_ids=[9, 3, 2, 4, 5, 6])
    assert ours.groups == theirs.groups and ours.dropped == theirs.dropped
    (replayed,) = [g for g in theirs.groups if g.request_id == 9]
    assert replayed.kind == "replay" and replayed.candidates == pick.candidates  # pinned candidates survive
    # the same RNG seed draws the same questions (bucket-index order is restored)
    a, _ = shard.sample(counts={1: 2, 2: 1}, seed=3)
    b, _ = other.sample(counts={1: 2, 2: 1}, seed=3)
    assert a == b


# -- ShardedReplay -------------------------------------------------------------------------------


def _replay(num_shards=2):
    shards = [ReplayShard(k_rollouts=K) for _ in range(num_shards)]
    replay = ShardedReplay(shards=shards, k_rollouts=K, invoke=local_invoke)
    replay.set_collect(on=True)
    return replay, shards


def _available(shards):
    return {q for s in shards for b in s.pool._buckets.values() for q in b.items}


def test_sharded_routing_and_pull_batch():
    replay, shards = _replay()
    groups = [_group(f"q{i}", [1, 0, 0, 0], rid=i, tag=i) for i in range(8)]
    replay.push(groups=groups)
    for i, s in enumerate(shards):
        assert {g.qid for g in s._ready.values()} == {f"q{j}" for j in range(8) if shard_of(f"q{j}", 2) == i}
    assert 0 < len(shards[0]._ready) < 8  # both shards are used by these qids
    got = replay.pull_batch(request_ids=[5, 1, 7])
    assert [g.request_id for g in got.groups] == [1, 5, 7] and got.stats.ready == 5 and got.stats.active == 8
    with pytest.raises(RuntimeError, match="reported done"):
        replay.pull_batch(request_ids=[1])  # already taken


@pytest.mark.parametrize("seed", range(25))
def test_sample_questions_with_stale_sizes_returns_min_n_available_distinct(seed):
    """Regression (race): sizes planned from stale stats; pushes move and retire questions between the
    plan (cached sizes) and the draw. sample_questions must never raise and must return
    min(n, available now) distinct, sampleable questions."""
    rng = np.random.default_rng(seed)
    replay, shards = _replay()
    for i in range(10):  # q0..q9 in bucket 1 or 2
        replay.push(groups=[_group(f"q{i}", [1] * (1 + i % 2) + [0] * (3 - i % 2), rid=i, tag=i)])
    replay.stats()  # caches per-shard sizes, now made stale:
    moved = rng.choice(10, size=5, replace=False)
    for j, i in enumerate(moved[:3]):  # three retire
        replay.push(groups=[_group(f"q{i}", [1, 1, 1, 1], rid=100 + j, tag=100 + j)])
    for j, i in enumerate(moved[3:]):  # two move to bucket 3
        replay.push(groups=[_group(f"q{i}", [1, 1, 1, 0], rid=200 + j, tag=200 + j)])
    replay.push(groups=[_group("new", [1, 0, 0, 0], rid=300, tag=300)])  # one appears
    available = _available(shards)
    assert len(available) == 10 - 3 + 1
    for n in (1, 4, 7, 8, 12):
        picks = replay.sample_questions(n=n, rng=rng)
        qids = [p.qid for p in picks]
        assert len(qids) == len(set(qids)) == min(n, len(available)), (n, qids)
        assert set(qids) <= available
        for p in picks:  # candidates as stored at this moment
            assert p.candidates and p.candidates == tuple(shards[shard_of(p.qid, 2)].pool.candidates(p.qid))


def test_sample_questions_when_every_cached_question_retired():
    replay, shards = _replay()
    replay.push(groups=[_group(f"q{i}", [1, 0, 0, 0], rid=i, tag=i) for i in range(4)])
    assert replay.stats().active == 4
    replay.push(groups=[_group(f"q{i}", [1, 1, 1, 1], rid=10 + i, tag=10 + i) for i in range(4)])
    assert replay.sample_questions(n=3, rng=np.random.default_rng(0)) == []
    assert replay.sample_questions(n=0, rng=np.random.default_rng(0)) == []


def test_sharded_snapshot_restore(tmp_path):
    replay, shards = _replay()
    replay.push(groups=[_group(f"q{i}", [1, 0, 0, i % 2], rid=i, tag=i) for i in range(8)])
    replay.pull_batch(request_ids=[0, 3])
    replay.snapshot(path=str(tmp_path / "replay"))
    other, other_shards = _replay()
    other.restore(path=str(tmp_path / "replay"))
    assert other.stats() == replay.stats()
    assert all(a.pool == b.pool for a, b in zip(shards, other_shards, strict=True))
    other.push(groups=[_group("q0", [1, 1, 1, 1], rid=0, tag=99)])  # a seen id: ignored
    assert other.retired() == frozenset()
    assert other.sample_questions(n=3, rng=np.random.default_rng(5)) == replay.sample_questions(
        n=3, rng=np.random.default_rng(5)
    )
    with pytest.raises(ValueError, match="num_shards"):
        _replay(3)[0].restore(path=str(tmp_path / "replay"))
