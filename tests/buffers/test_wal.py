"""The shard's write-ahead log in-process: a shard rebuilt from its log directory (what Ray does after
a crash: the same `__init__` arguments) equals the shard that died, whatever the sequence of pushes,
takes, `set_collect`, compactions and torn writes before it."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from buffers.shard import ReplayShard
from buffers.wal import read_frames
from exgrpo.core.records import Group, Trajectory

K = 4


def _group(qid, rewards, *, rid, kind="fresh", candidates=()):
    trajs = tuple(
        Trajectory(
            qid=qid,
            response_ids=(rid, i, int(r)),
            logprobs=(-0.5, -0.25, -1 / 3),
            reward=float(r),
            policy_version=rid % 3,
            group_id=f"g{rid}",
        )
        for i, r in enumerate(rewards)
    )
    return Group(
        qid=qid,
        prompt_ids=(1, 2, rid % 5),
        trajectories=trajs,
        kind=kind,
        request_id=rid,
        group_id=f"g{rid}",
        candidates=tuple(candidates),
    )


def state(shard: ReplayShard):
    """Everything a shard answers from: pool, ready queue, pushed ids, retirers, collect, last take."""
    return (
        shard.pool,
        shard.ready_groups(),
        shard._seen,
        shard._retirers,
        shard.collect,
        shard._last_take,
        shard.stats(),
    )


def restart(shard: ReplayShard, tmp_path) -> ReplayShard:
    """What Ray does after SIGKILL: a new process runs __init__ with the same arguments (no close)."""
    return ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"), compact_bytes=shard.compact_bytes)


def random_ops(rng: np.random.Generator, n: int, first_rid: int = 1):
    """A random sequence of shard calls over a few questions (pushes, duplicate pushes, takes, collect)."""
    rid, pushed, ops = first_rid, [], []
    for _ in range(n):
        u = rng.random()
        if u < 0.55:
            groups = []
            for _ in range(int(rng.integers(1, 4))):
                qid = f"q{int(rng.integers(6))}"
                rewards = rng.integers(0, 2, size=K).tolist()
                picks = [t for g in pushed if g.qid == qid for t in g.trajectories if t.reward == 1.0][:2]
                if picks and rng.random() < 0.4:  # a replay group: K - 1 fresh rollouts + pinned candidates
                    groups.append(_group(qid, rewards[: K - 1], rid=rid, kind="replay", candidates=picks))
                else:
                    groups.append(_group(qid, rewards, rid=rid))
                rid += 1
            if pushed and rng.random() < 0.3:
                groups.append(pushed[int(rng.integers(len(pushed)))])  # a re-issued request's second copy
            pushed += groups
            ops.append(("push", {"groups": groups}))
        elif u < 0.85 and pushed:
            ids = sorted({pushed[int(i)].request_id for i in rng.integers(len(pushed), size=3)})
            ops.append(("take", {"request_ids": ids, "take_id": f"t{len(ops)}"}))
        elif u < 0.9:
            ops.append(("set_collect", {"on": bool(rng.random() < 0.8)}))
        else:
            ops.append(("compact", {}))
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_a_restarted_shard_equals_the_one_that_died(tmp_path, seed):
    rng = np.random.default_rng(seed)
    reference = ReplayShard(k_rollouts=K)  # no log: what the shard would be had it never died
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"), compact_bytes=[1 << 30, 3000][seed % 2])
    for i, (method, kwargs) in enumerate(random_ops(rng, 60)):
        expected = getattr(reference, method)(**kwargs)
        got = getattr(shard, method)(**kwargs)
        assert got == expected
        if rng.random() < 0.25 or i == 59:
            shard = restart(shard, tmp_path)
            assert state(shard)[:5] == state(reference)[:5]
            assert shard.stats() == reference.stats()
            if reference._last_take is not None:
                assert shard._last_take == reference._last_take
            picks = shard.sample(counts={1: 2, 2: 2, 3: 2}, seed=i)
            assert picks == reference.sample(
                counts={1: 2, 2: 2, 3: 2}, seed=i
            )  # same draws from the same rng
    assert shard.recovered()["seconds"] < 5


def test_a_retried_take_returns_what_the_first_attempt_removed(tmp_path):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.set_collect(on=True)
    shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1), _group("b", [0, 0, 0, 1], rid=2)])
    first = shard.take(request_ids=[1, 2], take_id="pull-7")  # ... and its reply is lost: the shard dies
    shard = restart(shard, tmp_path)
    again = shard.take(request_ids=[1, 2], take_id="pull-7")
    assert again == first and [g.request_id for g in again.groups] == [1, 2]
    assert shard.take(request_ids=[1, 2], take_id="pull-8").groups == ()  # a new pull gets nothing twice
    shard.compact()  # the answer to the last take also survives the shard's own snapshot
    shard = restart(shard, tmp_path)
    assert shard._last_take[0] == "pull-8"


def test_a_torn_frame_is_dropped_and_the_log_continues_after_the_last_good_one(tmp_path):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1)])
    log = shard.wal.log_path(shard.wal.gen)
    good = log.stat().st_size
    shard.push(groups=[_group("b", [1, 0, 0, 0], rid=2)])
    with open(log, "r+b") as f:  # the crash cut the second push's frame short: it was never acknowledged
        f.truncate(good + 20)
    shard = restart(shard, tmp_path)
    assert shard._seen == {1} and log.stat().st_size == good
    assert shard.push(groups=[_group("b", [1, 0, 0, 0], rid=2)]) == 1  # the sampler's retry lands
    shard = restart(shard, tmp_path)
    assert shard._seen == {1, 2} and len(read_frames(log)[0]) == 2


@pytest.mark.parametrize("growth", [0.0, 1.0])
def test_the_log_stays_bounded_and_a_checkpoint_truncates_it(tmp_path, growth):
    """The log compacts once it passes compact_bytes and growth x the last self-snapshot's size (growth 1, the
    default, keeps compaction amortised for a large pool; growth 0 is the fixed threshold)."""
    shard = ReplayShard(
        k_rollouts=K, wal_dir=str(tmp_path / "wal"), compact_bytes=4000, compact_growth=growth
    )
    shard.set_collect(on=True)
    for rid in range(1, 70):
        shard.push(groups=[_group(f"q{rid % 7}", [rid % 2, 1, 0, rid % 3 == 0], rid=rid)])
        shard.take(request_ids=[rid - 1], take_id=f"t{rid}")
        snap = (
            sum(f.stat().st_size for f in shard.wal.snap_dir(shard.wal.gen).glob("*")) if shard.wal.gen else 0
        )
        assert shard._snapshot_bytes == snap
        assert shard.wal.bytes <= max(4000, growth * snap) + 3000  # one frame past the threshold at most
    files = sorted(p.name for p in (tmp_path / "wal").iterdir())
    assert len(files) == 2 and shard.wal.gen > (3 if growth == 0 else 1)  # one snapshot directory and its log
    assert restart(shard, tmp_path)._snapshot_bytes == shard._snapshot_bytes
    before = state(shard)
    shard.snapshot(path=str(tmp_path / "ckpt" / "shard-0.parquet"))
    assert shard.wal.bytes == 0
    assert state(restart(shard, tmp_path)) == before
    # a resumed run restores a checkpoint into a fresh shard: a crash after that recovers the checkpoint
    fresh = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal2"))
    fresh.restore(path=str(tmp_path / "ckpt" / "shard-0.parquet"))
    again = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal2"))
    assert (
        again.pool == shard.pool and again._seen == shard._seen and again._ready.keys() == shard._ready.keys()
    )


def test_an_invalid_push_changes_nothing_and_logs_nothing(tmp_path):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    with pytest.raises(ValueError, match="K=4"):
        shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1), _group("b", [1, 0], rid=2)])
    assert shard._seen == set() and shard.wal.bytes == 0


def test_a_checkpoint_and_a_restore_share_their_files_with_the_shards_own_snapshot(tmp_path):
    """`snapshot` and `restore` link the checkpoint's files into the log directory instead of serialising the
    state twice; the log directory's copy stays valid when the checkpoint is deleted or replaced."""
    import shutil

    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.set_collect(on=True)
    for rid in range(1, 30):
        shard.push(groups=[_group(f"q{rid % 5}", [rid % 2, 1, 0, rid % 3 == 0], rid=rid)])
    shard.take(request_ids=[1, 2, 3], take_id="t1")
    ckpt = tmp_path / "ckpt" / "shard-0.parquet"
    shard.snapshot(path=str(ckpt))
    before = state(shard)
    shutil.rmtree(tmp_path / "ckpt")
    assert state(restart(shard, tmp_path)) == before
    shard.snapshot(
        path=str(ckpt)
    )  # a second checkpoint at the same path replaces its files, the log keeps its own
    fresh = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal2"))
    fresh.restore(path=str(ckpt))
    shard.push(groups=[_group("q9", [1, 0, 0, 0], rid=99)])
    shard.snapshot(path=str(ckpt))
    again = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal2"))
    assert again.pool == fresh.pool and again._seen == fresh._seen and 99 not in again._seen


