"""The replay service at scale: push throughput, sampling latency, snapshot and restore, shard memory, over R
real `ReplayShard` Ray actors driven through `ShardedReplay`. The defaults are the goal case (8 shards, 16-48
tokens per trajectory, the write-ahead log on, 4 pushing samplers of 32 groups per call); the before/after
figures of docs/benchmarks.md come from

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python bench/bench_replay_scale.py \
        --questions 200000 --checkpoints 0.25,1 --no-snapshot --recovery 2000 --profile --baseline 0e32440

The shards are started the way `exgrpo.runtime.assembly.build_system` starts them (`remote_actor`, named
`exgrpo-replay-<i>`, num_cpus=0, with a write-ahead log: `max_restarts=replay.shard_max_restarts` and
`compact_bytes=replay.wal_compact_mb`), plus call counters and a profiler (`bench/replay_workload.py`).
Collection is on. Each question is pushed once, as one fresh group of K=8 trajectories (response lengths
uniform in [--min-len, --max-len] tokens, a 128-token prompt) with k correct drawn over 0..K (every bucket
populated, a few questions retired at K/K, a few k=0 ignored). `--pushers` actors play the samplers: each
pushes `--push-batch` groups per `ShardedReplay.push` call (a sampler pushes the groups of one engine call,
`samplers.requests_per_call`: 32 in the GPU recipes, 4 in the CPU ones; routed by hash(qid), so 32 groups
make ~4 per shard call), and pulls its finished groups back with `pull_batch` every `--take-every` groups
(the driver's role; it keeps the shards' ready queues short, as in a run). Token ids come from a bank of
distinct random sequences (vocabulary 50k); every stored trajectory is still a copy in its shard.

At each checkpoint (a fraction of --questions pushed) it prints: questions, buckets, stored trajectories,
push throughput since the last checkpoint (wall, with the load average), the CPU per group of the shard
processes and of the pushers, the shard calls and fsync'd log frames per group, the shards' resident memory
(RSS), `sample_questions(n=64)` p50/p99 (sizes cached, as the driver has them after `pull_batch`: one
parallel round trip; the round trip of a bare `ping` to all shards is printed beside it), snapshot time and
size on disk, then restore time into new shards (as a resumed run does; the fill then goes on in those).
With the log, a shard is finally SIGKILLed and its restart (snapshot + log replay) timed. `--profile`
cProfiles the push and take verbs of shard 0 over the last fill by CPU time, beside its process's CPU time (the
rest is Ray's task handling and (de)serialisation).

`--in-process N` first times one shard without Ray (push + take per group, compactions, snapshot, restore,
restart from the log). `--baseline REV` runs everything twice, one after the other: on a git worktree of REV
(its buffers/ and the rest, with this script and its workload), then on this tree. Figures on the shared
2-core machine move with its load: compare the CPU per group more than wall times.

Memory: a stored trajectory of ~290 tokens costs ~2.5 KB in a shard (int32 ids + float32 log-probs + object
overhead) and mixed k stores ~3.8 per question, so 1M questions at 64-512 tokens need ~12 GB of shard memory;
at 16-48 tokens (~3.9 KB per question) 1M questions fit a small machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TREE = os.environ.get("BENCH_TREE") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, TREE)  # the tree whose buffers/ is measured (--baseline runs an older commit's too)

from replay_workload import K, NullShard, Pusher, instrumented_shard  # noqa: E402 - after the tree is on sys.path


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _peak_rss(pid: int) -> int:
    """The process's high-water resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1e3, q))


