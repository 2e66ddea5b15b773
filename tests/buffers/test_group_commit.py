"""A shard serving concurrent calls (`replay.shard_concurrency` threads; `buffers/commit.py`): calls share
fsyncs, are applied in the order of their log frames, answer nothing that is not durable, and a failed sync
fails exactly the calls whose frames it did not make durable."""

from __future__ import annotations

import errno
import threading
import time

import pytest

import buffers.wal as wal_module
from buffers.shard import ReplayShard
from exgrpo.core.records import Group, Trajectory

K = 4


def _group(qid: str, rid: int) -> Group:
    rewards = [(rid >> i) & 1 for i in range(K)]  # k varies with rid: the order of records matters
    trajs = tuple(
        Trajectory(
            qid=qid,
            response_ids=(rid, i),
            logprobs=(-0.5, -1.0),
            reward=float(r),
            policy_version=0,
            group_id=f"g{rid}",
        )
        for i, r in enumerate(rewards)
    )
    return Group(qid=qid, prompt_ids=(1, 2), trajectories=trajs, request_id=rid, group_id=f"g{rid}")


def state(shard: ReplayShard):
    return shard.pool, shard.ready_groups(), shard._seen, shard._retirers, shard.collect, shard.stats()


@pytest.fixture
def slow_sync(monkeypatch):
    """fdatasync takes 20 ms (a busy disk), so calls arrive while one syncs; `fail` makes the next one fail."""
    real = wal_module.os.fdatasync
    box = {"fail": False, "calls": 0}

    def fdatasync(fd: int) -> None:
        box["calls"] += 1
        time.sleep(0.02)
        if box["fail"]:
            box["fail"] = False
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(wal_module.os, "fdatasync", fdatasync)
    return box


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()


def test_concurrent_calls_share_fsyncs_and_a_restart_replays_them_in_the_order_applied(tmp_path, slow_sync):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.set_collect(on=True)
    new, taken, errors = [], [], []

    def pusher(p: int) -> None:  # the pushers share questions, and re-push each other's requests
        try:
            for c in range(8):
                rids = [100 * c + 10 * p + j for j in range(2)] + [100 * c + 10 * ((p + 1) % 6)]
                new.append(shard.push(groups=[_group(f"q{rid % 5}", rid) for rid in rids]))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    def taker() -> None:
        for i in range(6):
            time.sleep(0.03)
            got = shard.take(request_ids=range(800), take_id=f"t{i}")
            taken.extend(g.request_id for g in got.groups)

    _run([threading.Thread(target=pusher, args=(p,)) for p in range(6)] + [threading.Thread(target=taker)])
    assert not errors
    distinct = {100 * c + 10 * p + j for c in range(8) for p in range(6) for j in range(2)}
    assert shard._seen == distinct and sum(new) == len(distinct)  # every request once, whoever pushed it
    ready = [g.request_id for g in shard.ready_groups()]
    assert sorted(taken + ready) == sorted(shard._seen) and len(set(taken)) == len(taken)  # each once
    assert shard.wal.syncs < shard.wal.appends  # frames shared fsyncs
    before = state(shard)
    again = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    assert state(again) == before  # the log's order is the order the calls were applied in


def test_a_failed_sync_fails_every_call_it_did_not_make_durable_and_applies_none(tmp_path, slow_sync):
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    shard.push(groups=[_group("a", 1)])
    slow_sync["fail"] = True
    outcome: dict[int, object] = {}

    def push(rid: int) -> None:
        try:
            outcome[rid] = shard.push(groups=[_group(f"q{rid}", rid)])
        except OSError as e:
            outcome[rid] = e

    _run([threading.Thread(target=push, args=(rid,)) for rid in range(2, 10)])
    failed = {r for r, o in outcome.items() if isinstance(o, OSError)}
    assert failed and all("Input/output error while appending" in str(outcome[r]) for r in failed)
    assert shard._seen == {1} | (set(outcome) - failed)  # no failed call was applied
    assert shard._pending == {}
    for rid in sorted(failed):  # the samplers' retries land
        assert shard.push(groups=[_group(f"q{rid}", rid)]) == 1
    before = state(shard)
    assert state(ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))) == before
    assert shard._seen == set(range(1, 10))


def test_a_duplicate_push_is_answered_only_once_its_first_copy_is_durable(tmp_path, slow_sync):
    """The second copy logs nothing, but it must not acknowledge a group that a failing sync may still lose."""
    shard = ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))
    slow_sync["fail"] = True
    outcome: list[object] = []

    def push() -> None:
        try:
            outcome.append(shard.push(groups=[_group("a", 1)]))
        except OSError as e:
            outcome.append(e)

    _run([threading.Thread(target=push) for _ in range(2)])
    # the first copy's sync fails: a second copy that waited on it fails too, one that came after logs itself
    assert 0 not in outcome and any(isinstance(o, OSError) for o in outcome)
    assert (1 in shard._seen) == (1 in outcome)
    expected = 0 if 1 in shard._seen else 1
    assert shard.push(groups=[_group("a", 1)]) == expected
    assert state(ReplayShard(k_rollouts=K, wal_dir=str(tmp_path / "wal"))) == state(shard)
