"""A real replay shard actor SIGKILLed at random moments while two pushers and a puller use it.

Ray restarts the actor (max_restarts), the new process replays its write-ahead log, and the client
(`ShardedReplay` over `RayInvoke`) re-sends the calls that died with it. Asserted: every push that
returned (acknowledged) is pulled exactly once, nothing is pulled twice, and the shard's final
statistics and stored trajectories equal an in-process shard that was fed the same groups and
never died. The restart-to-restored times are printed (`pytest -s`).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
import ray

from buffers.shard import ReplayShard
from buffers.sharded import RayInvoke, ShardedReplay, shard_of
from exgrpo.core.config import Config
from exgrpo.core.records import Group, Trajectory
from exgrpo.runtime.env import remote_actor

pytestmark = pytest.mark.integration
K = 4


def _group(rid: int) -> Group:
    """Each pusher has its own questions (so the per-question order of records is the pusher's own)."""
    rewards = [(rid >> i) & 1 for i in range(K)]  # every k in 0..K over the request ids
    qid = f"q{rid % 37}-{rid // 10_000}"
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
    return Group(qid=qid, prompt_ids=(1, rid % 37), trajectories=trajs, request_id=rid, group_id=f"g{rid}")


def test_sigkilled_shard_restarts_and_loses_no_acknowledged_push(ray_cluster, tmp_path):
    rng = random.Random(1234)
    shards = [
        remote_actor(
            ReplayShard,
            name=f"test-restart-shard-{i}",
            num_cpus=0,
            max_restarts=50,
            max_concurrency=Config().replay.shard_concurrency,  # as build_system starts them: group commit
            k_rollouts=K,
            wal_dir=str(tmp_path / f"wal-{i}"),
            compact_bytes=40_000,
        )
        for i in range(2)
    ]
    replay = ShardedReplay(shards=shards, k_rollouts=K, invoke=RayInvoke(retry_s=60))
    replay.set_collect(on=True)
    acked: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    attempted: list[int] = []

    def pusher(first: int) -> None:  # a sampler: chunks of 2 groups, some pushed twice (re-issued requests)
        try:
            rid = first
            while rid < first + 120 or not stop.is_set():  # until the kills are over
                chunk = [_group(rid), _group(rid + 1)]
                attempted.extend((rid, rid + 1))
                replay.push(groups=chunk)
                if rid % 10 == 1:
                    replay.push(groups=chunk)
                with lock:
                    acked.extend(g.request_id for g in chunk)
                rid += 2
                time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    kills: list[dict] = []

    def killer() -> None:
        try:
            while len(kills) < 6:
                time.sleep(rng.uniform(0.3, 1.2))
                i = rng.randrange(2)
                pid = ray.get(shards[i].pid.remote(), timeout=60)
                os.kill(pid, signal.SIGKILL)
                t0 = time.perf_counter()
                info = replay.invoke([(shards[i], "recovered", {})])[0]  # waits out the restart
                kills.append({"shard": i, "restored_s": time.perf_counter() - t0, **info})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    threads = [threading.Thread(target=pusher, args=(first,)) for first in (1, 10_001)]
    threads.append(threading.Thread(target=killer))
    for t in threads:
        t.start()
    pulled: list[int] = []
    while any(t.is_alive() for t in threads[:2]) or set(acked) - set(pulled):
        with lock:
            wanted = sorted(set(acked) - set(pulled))[:16]
        if wanted:  # the driver pulls only acknowledged requests; a lost one raises in pull_batch
            batch = replay.pull_batch(request_ids=wanted)
            assert not batch.dropped
            pulled += [g.request_id for g in batch.groups]
        time.sleep(0.01)
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(kills) == 6
    assert sorted(pulled) == sorted(set(acked)) == sorted(attempted)  # every push returned and was pulled
    assert len(pulled) == len(set(pulled))  # nothing handed out twice
    assert replay.stats().ready == 0
    # the restored shards hold exactly what shards that never died would
    reference = [ReplayShard(k_rollouts=K) for _ in shards]
    ShardedReplay(
        shards=reference,
        k_rollouts=K,
        invoke=lambda calls: [getattr(s, m)(**kw) for s, m, kw in calls],
    ).set_collect(on=True)
    for rid in sorted(acked):
        reference[shard_of(_group(rid).qid, 2)].push(groups=[_group(rid)])
    for i, shard in enumerate(shards):
        assert ray.get(shard.stats.remote()).__dict__ | {"ready": 0} == reference[i].stats().__dict__ | {
            "ready": 0
        }
        assert ray.get(shard.retired.remote()) == reference[i].retired()
        live = ray.get(shard.sample.remote(counts={k: 99 for k in range(1, K)}, seed=0))[0]
        ref = reference[i].sample(counts={k: 99 for k in range(1, K)}, seed=0)[0]
        assert sorted((p.qid, sorted(p.candidates, key=lambda t: t.response_ids)) for p in live) == sorted(
            (p.qid, sorted(p.candidates, key=lambda t: t.response_ids)) for p in ref
        )
    print(f"\nshard kills: {len(kills)}; client retries: {replay.invoke.retries}")
    for k in kills:
        print(
            f"  shard {k['shard']}: back and restored after {k['restored_s']:.2f} s (log replay {k['seconds']:.3f} s, "
            f"snapshot={k['snapshot']}, frames={k['frames']}, trajectories={k['trajectories']})"
        )
    for s in shards:
        ray.kill(s)