def _cpu(procs: list) -> float:
    """User + system seconds these processes used so far."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def run_mode(args: argparse.Namespace, *, wal: bool, root: Path) -> None:
    import psutil
    import ray
    import replay_workload
    from ray import cloudpickle

    from buffers.sharded import RayInvoke, ShardedReplay
    from exgrpo.core.config import Config
    from exgrpo.runtime.env import remote_actor

    cloudpickle.register_pickle_by_value(replay_workload)  # the actors' processes cannot import bench/
    shard_cls = instrumented_shard()
    r = Config().replay
    wal_root = root / "replay-wal"
    restarts = r.shard_max_restarts if wal else 0
    concurrency = args.concurrency or getattr(r, "shard_concurrency", 1)  # a tree before group commit: 1

    pusher_procs: list = []

    def start() -> tuple[list, list, ShardedReplay, list]:
        """Shards as build_system starts them (their log directory emptied first, as there), a client, pushers."""
        shutil.rmtree(wal_root, ignore_errors=True)
        shards = [
            remote_actor(
                shard_cls,
                name=f"exgrpo-replay-{i}",
                num_cpus=0,
                max_restarts=restarts,
                max_concurrency=concurrency,
                k_rollouts=K,
                max_trajectories_per_question=r.max_trajectories_per_question,
                wal_dir=str(wal_root / f"shard-{i}") if wal else None,
                compact_bytes=int((args.compact_mb or r.wal_compact_mb) * 2**20),
            )
            for i in range(args.shards)
        ]
        ray.get([s.ping.remote() for s in shards])
        procs = [psutil.Process(p) for p in ray.get([s.pid.remote() for s in shards])]
        replay = ShardedReplay(
            shards=shards, k_rollouts=K, invoke=RayInvoke(retry_s=120.0 if restarts else 0.0)
        )
        pusher_cls = ray.remote(num_cpus=0)(Pusher)
        pushers = [
            pusher_cls.remote(replay=replay, seed=100 + j, min_len=args.min_len, max_len=args.max_len)
            for j in range(args.pushers)
        ]
        pusher_procs[:] = [psutil.Process(p) for p in ray.get([h.pid.remote() for h in pushers])]
        return shards, procs, replay, pushers

    def stop() -> None:
        for h in [*pushers, *shards]:
            ray.kill(h, no_restart=True)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.wait(timeout=30)

    shards, procs, replay, pushers = start()
    replay.set_collect(on=True)
    compact_mb = f", log compaction at {args.compact_mb or r.wal_compact_mb:g} MB" if wal else ""
    print(
        f"\n== {args.shards} shards, write-ahead log {'ON (' + compact_mb.lstrip(', ') + ')' if wal else 'OFF'}"
        f"; {concurrency} concurrent calls per shard; {args.pushers} pushers x {args.push_batch} groups per push call, pull_batch every {args.take_every}"
    )

    def cpu(ps: list | None = None) -> float:  # the shard processes' by default
        return _cpu(procs if ps is None else ps)

    def counters() -> list[int]:  # push calls the shards received, log frames, fdatasyncs
        got = ray.get([s.counters.remote() for s in shards])
        return [sum(c[k] for c in got) for k in ("push_calls", "frames", "syncs")]

    rtt = []
    for _ in range(50):
        t = time.perf_counter()
        ray.get([s.ping.remote() for s in shards])
        rtt.append(time.perf_counter() - t)
    print(
        f"   round trip to all {args.shards} shards (ping): p50 {_pct(rtt, 50):.1f} ms, p99 {_pct(rtt, 99):.1f} ms"
    )
    done = 0
    marks = sorted({max(1, int(round(float(f) * args.questions))) for f in args.checkpoints.split(",")})
    for mark in marks:
        todo = list(range(done, mark))
        profile = args.profile and mark == marks[-1]
        if profile:
            ray.get(shards[0].profile.remote(on=True))
        counts0, pc0, s0 = counters(), cpu(pusher_procs), cpu(procs[:1])
        t0, c0 = time.perf_counter(), cpu()
        parts = ray.get(
            [
                p.run.remote(
                    qids=todo[j :: args.pushers], push_batch=args.push_batch, take_every=args.take_every
                )
                for j, p in enumerate(pushers)
            ]
        )
        wall, shard_cpu = time.perf_counter() - t0, cpu() - c0
        pusher_cpu, shard0_cpu = cpu(pusher_procs) - pc0, cpu(procs[:1]) - s0
        shard_calls, frames, syncs = (now - before for now, before in zip(counters(), counts0, strict=True))
        if profile:
            prof = ray.get(shards[0].profile.remote(on=False))
        calls = sum(-(-len(todo[j :: args.pushers]) // args.push_batch) for j in range(args.pushers))
        push_s = sum(p["push_s"] for p in parts) / len(parts)
        take_s = sum(p["take_s"] for p in parts) / len(parts)
        done = mark
        st = replay.stats()
        rss = [p.memory_info().rss for p in procs]
        print(
            f"-- {done:,} questions pushed: {st.active:,} sampleable, buckets {st.bucket_sizes}, "
            f"{st.trajectories:,} stored trajectories, {st.retired:,} retired, {st.ready} ready"
        )
        print(
            f"   push: {len(todo) / wall:,.0f} groups/s sustained ({len(todo):,} groups in {wall:.1f} s, "
            f"{calls:,} push calls; per pusher {push_s:.1f} s in push, {take_s:.1f} s in pull_batch; load "
            f"{os.getloadavg()[0]:.1f})"
        )
        n = len(todo)
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
        rng = np.random.default_rng(7)
        replay.stats()  # cache the sizes, as pull_batch does in the driver
        for _ in range(5):
            replay.sample_questions(n=64, rng=rng)
        lat, pings, got = [], [], 0
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
            f"   sample_questions(n=64): p50 {_pct(lat, 50):.1f} ms, p99 {_pct(lat, 99):.1f} ms over "
            f"{args.samples} calls ({got / args.samples:.0f} picks per call, {cands} candidates in the last); "
            f"ping of all shards between them: p50 {_pct(pings, 50):.1f} ms, p99 {_pct(pings, 99):.1f} ms"
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
            f"   one shard's sample of 8 questions: p50 {_pct(one, 50):.2f} ms, p99 {_pct(one, 99):.2f} ms; "
            f"its ping: p50 {_pct(bare, 50):.2f} ms, p99 {_pct(bare, 99):.2f} ms"
        )
        if args.no_snapshot:
            continue
        snap = root / f"ckpt-{done}"
        t, c0 = time.perf_counter(), cpu()
        replay.snapshot(path=str(snap))
        snap_s, snap_cpu = time.perf_counter() - t, cpu() - c0
        size = _dir_bytes(snap)
        before = (st.bucket_sizes, st.active, st.retired, st.trajectories)
        extra = (
            f" (each shard also snapshots its own log dir: {_dir_bytes(wal_root) / 2**20:,.0f} MiB there now)"
            if wal
            else ""
        )
        peak = [_peak_rss(p.pid) for p in procs]
        print(
            f"   snapshot: {snap_s:.1f} s ({snap_cpu:.1f} shard CPU s), {size / 2**20:,.0f} MiB on disk "
            f"({size / max(st.trajectories, 1):,.0f} bytes per stored trajectory){extra}; shard peak RSS so far: "
            f"sum {sum(peak) / 2**30:.2f} GiB, max {max(peak) / 2**20:,.0f} MiB"
        )
        stop()  # a resumed run: new shards (empty log directories) restore the checkpoint, then the fill goes on
        shards, procs, replay, pushers = start()
        t, c0 = time.perf_counter(), cpu()
        replay.restore(path=str(snap))
        restore_s, restore_cpu = time.perf_counter() - t, cpu() - c0
        replay.set_collect(on=True)  # the driver's part on resume
        st2 = replay.stats()
        assert (st2.bucket_sizes, st2.active, st2.retired, st2.trajectories) == before, (st2, st)
        rss = [p.memory_info().rss for p in procs]
        print(
            f"   restore into {args.shards} new shards: {restore_s:.1f} s ({restore_cpu:.1f} shard CPU s; stats equal); "
            f"shard RSS after: sum {sum(rss) / 2**30:.2f} GiB, max {max(rss) / 2**20:,.0f} MiB; peak during it: "
            f"sum {sum(_peak_rss(p.pid) for p in procs) / 2**30:.2f} GiB"
        )
        shutil.rmtree(snap, ignore_errors=True)
    if (
        wal and args.recovery
    ):  # a shard SIGKILLed after more pushes: Ray restarts it, it replays snapshot + log
        extra = list(range(done, done + args.recovery))
        ray.get(
            [
                p.run.remote(
                    qids=extra[j :: args.pushers], push_batch=args.push_batch, take_every=args.take_every
                )
                for j, p in enumerate(pushers)
            ]
        )
        old_pid = ray.get(shards[0].pid.remote())
        t = time.perf_counter()
        ray.kill(shards[0], no_restart=False)
        while True:  # until the restarted process answers (the dying one may still answer a call or two)
            try:
                if ray.get(shards[0].pid.remote()) != old_pid:
                    break
            except ray.exceptions.RayActorError:
                pass
            time.sleep(0.05)
        rec = ray.get(shards[0].recovered.remote())
        print(
            f"   recovery after SIGKILL of shard 0 ({args.recovery:,} more groups pushed first): back in "
            f"{time.perf_counter() - t:.1f} s, of which {rec['seconds']:.2f} s loading its snapshot and "
            f"{rec['frames']} log frames ({rec['active']:,} sampleable questions)"
        )
    stop()
    shutil.rmtree(wal_root, ignore_errors=True)


def in_process(args: argparse.Namespace, root: Path) -> None:
    """One ReplayShard in this process (no Ray): the buffers/ code's own cost per group and per snapshot."""
    from buffers.records import decode_payload, groups_from_arrow
    from buffers.shard import ReplayShard
    from buffers.sharded import ShardedReplay

    n = args.in_process
    p = Pusher(replay=None, seed=1, min_len=args.min_len, max_len=args.max_len)
    t = time.perf_counter()
    groups = [p._group(q) for q in range(n)]
    build = time.perf_counter() - t
    payloads: list[bytes] = []  # ShardedReplay.push's own routing and encoding; its calls kept, not sent
    client = ShardedReplay(
        shards=range(args.shards),
        k_rollouts=K,
        invoke=lambda calls: payloads.extend(kw["payload"] for _, _, kw in calls),
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
        compactions = shard.wal.gen if wal else 0
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
            again.wal.close()
            shard.wal.close()
        print(line, flush=True)
        shutil.rmtree(d, ignore_errors=True)


def run_floor(args: argparse.Namespace) -> None:
    """The same pushers, calls and bytes against `NullShard`s: what Ray and the clients alone cost here."""
    import psutil
    import ray
    import replay_workload
    from ray import cloudpickle

    from buffers.sharded import RayInvoke, ShardedReplay

    cloudpickle.register_pickle_by_value(replay_workload)
    shards = [
        ray.remote(num_cpus=0)(NullShard).options(max_concurrency=args.concurrency or 8).remote()
        for _ in range(args.shards)
    ]
    ray.get([s.ping.remote() for s in shards])
    procs = [psutil.Process(p) for p in ray.get([s.pid.remote() for s in shards])]
    replay = ShardedReplay(shards=shards, k_rollouts=K, invoke=RayInvoke(retry_s=0.0))
    pushers = [
        ray.remote(num_cpus=0)(Pusher).remote(
            replay=replay, seed=100 + j, min_len=args.min_len, max_len=args.max_len
        )
        for j in range(args.pushers)
    ]
    pusher_procs = [psutil.Process(p) for p in ray.get([h.pid.remote() for h in pushers])]

    todo = list(range(args.floor))
    t0, s0, p0 = time.perf_counter(), _cpu(procs), _cpu(pusher_procs)
    ray.get(
        [
            p.run.remote(
                qids=todo[j :: args.pushers],
                push_batch=args.push_batch,
                take_every=args.take_every,
                floor=True,
            )
            for j, p in enumerate(pushers)
        ]
    )
    wall, shard_cpu, pusher_cpu = time.perf_counter() - t0, _cpu(procs) - s0, _cpu(pusher_procs) - p0
    n = len(todo)
    print(
        f"\n== FLOOR: {args.shards} null shards (they answer push_payload and take_rows and do nothing), the same "
        f"pushers and calls\n   push: {n / wall:,.0f} groups/s ({n:,} groups in {wall:.1f} s; load "
        f"{os.getloadavg()[0]:.1f}); shard process CPU {shard_cpu / n * 1e6:,.0f} us per group (Ray's handling of "
        f"the calls), pusher CPU {pusher_cpu / n * 1e6:,.0f} us per group (building, encoding, sending)",
        flush=True,
    )
    for h in [*pushers, *shards]:
        ray.kill(h, no_restart=True)


def compare(rev: str) -> None:
    """Run this script twice, one after the other: on a git worktree of `rev`, then on this tree."""
    import subprocess

    argv = [
        a
        for i, a in enumerate(sys.argv[1:])
        if a != "--baseline" and not a.startswith("--baseline=") and (i == 0 or sys.argv[i] != "--baseline")
    ]
    here = os.path.abspath(TREE)
    base = tempfile.mkdtemp(prefix="replay-scale-base-")
    subprocess.run(
        ["git", "-C", here, "worktree", "add", "--detach", base, rev], check=True, capture_output=True
    )
    try:
        for label, tree in ((f"BEFORE: buffers/ at {rev}", base), ("AFTER: this tree", here)):
            print(f"\n######## {label}", flush=True)
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), *argv],
                cwd=tree,
                check=True,
                env={**os.environ, "BENCH_TREE": tree, "PYTHONPATH": tree},
            )
    finally:
        subprocess.run(["git", "-C", here, "worktree", "remove", "--force", base], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=100_000)
    ap.add_argument("--checkpoints", default="0.25,1", help="fractions of --questions at which to measure")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--pushers", type=int, default=4)
    ap.add_argument(
        "--push-batch", type=int, default=32, help="groups per push call (samplers.requests_per_call)"
    )
    ap.add_argument("--take-every", type=int, default=128)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=48)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--wal", choices=("off", "on", "both"), default="on")
    ap.add_argument(
        "--recovery", type=int, default=2000, help="with the log: groups pushed before killing a shard"
    )
    ap.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="N",
        help="first time one shard in-process (no Ray) over N groups",
    )
    ap.add_argument(
        "--compact-mb", type=float, default=None, help="log compaction threshold (replay.wal_compact_mb)"
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="calls a shard serves at once (replay.shard_concurrency; the null shards of --floor too, default 8)",
    )
    ap.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="N",
        help="first push N groups the same way into null shards (Ray and the clients' cost alone)",
    )
    ap.add_argument("--no-snapshot", action="store_true")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile shard 0 over the last fill and print where its time went",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="REV",
        help="also run the same measurements with buffers/ (and the rest) of git revision REV, first",
    )
    ap.add_argument(
        "--dir", default=None, help="where snapshots and logs go (default: a temporary directory)"
    )
    args = ap.parse_args()
    if args.baseline:
        return compare(args.baseline)
    import ray

    from exgrpo.runtime.env import ACTOR_ENV

    print(
        "command: RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python bench/bench_replay_scale.py "
        + " ".join(sys.argv[1:])
    )
    root = Path(args.dir or tempfile.mkdtemp(prefix="replay-scale-"))
    try:
        if args.in_process:
            in_process(args, root)
        if args.questions <= 0 and not args.floor:
            return
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            namespace="exgrpo-bench",
            runtime_env={"env_vars": ACTOR_ENV},
            configure_logging=False,
        )
        if args.floor:
            run_floor(args)
        if args.questions > 0:
            for wal in {"off": (False,), "on": (True,), "both": (False, True)}[args.wal]:
                run_mode(args, wal=wal, root=root)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
