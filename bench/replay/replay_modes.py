"""The measurements of `bench/replay/bench_replay_scale.py`: the fill of real shards checkpoint by checkpoint
(`run_mode`: push throughput and CPU, sampling latency, snapshot and restore into new shards, a shard's
recovery after SIGKILL) and the client's share and one shard in-process, without Ray (`in_process`). Each step prints its lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay.replay_fleet import Fleet, bench_config, cpu_s, dir_bytes, pct, peak_rss
from bench.replay.replay_workload import K, Pusher


def run_mode(args: argparse.Namespace, *, wal: bool, root: Path) -> None:
    """Fill `--shards` shards to each of `--checkpoints`, measuring at each; with the log, a recovery."""
    import ray
    from ray import cloudpickle

    from bench.replay import replay_workload

    cloudpickle.register_pickle_by_value(replay_workload)  # the actors' processes cannot import bench/
    cfg = bench_config(args, wal=wal)
    r = cfg.replay
    fleet = Fleet.start(cfg, args, root=root)
    fleet.replay.set_collect(on=True)
    compact_mb = f", log compaction at {r.wal_compact_mb:g} MB" if wal else ""
    print(
        f"\n== {args.shards} shards, write-ahead log {'ON (' + compact_mb.lstrip(', ') + ')' if wal else 'OFF'}"
        f"; {r.shard_concurrency} concurrent calls per shard; {args.pushers} pushers x {args.push_batch} groups per push call, pull_batch every {args.take_every}"
    )
    rtt = []
    for _ in range(50):
        t = time.perf_counter()
        ray.get([s.ping.remote() for s in fleet.shards])
        rtt.append(time.perf_counter() - t)
    print(
        f"   round trip to all {args.shards} shards (ping): p50 {pct(rtt, 50):.1f} ms, p99 {pct(rtt, 99):.1f} ms"
    )
    done = 0
    marks = sorted({max(1, int(round(float(f) * args.questions))) for f in args.checkpoints.split(",")})
    for mark in marks:
        fill(fleet, list(range(done, mark)), args, pushed=mark, profile=args.profile and mark == marks[-1])
        done = mark
        sample_latency(fleet, args)
        if not args.no_snapshot:
            fleet = snapshot_restore(fleet, args, root=root, done=done, wal=wal)
    if (
        wal and args.recovery
    ):  # a shard SIGKILLed after more pushes: Ray restarts it, it replays snapshot + log
        recovery(fleet, list(range(done, done + args.recovery)), args)
    fleet.stop()
    shutil.rmtree(root / "replay-wal", ignore_errors=True)


def fill(fleet: Fleet, todo: list[int], args: argparse.Namespace, *, pushed: int, profile: bool) -> None:
    """Push `todo` (one fresh group each; `pushed` questions in all after it) and print throughput, CPU per group, shard calls and memory."""
    import ray

    shards, procs = fleet.shards, fleet.procs

    def counters() -> list[int]:  # push calls the shards received, log frames, fdatasyncs
        got = ray.get([s.counters.remote() for s in shards])
        return [sum(c[k] for c in got) for k in ("push_calls", "frames", "syncs")]

    if profile:
        ray.get(shards[0].profile.remote(on=True))
    counts0, pc0, s0 = counters(), cpu_s(fleet.pusher_procs), cpu_s(procs[:1])
    t0, c0 = time.perf_counter(), cpu_s(procs)
    parts = fleet.push(todo, args)
    wall, shard_cpu = time.perf_counter() - t0, cpu_s(procs) - c0
    pusher_cpu, shard0_cpu = cpu_s(fleet.pusher_procs) - pc0, cpu_s(procs[:1]) - s0
    shard_calls, frames, syncs = (now - before for now, before in zip(counters(), counts0, strict=True))
    prof = ray.get(shards[0].profile.remote(on=False)) if profile else ""
    calls = sum(-(-len(todo[j :: args.pushers]) // args.push_batch) for j in range(args.pushers))
    push_s = sum(p["push_s"] for p in parts) / len(parts)
    take_s = sum(p["take_s"] for p in parts) / len(parts)
    st = fleet.replay.stats()
    rss = [p.memory_info().rss for p in procs]
    n = len(todo)
    print(
        f"-- {pushed:,} questions pushed: {st.active:,} sampleable, buckets {st.bucket_sizes}, "
        f"{st.trajectories:,} stored trajectories, {st.retired:,} retired, {st.ready} ready"
    )
    print(
        f"   push: {n / wall:,.0f} groups/s sustained ({n:,} groups in {wall:.1f} s, "
        f"{calls:,} push calls; per pusher {push_s:.1f} s in push, {take_s:.1f} s in pull_batch; load "
        f"{os.getloadavg()[0]:.1f})"
    )
    print(
        f"   shard CPU {shard_cpu / n * 1e6:,.0f} us per group (push and take; {shard_cpu:.1f} s in all), pusher "
        f"CPU {pusher_cpu / n * 1e6:,.0f} us per group (building, pushing, pulling); {shard_calls:,} shard push "
        f"calls ({n / max(shard_calls, 1):.1f} groups each), {frames:,} log frames in {syncs:,} fdatasyncs "
        f"({syncs / n:.3f} per group)"
    )
    if profile:
        print(
            f"   profile of shard 0 over this fill: its process used {shard0_cpu:.2f} s of CPU, of which\n"
            + prof
        )
    print(f"   shard RSS: sum {sum(rss) / 2**30:.2f} GiB, max {max(rss) / 2**20:,.0f} MiB")


def sample_latency(fleet: Fleet, args: argparse.Namespace) -> None:
    """`sample_questions(n=64)` p50/p99 beside a bare ping of every shard; one shard's share beside its ping."""
    import ray

    replay, shards = fleet.replay, fleet.shards
    rng = np.random.default_rng(7)
    replay.stats()  # cache the sizes, as pull_batch does in the driver
    for _ in range(5):
        replay.sample_questions(n=64, rng=rng)
    lat, pings, got, picks = [], [], 0, []
    for _ in range(args.samples):  # each draw beside a bare ping of every shard: the floor at that moment
        t = time.perf_counter()
        picks = replay.sample_questions(n=64, rng=rng)
        lat.append(time.perf_counter() - t)
        got += len(picks)
        t = time.perf_counter()
        ray.get([s.ping.remote() for s in shards])
        pings.append(time.perf_counter() - t)
    cands = sum(len(p.candidates) for p in picks)
    print(
        f"   sample_questions(n=64): p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms over "
        f"{args.samples} calls ({got / args.samples:.0f} picks per call, {cands} candidates in the last); "
        f"ping of all shards between them: p50 {pct(pings, 50):.1f} ms, p99 {pct(pings, 99):.1f} ms"
    )
    one, bare = [], []  # one shard's share of a draw (8 questions) beside a bare ping of that shard
    counts = {k: 1 for k in range(1, K)} | {K // 2: 2}
    for i in range(100):
        t = time.perf_counter()
        ray.get(shards[0].sample.remote(counts=counts, seed=i, exclude=[]))
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get(shards[0].ping.remote())
        bare.append(time.perf_counter() - t)
    print(
        f"   one shard's sample of 8 questions: p50 {pct(one, 50):.2f} ms, p99 {pct(one, 99):.2f} ms; "
        f"its ping: p50 {pct(bare, 50):.2f} ms, p99 {pct(bare, 99):.2f} ms"
    )


def snapshot_restore(fleet: Fleet, args: argparse.Namespace, *, root: Path, done: int, wal: bool) -> Fleet:
    """Snapshot the shards, then restore it into new ones (a resumed run: new shards, empty log
    directories); the fill goes on in the new fleet, which is returned."""
    replay, procs = fleet.replay, fleet.procs
    st = replay.stats()
    snap = root / f"ckpt-{done}"
    t, c0 = time.perf_counter(), cpu_s(procs)
    replay.snapshot(path=str(snap))
    snap_s, snap_cpu = time.perf_counter() - t, cpu_s(procs) - c0
    size = dir_bytes(snap)
    before = (st.bucket_sizes, st.active, st.retired, st.trajectories)
    extra = (
        f" (each shard also snapshots its own log dir: {dir_bytes(root / 'replay-wal') / 2**20:,.0f} MiB there now)"
        if wal
        else ""
    )
    peak = [peak_rss(p.pid) for p in procs]
    print(
        f"   snapshot: {snap_s:.1f} s ({snap_cpu:.1f} shard CPU s), {size / 2**20:,.0f} MiB on disk "
        f"({size / max(st.trajectories, 1):,.0f} bytes per stored trajectory){extra}; shard peak RSS so far: "
        f"sum {sum(peak) / 2**30:.2f} GiB, max {max(peak) / 2**20:,.0f} MiB"
    )
    fleet.stop()
    fleet = Fleet.start(bench_config(args, wal=wal), args, root=root)
    procs = fleet.procs
    t, c0 = time.perf_counter(), cpu_s(procs)
    fleet.replay.restore(path=str(snap))
    restore_s, restore_cpu = time.perf_counter() - t, cpu_s(procs) - c0
    fleet.replay.set_collect(on=True)  # the driver's part on resume
    st2 = fleet.replay.stats()
    assert (st2.bucket_sizes, st2.active, st2.retired, st2.trajectories) == before, (st2, st)
    rss = [p.memory_info().rss for p in procs]
    print(
        f"   restore into {args.shards} new shards: {restore_s:.1f} s ({restore_cpu:.1f} shard CPU s; stats equal); "
        f"shard RSS after: sum {sum(rss) / 2**30:.2f} GiB, max {max(rss) / 2**20:,.0f} MiB; peak during it: "
        f"sum {sum(peak_rss(p.pid) for p in procs) / 2**30:.2f} GiB"
    )
    shutil.rmtree(snap, ignore_errors=True)
    return fleet


def recovery(fleet: Fleet, extra: list[int], args: argparse.Namespace) -> None:
    """Push `extra`, SIGKILL shard 0 and time until its restarted process answers, restored."""
    import ray

    fleet.push(extra, args)
    shard = fleet.shards[0]
    old_pid = ray.get(shard.pid.remote())
    t = time.perf_counter()
    ray.kill(shard, no_restart=False)
    while True:  # until the restarted process answers (the dying one may still answer a call or two)
        try:
            if ray.get(shard.pid.remote()) != old_pid:
                break
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.05)
    rec = ray.get(shard.recovered.remote())
    print(
        f"   recovery after SIGKILL of shard 0 ({args.recovery:,} more groups pushed first): back in "
        f"{time.perf_counter() - t:.1f} s, of which {rec['seconds']:.2f} s loading its snapshot and "
        f"{rec['frames']} log frames ({rec['active']:,} sampleable questions)"
    )