class _FullDisk:
    """The shard's log file, whose next write stores half of its bytes and then fails as a full disk does."""

    def __init__(self, f) -> None:
        self.f, self.fail = f, True

    def write(self, data: bytes) -> int:
        if self.fail:
            self.fail = False
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_failed_append_is_cut_back_and_loses_no_acknowledged_call(tmp_path):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1)])
    log = shard.wal.log_path(shard.wal.gen)
    good = log.stat().st_size
    shard.wal._file = _FullDisk(shard.wal._file)
    with pytest.raises(
        OSError, match=r"No space left on device while appending to .*log-000000.wal \(.* free\)"
    ):
        shard.push(groups=[_group("b", [1, 0, 0, 0], rid=2)])
    assert shard._seen == {1} and log.stat().st_size == good  # not applied, and the partial frame is gone
    shard.push(groups=[_group("b", [1, 0, 0, 0], rid=2)])  # the sampler's retry, after space was freed
    shard.set_collect(on=True)
    shard.push(groups=[_group("c", [0, 1, 0, 0], rid=3)])
    before = state(shard)
    shard = restart(shard, tmp_path)
    assert len(read_frames(log)[0]) == 4  # every acknowledged call is read back, none after a bad frame
    assert state(shard) == before and shard._seen == {1, 2, 3}


def test_a_log_that_cannot_be_cut_back_refuses_later_appends(tmp_path, monkeypatch):
    import buffers.wal as wal

    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.push(groups=[_group("a", [1, 0, 0, 1], rid=1)])
    shard.wal._file = _FullDisk(shard.wal._file)

    def no_reopen(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(wal, "open", no_reopen, raising=False)
    with pytest.raises(OSError, match="No space left"):
        shard.push(groups=[_group("b", [1, 0, 0, 0], rid=2)])
    monkeypatch.undo()
    with pytest.raises(OSError, match="refuses appends: a failed append .* could not be cut back"):
        shard.push(groups=[_group("c", [1, 0, 0, 0], rid=3)])
    assert shard._seen == {1}
