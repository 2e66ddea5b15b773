"""The replay service at scale: push throughput, sampling latency, snapshot and restore, shard memory, over R
real `ReplayShard` Ray actors driven through `ShardedReplay` (defaults: the goal case, 8 shards).

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.replay.bench_replay_scale \
        --questions 200000 --checkpoints 0.25,1 --no-snapshot --recovery 2000 --profile --baseline 0e32440

The workload, what each checkpoint prints, `--in-process`, `--baseline` and the memory per question:
docs/benchmarks.md, "Replay service at scale".
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