def _keep_payloads(calls: Sequence[tuple[Any, str, dict[str, Any]]], payloads: list[bytes]) -> list[Any]:
    """An ``invoke`` for `ShardedReplay` that keeps each push call's payload and sends nothing."""
    payloads.extend(kw["payload"] for _, _, kw in calls)
    return [None] * len(calls)


def in_process(args: argparse.Namespace, root: Path) -> None:
    """One ReplayShard in this process (no Ray): the buffers/ code's own cost per group and per snapshot."""
    from buffers.records import decode_payload, groups_from_arrow
    from buffers.shard import ReplayShard
    from buffers.sharded import ShardedReplay

    n = args.in_process
    p = Pusher(replay=None, seed=1, min_len=args.min_len, max_len=args.max_len)
    t = time.perf_counter()
    groups = [p.group(q) for q in range(n)]
    build = time.perf_counter() - t
    payloads: list[bytes] = []  # ShardedReplay.push's own routing and encoding; its calls kept, not sent
    client = ShardedReplay(
        shards=range(args.shards),
        k_rollouts=K,
        invoke=lambda calls: _keep_payloads(calls, payloads),
    )
    t = time.perf_counter()
    for i in range(0, n, args.push_batch):
        client.push(groups=groups[i : i + args.push_batch])
    encode = time.perf_counter() - t
    t = time.perf_counter()
    for payload in payloads:  # what pull_batch does with the shards' answers (their rows, the same columns)
        groups_from_arrow(decode_payload(payload))
    decode = time.perf_counter() - t
    print(
        f"\n== the client's share in-process, {n:,} groups, {args.push_batch} per sampler call over {args.shards} "
        f"shards: building the stand-in Groups {build / n * 1e6:,.0f} us per group, routing and encoding "
        f"{encode / n * 1e6:,.0f} us, decoding back to Groups {decode / n * 1e6:,.0f} us"
    )
    print(
        f"\n== one ReplayShard in-process, {n:,} groups ({args.min_len}-{args.max_len} tokens), "
        f"{args.push_batch} groups per push, take every {args.take_every}"
    )
    for wal in (False, True):
        d = root / f"inproc-{int(wal)}"
        compact = int((args.compact_mb or 64) * 2**20)
        shard = ReplayShard(k_rollouts=K, wal_dir=str(d / "wal") if wal else None, compact_bytes=compact)
        shard.set_collect(on=True)
        t, pending = time.perf_counter(), []
        for i in range(0, n, args.push_batch):
            shard.push(groups=groups[i : i + args.push_batch])
            pending += [g.request_id for g in groups[i : i + args.push_batch]]
            if len(pending) >= args.take_every:
                shard.take(request_ids=pending, take_id=f"t{i}")
                pending = []
        push = time.perf_counter() - t
        compactions = shard.wal.gen if shard.wal is not None else 0
        t = time.perf_counter()
        shard.snapshot(path=str(d / "ckpt.parquet"))
        snap = time.perf_counter() - t
        t = time.perf_counter()
        shard.restore(path=str(d / "ckpt.parquet"))
        restore = time.perf_counter() - t
        line = (
            f"   log {'on ' if wal else 'off'}: push + take {push / n * 1e6:,.0f} us per group"
            + (f" ({compactions} log compactions at {compact / 2**20:g} MB)" if wal else "")
            + f", snapshot {snap:.2f} s, restore {restore:.2f} s"
        )
        if wal:
            for g in groups[: args.recovery]:
                shard.push(groups=[dataclasses.replace(g, request_id=g.request_id + n)])
            t = time.perf_counter()
            again = ReplayShard(k_rollouts=K, wal_dir=str(d / "wal"), compact_bytes=compact)
            line += f", restart (snapshot + {again.recovery['frames']} log frames) {time.perf_counter() - t:.2f} s"
            for log in (again.wal, shard.wal):
                assert log is not None  # both were started with a wal_dir
                log.close()
        print(line, flush=True)
        shutil.rmtree(d, ignore_errors=True)
