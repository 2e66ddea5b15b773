"""The replay service at scale: push throughput, sampling latency, snapshot and restore, shard memory, over R
real `ReplayShard` Ray actors driven through `ShardedReplay`. The defaults are the goal case (8 shards, 16-48
tokens per trajectory, the write-ahead log on, 4 pushing samplers of 32 groups per call); the before/after
figures of docs/benchmarks.md come from

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.replay.bench_replay_scale \
        --questions 200000 --checkpoints 0.25,1 --no-snapshot --recovery 2000 --profile --baseline 0e32440

The shards are started by the run's own builder part (`exgrpo.runtime.parts.make_replay`, from a config of
this script's options: named `exgrpo-replay-<i>`, num_cpus=0, with a write-ahead log:
`max_restarts=replay.shard_max_restarts` and `compact_bytes=replay.wal_compact_mb`), as an instrumented shard
with call counters and a profiler (`bench/replay/replay_workload.py`; the actors and the floor:
`bench/replay/replay_fleet.py`, the measurements: `bench/replay/replay_modes.py`).
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
(its own copy of this script, buffers/ and the rest), then on this tree; REV must have this script at
bench/replay/ and `exgrpo.runtime.parts.make_replay` (the shards' builder part). Figures on the shared
2-core machine move with its load: compare the CPU per group more than wall times.

Memory: a stored trajectory of ~290 tokens costs ~2.5 KB in a shard (int32 ids + float32 log-probs + object
overhead) and mixed k stores ~3.8 per question, so 1M questions at 64-512 tokens need ~12 GB of shard memory;
at 16-48 tokens (~3.9 KB per question) 1M questions fit a small machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.replay.replay_fleet import run_floor
from bench.replay.replay_modes import in_process, run_mode

TREE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


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
                [sys.executable, "-m", "bench.replay.bench_replay_scale", *argv],
                cwd=tree,
                check=True,
                env={**os.environ, "PYTHONPATH": tree},
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
        "command: RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.replay.bench_replay_scale "
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
