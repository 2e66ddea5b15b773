"""The actors of `bench/replay/bench_replay_scale.py`: the replay shards, started by the run's own builder part
(`exgrpo.runtime.parts.make_replay`, from a config of the bench's options, with the instrumented shard of
`replay_workload.py`), the stand-in samplers that push to them, and the processes whose CPU and memory the
bench reads; plus the null-shard floor (`run_floor`) and the measuring helpers the modes share.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay.replay_workload import K, NullShard, Pusher


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def peak_rss(pid: int) -> int:
    """The process's high-water resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile of seconds `xs`, in milliseconds."""
    return float(np.percentile(np.array(xs) * 1e3, q))


def cpu_s(procs: list) -> float:
    """User + system seconds these processes used so far."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def bench_config(args: argparse.Namespace, *, wal: bool) -> Any:
    """The run config whose `replay` block the shards are started from: `--shards`, the log on or off,
    `--concurrency` and `--compact-mb` when given (else the config's defaults), K rollouts per question."""
    from exgrpo.core.config_files import load_config

    overrides = [
        f"replay.num_shards={args.shards}",
        f"replay.wal={str(wal).lower()}",
        f"trainer.rollouts_per_question={K}",
    ]
    if args.concurrency:
        overrides.append(f"replay.shard_concurrency={args.concurrency}")
    if args.compact_mb:
        overrides.append(f"replay.wal_compact_mb={args.compact_mb}")
    return load_config(None, overrides)


@dataclass
class Fleet:
    """Shards (named `exgrpo-replay-<i>`, as a run starts them), their client and the pushing samplers."""

    shards: list
    procs: list  # the shards' processes (psutil)
    replay: Any  # buffers.sharded.ShardedReplay
    pushers: list
    pusher_procs: list

    @classmethod
    def start(cls, cfg: Any, args: argparse.Namespace, *, root: Path) -> Fleet:
        """Shards as a run starts them (`make_replay`: their log directory under `root` emptied first),
        with call counters and a profiler; `--pushers` stand-in samplers pushing through the client."""
        import psutil
        import ray

        from bench.replay.replay_workload import instrumented_shard

        try:
            from exgrpo.runtime.parts import make_replay
        except ImportError as err:  # a --baseline revision older than the builder parts
            raise SystemExit(
                f"this tree has no exgrpo.runtime.parts.make_replay to start its shards: {err}"
            ) from err
        replay = make_replay(cfg, run_dir=root, shard_cls=instrumented_shard())
        shards = list(replay.shards)
        procs = [psutil.Process(p) for p in ray.get([s.pid.remote() for s in shards])]
        pushers = start_pushers(args, replay)
        pusher_procs = [psutil.Process(p) for p in ray.get([h.pid.remote() for h in pushers])]
        return cls(shards, procs, replay, pushers, pusher_procs)

    def stop(self) -> None:
        import psutil
        import ray

        for h in [*self.pushers, *self.shards]:
            ray.kill(h, no_restart=True)
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                p.wait(timeout=30)

    def push(self, qids: list[int], args: argparse.Namespace, *, floor: bool = False) -> list[dict]:
        """Every pusher pushes its share of `qids` (and pulls its groups back); their timings."""
        return push_all(self.pushers, qids, args, floor=floor)


def start_pushers(args: argparse.Namespace, replay: Any) -> list:
    import ray

    pusher_cls = ray.remote(num_cpus=0)(Pusher)
    return [
        pusher_cls.remote(replay=replay, seed=100 + j, min_len=args.min_len, max_len=args.max_len)
        for j in range(args.pushers)
    ]


def push_all(pushers: list, qids: list[int], args: argparse.Namespace, *, floor: bool = False) -> list[dict]:
    import ray

    extra = {"floor": True} if floor else {}
    return ray.get(
        [
            p.run.remote(
                qids=qids[j :: len(pushers)], push_batch=args.push_batch, take_every=args.take_every, **extra
            )
            for j, p in enumerate(pushers)
        ]
    )


def run_floor(args: argparse.Namespace) -> None:
    """The same pushers, calls and bytes against `NullShard`s: what Ray and the clients alone cost here."""
    import psutil
    import ray

    from buffers.sharded import RayInvoke, ShardedReplay

    shards = [
        ray.remote(num_cpus=0)(NullShard).options(max_concurrency=args.concurrency or 8).remote()
        for _ in range(args.shards)
    ]
    ray.get([s.ping.remote() for s in shards])
    procs = [psutil.Process(p) for p in ray.get([s.pid.remote() for s in shards])]
    replay = ShardedReplay(shards=shards, k_rollouts=K, invoke=RayInvoke(retry_s=0.0))
    pushers = start_pushers(args, replay)
    pusher_procs = [psutil.Process(p) for p in ray.get([h.pid.remote() for h in pushers])]

    todo = list(range(args.floor))
    t0, s0, p0 = time.perf_counter(), cpu_s(procs), cpu_s(pusher_procs)
    push_all(pushers, todo, args, floor=True)
    wall, shard_cpu, pusher_cpu = time.perf_counter() - t0, cpu_s(procs) - s0, cpu_s(pusher_procs) - p0
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
